"""Partition leader moves under clients running through the proxy: the operator that moves a
partition, the run that moves it while a producer and a consumer work, and the checks that
the moves were survived (shared by the leader-move and SNI routing tests)."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from kafka import KafkaAdminClient
from kafka import TopicPartition as KafkaTopicPartition
from prometheus_client.parser import text_string_to_metric_families

from harness.local_kafka import KafkaCluster
from harness.proxy_process import ProxyProcess
from tests.integration.helpers.feature_clients import feature_clients
from tests.integration.helpers.through_proxy import WatchedRun, assert_only_proxy, run_watched

RECORDS = 9000
RATE_PER_S = 250  # about 36 s of producing: time for up to four leader moves under both clients
PRODUCE_V13, FETCH_V18 = "13", "18"
PREFERRED = 0  # ElectLeaders election type
# What a partition being moved may answer ListOffsets with for a moment.
_MOVING = {KafkaError.OFFSET_NOT_AVAILABLE, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.NOT_LEADER_FOR_PARTITION,
           KafkaError.FENCED_LEADER_EPOCH, KafkaError.UNKNOWN_LEADER_EPOCH}


def java_client(cluster: KafkaCluster, *args: str) -> list[str]:
    # Kafka's clients log a leader change (NOT_LEADER_OR_FOLLOWER, a new leader) at WARN, to stderr.
    return feature_clients(cluster, *args, jvm_options=(f"-Dlog4j2.configurationFile={cluster.tools_log4j}",))


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.1)


def _samples(proxy: ProxyProcess, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    found: dict[tuple[tuple[str, str], ...], float] = {}
    for family in text_string_to_metric_families(proxy.metrics_text()):
        for sample in family.samples:
            if sample.name == name:
                found[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def _rewritten_apis(proxy: ProxyProcess) -> set[str]:
    """APIs whose responses had a new leader's NodeEndpoints rewritten by the proxy."""
    return {dict(labels)["api"] for labels, count in _samples(proxy, "kqp_node_endpoints_rewritten_total").items()
            if count > 0}


class Operator:
    """Moves partition 0 of `topic` between brokers, talking to them directly, as an
    operator's tools would (Admin API: AlterPartitionReassignments, ElectLeaders)."""

    def __init__(self, cluster: KafkaCluster, topic: str) -> None:
        self.cluster, self.topic = cluster, topic
        self.admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
        self.reader = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": f"{topic}-operator"})

    def close(self) -> None:
        self.admin.close()
        self.reader.close()

    def leader(self) -> int:
        metadata = self.reader.list_topics(self.topic, timeout=10)
        return int(metadata.topics[self.topic].partitions[0].leader)

    def high_watermark(self) -> int:
        # Right after a move the new leader may answer OFFSET_NOT_AVAILABLE until its high
        # watermark has caught up: ask again.
        deadline = time.monotonic() + 30
        while True:
            try:
                return int(self.reader.get_watermark_offsets(TopicPartition(self.topic, 0), timeout=10)[1])
            except KafkaException as exc:
                error = exc.args[0]
                if time.monotonic() > deadline or not (error.retriable() or error.code() in _MOVING):
                    raise
            time.sleep(0.1)

    def move_to(self, replicas: list[int]) -> None:
        """Reassign partition 0 to `replicas`, the first of them its leader."""
        errors = self.admin.alter_partition_reassignments({KafkaTopicPartition(self.topic, 0): replicas})
        assert all(error is None for error in errors.values()), errors
        wait_until(lambda: not self.admin.list_partition_reassignments(), 60, "the reassignment to complete")
        # The old leader left the replica set, so the controller already chose a new one from
        # the new set; the preferred election makes sure it is the first (or finds nothing to do).
        self.admin.elect_leaders(PREFERRED, {self.topic: [0]}, raise_errors=False)
        wait_until(lambda: self.leader() == replicas[0], 30, f"node {replicas[0]} to lead {self.topic}-0")


def run_through_leader_moves(proxy: ProxyProcess, operator: Operator, producer_command: list[str],
                             consumer_command: list[str]) -> tuple[WatchedRun, WatchedRun]:
    """Run a producer and a consumer of RECORDS records through the proxy while partition 0 of
    the operator's topic (led by the first node) moves between the three nodes."""
    one, two, three = sorted(operator.cluster.nodes)
    with ThreadPoolExecutor(2) as pool:
        consuming = pool.submit(run_watched, consumer_command, timeout_s=240)
        producing = pool.submit(run_watched, producer_command, timeout_s=240)
        # Each move happens while records flow: some are written before it and some after.
        # The old leader leaves the replica set each time: a follower would go on serving
        # the consumer (KIP-392: a v11+ Fetch may read from a follower), one that no longer
        # holds the partition answers NOT_LEADER_OR_FOLLOWER with the new leader's address.
        # A client only hears of a move if it has a request at the old leader when it happens
        # (in fresh-clone run 10 a loaded machine gave the consumer none over two moves), so
        # the partition moves again, up to four times at 1/6 .. 4/6 of the records, until the
        # proxy has rewritten a new leader's address for both. A proxy that skipped the
        # rewrite would still fail: the counters stay at 0 and the socket watch sees brokers.
        moves = ([two, three], [three, one], [one, two], [two, three])
        for step, replicas in enumerate(moves, start=1):
            if _rewritten_apis(proxy) >= {"Produce", "Fetch"}:
                break
            wait_until(lambda step=step: operator.high_watermark() >= step * RECORDS // 6, 120,
                        f"{step * RECORDS // 6} records written")
            operator.move_to(replicas)
            assert operator.high_watermark() < RECORDS, "the producer finished before the leader moved"
        return producing.result(), consuming.result()


def assert_moves_survived(cluster: KafkaCluster, proxy: ProxyProcess, operator: Operator, produced: WatchedRun,
                          consumed: WatchedRun) -> None:
    """Every record produced once and consumed, only the proxy reached, and the proxy rewrote a
    new leader's address (KIP-951) in Produce and Fetch responses."""
    assert produced.returncode == 0, produced.stderr[-3000:]
    assert f"produced {RECORDS}" in produced.stdout
    assert operator.high_watermark() == RECORDS  # idempotent: each record written once
    assert consumed.returncode == 0, consumed.stderr[-3000:]
    values = [line.split(" ", 1)[1] for line in consumed.stdout.splitlines() if line.startswith("value ")]
    assert sorted(values, key=int) == [str(i) for i in range(RECORDS)]
    assert f"consumed {RECORDS}" in consumed.stdout

    for run in (produced, consumed):
        assert_only_proxy(run.watch, proxy, cluster)

    requests = _samples(proxy, "kqp_requests_total")
    assert requests.get((("api", "Produce"), ("api_version", PRODUCE_V13)), 0) > 0, requests
    assert requests.get((("api", "Fetch"), ("api_version", FETCH_V18)), 0) > 0, requests
    # The old leader told both clients where the new one is, and the proxy put itself there.
    rewritten = _samples(proxy, "kqp_node_endpoints_rewritten_total")
    assert rewritten.get((("api", "Produce"),), 0) > 0, rewritten
    assert rewritten.get((("api", "Fetch"),), 0) > 0, rewritten
