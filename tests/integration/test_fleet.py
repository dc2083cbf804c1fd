"""Acceptance (issue 13): a fleet of `kqp serve` instances enforces one budget, through a topic
of the Kafka cluster it fronts, and falls back by its policy when that topic is unreachable.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from harness import perf_tools
from harness.local_kafka import KafkaCluster
from harness.proxy_process import ProxyProcess, start_together
from tests.integration.helpers.fleet import (
    CLIENT_ID,
    QUOTA,
    RECORD_SIZE,
    STEADY_S,
    TOLERANCE,
    ProducerTally,
    acknowledged_slope,
    fleet_config,
    metric,
    produce_through,
    wait_for_fleet,
    wait_until,
)
from tests.integration.helpers.java_programs import compiled_classes, java_program
from tests.integration.helpers.mutations import THROTTLING_QUOTA_EXCEEDED, create_topics_raw

pytestmark = pytest.mark.integration





@pytest.fixture
def usage_topic(topic_name: str) -> str:
    return f"_kqp_usage-{topic_name}"[:200]


def start_fleet(cluster: KafkaCluster, tmp_path: Path, usage_topic: str, policies: list[str],
                quota_type: str = "producer_byte_rate", quota: int = QUOTA) -> list[ProxyProcess]:
    return start_together([
        ProxyProcess(cluster.bootstrap, tmp_path / f"fleet-{index}.log",
                     config=fleet_config(tmp_path / f"fleet-{index}.yaml", usage_topic, policy, quota_type=quota_type,
                                         quota=quota))
        for index, policy in enumerate(policies)])


@pytest.fixture
def stop_at_end() -> Iterator[list[ProxyProcess]]:
    started: list[ProxyProcess] = []
    yield started
    codes = {proxy.log_path.name: proxy.stop() for proxy in started}
    assert all(code == 0 for code in codes.values()), f"a proxy did not exit cleanly: {codes}"




def readyz_body(proxy: ProxyProcess) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{proxy.metrics_port}/readyz", timeout=5) as response:
        return str(response.read().decode())










# The issue-25 shape: three librdkafka producers of one client-id, each offering 1.5x a 1 MiB/s
# quota through its own instance. Their requests are large (a ProduceRequest carries up to
# batch.size, 1 MB, a second of the quota), so the traffic comes in bursts of several seconds'
# worth; the cold start (each instance admitting a fresh sensor's ten windows' worth, then a
# long throttle) is over by about 30 s.
SHAPE_QUOTA = 1024 * 1024
SHAPE_WARMUP_S = 30
SHAPE_STEADY_S = 60
# One budget, not three: three budgets would admit about 3x the quota (each producer offers
# 1.5x to its own instance), one budget about 1x. The rate against the quota (the suite held it
# to 10%) moved to the system test, shape `fleet-count-other` (issue 39 acceptance 3 holds it to
# 5% there, beside Kafka's broker): each request is ~1 MB, a second of the quota, and they come
# in bursts of several seconds' worth, so where the 60 s edges cut a burst moves the figure by
# about 5% by itself (1.060x in one CI run, 0.98x-1.04x in six others, 0.95x and 1.02x in the
# bench on 2026-11-26, 1.11x the day before), and a busy host moves it further. What phase
# cannot move past the ceiling: one budget gave 0.95-1.11x here and 1.03-1.26x in the default
# mode; the plain average over 60 s adds at most one burst cut by each edge, a burst being at
# most the sensor's span of the quota (11 s): 1.26 + 22 / 60 = 1.63x, under 2x; three budgets
# give about 3x.
ONE_BUDGET_CEILING = 2.0


def test_three_instances_hold_three_producers_to_one_quota(
    kafka_3nodes: KafkaCluster, tmp_path: Path, usage_topic: str, topic_name: str, stop_at_end: list[ProxyProcess]
) -> None:
    """Issue 25's shape with `fleet.count_other_instances`: every instance throttles the client
    and the three hold one budget, not three (ONE_BUDGET_CEILING). How close to the quota, and
    the default mode beside Kafka's broker, is the system test's (`make system-test`, shapes
    `fleet-count-other` and `fleet`; docs/quotas.md has the figures)."""
    proxies = start_together([
        ProxyProcess(kafka_3nodes.bootstrap, tmp_path / f"fleet-{index}.log",
                     config=fleet_config(tmp_path / f"fleet-{index}.yaml", usage_topic, quota=SHAPE_QUOTA,
                                         count_other_instances=True))
        for index in range(3)])
    stop_at_end.extend(proxies)
    wait_for_fleet(proxies)
    kafka_3nodes.create_topic(topic_name, partitions=3)
    seconds = SHAPE_WARMUP_S + SHAPE_STEADY_S
    per_second = [0] * (seconds + 1)
    tallies = [ProducerTally([0] * (seconds + 1)) for _ in proxies]
    lock = threading.Lock()
    start = time.monotonic()
    producers = [threading.Thread(target=produce_through, args=(proxy.bootstrap, topic_name, seconds, per_second,
                                                                  lock, start),
                                  kwargs={"offer": 1.5 * SHAPE_QUOTA, "tally": tally})
                 for proxy, tally in zip(proxies, tallies, strict=True)]
    for thread in producers:
        thread.start()
    for thread in producers:
        thread.join(seconds + 60)
    rate = acknowledged_slope(per_second, SHAPE_WARMUP_S, seconds)
    plain = sum(per_second[SHAPE_WARMUP_S:seconds]) / SHAPE_STEADY_S
    shares = [round(acknowledged_slope(t.per_second, SHAPE_WARMUP_S, seconds) / SHAPE_QUOTA, 2) for t in tallies]
    print(f"three producers x 1.5x through three instances (count_other_instances): {rate / SHAPE_QUOTA:.3f} x "
          f"quota in seconds {SHAPE_WARMUP_S}-{seconds} ({plain / SHAPE_QUOTA:.3f} x as a plain average); "
          f"per producer {shares}; librdkafka request time-outs "
          f"{[t.request_timeouts for t in tallies]}; longest throttle ms {[t.longest_throttle_ms for t in tallies]}; "
          f"per second {[round(b / SHAPE_QUOTA, 1) for b in per_second]}")
    # The quota engaged on every instance; the ceiling shows the three shared one budget.
    for proxy in proxies:
        assert (metric(proxy, "kqp_throttle_time_seconds_total", client_id=CLIENT_ID, source="proxy") or 0) > 0
    assert plain <= ONE_BUDGET_CEILING * SHAPE_QUOTA, \
        f"the fleet admitted {plain / SHAPE_QUOTA:.3f} x the quota: more than one budget"


# Bytes/s for the three consumers together. A fetch (1 MiB, the Java consumer's default per
# partition) is half a second of it: the traffic comes in lumps of one fetch per consumer.
CONSUMER_QUOTA = 2 * 1024 * 1024
# The first seconds are a cold start: every instance admits a fresh sensor's ten windows'
# worth before the others' usage reaches it, then all wait out a throttle long enough for
# the samples to expire, and the next burst is a fresh sensor's again. Here that is over
# within about 20 s; the steady state is measured after it.
CONSUMER_WARMUP_S = 24


def consume_through(cluster: KafkaCluster, bootstrap: str, topic: str, start_epoch_ms: int, seconds: int,
                    log: IO[str]) -> subprocess.Popen[str]:
    """Kafka's Java consumer (it honours ThrottleTimeMs) in group CLIENT_ID, printing the value
    bytes it read in each second since `start_epoch_ms`."""
    return subprocess.Popen(
        java_program(cluster.kafka_dir, "ConsumeRate", bootstrap, topic, CLIENT_ID, CLIENT_ID, str(start_epoch_ms),
                     str(seconds), jvm_options=(f"-Dlog4j2.configurationFile={cluster.tools_log4j}",)),
        stdout=subprocess.PIPE, stderr=log, text=True)


def test_three_instances_hold_three_java_consumers_to_one_quota(
    kafka_3nodes: KafkaCluster, tmp_path: Path, usage_topic: str, topic_name: str, stop_at_end: list[ProxyProcess]
) -> None:
    proxies = start_fleet(kafka_3nodes, tmp_path, usage_topic, ["share"] * 3, quota_type="consumer_byte_rate",
                          quota=CONSUMER_QUOTA)
    stop_at_end.extend(proxies)
    kafka_3nodes.create_topic(topic_name, partitions=3, replication=1)
    seconds = CONSUMER_WARMUP_S + STEADY_S
    # Twice what the fleet may read in the run: without one budget the three consumers (one
    # partition each) would read it all, about 2x the quota over the run.
    records = 2 * CONSUMER_QUOTA * seconds // RECORD_SIZE
    perf_tools.producer_perf(kafka_3nodes, kafka_3nodes.bootstrap, topic_name, records, RECORD_SIZE,
                             props={"acks": "1", "linger.ms": "5", "batch.size": "262144"})
    wait_for_fleet(proxies)
    compiled_classes(kafka_3nodes.kafka_dir)  # the consumers' program compiled before the seconds count
    # The seconds count from a moment after the JVMs have started and the group has formed.
    start_epoch_ms = int(time.time() * 1000) + 5000
    per_second = [0] * seconds
    with contextlib.ExitStack() as logs:
        consumers = [consume_through(kafka_3nodes, p.bootstrap, topic_name, start_epoch_ms, seconds,
                                     logs.enter_context((tmp_path / f"consumer-{i}.log").open("w")))
                     for i, p in enumerate(proxies)]
        for index, consumer in enumerate(consumers):
            out, _ = consumer.communicate(timeout=seconds + 120)
            assert consumer.returncode == 0, (tmp_path / f"consumer-{index}.log").read_text()[-3000:]
            for line in out.splitlines():
                _, second, size = line.split()
                per_second[int(second)] += int(size)
    # A Java consumer honours ThrottleTimeMs, so its traffic is a fetch and then the throttle
    # that pays for it: a plain average over the steady state, whose edges cut at most a lump
    # of three fetches (1.5 s of the quota) out of 60 s, 2.5%.
    rate = sum(per_second[CONSUMER_WARMUP_S:]) / STEADY_S
    print(f"three Java consumers through three instances: {rate / CONSUMER_QUOTA:.3f} x quota; per second "
          f"{[round(b / CONSUMER_QUOTA, 1) for b in per_second]}")
    for proxy in proxies:
        assert (metric(proxy, "kqp_throttle_time_seconds_total", client_id=CLIENT_ID, quota_type="consumer_byte_rate",
                       source="proxy") or 0) > 0
    # At most the quota + 10%, whatever the phase (2.5%, above) and the load (a busy host only
    # delays the consumers' fetches, they never read more for it). The floor the suite had
    # (0.9x) moved to the system test, shape `fleet-consumers`, beside Kafka's broker: Kafka
    # answers a throttled fetch empty and unrecords it, so its own figure for three consumers
    # of one client-id is under the quota (0.87-0.89x in the simulator's model of Kafka), and
    # this test read 0.886x in a fresh clone's `make test` at 67dcf8d, which is Kafka's number,
    # not a fault; a loaded host pulls it lower still.
    assert rate <= (1 + TOLERANCE) * CONSUMER_QUOTA, \
        f"the fleet let the consumers read {rate / CONSUMER_QUOTA:.3f} x the quota"


def test_an_unreachable_usage_topic_switches_each_instance_to_its_policy_and_back(
    kafka_3nodes: KafkaCluster, tmp_path: Path, usage_topic: str, stop_at_end: list[ProxyProcess]
) -> None:
    # The usage topic lives on one broker only, so stopping that broker makes it unreachable.
    leader = max(kafka_3nodes.nodes)
    kafka_3nodes.create_topic(usage_topic, replicas=[leader])
    proxies = start_fleet(kafka_3nodes, tmp_path, usage_topic, ["share", "share", "local"])
    stop_at_end.extend(proxies)
    wait_for_fleet(proxies)
    for proxy in proxies:
        assert metric(proxy, "kqp_fleet_exchange_state", state="ok") == 1
        assert "fleet exchange ok, 3 instance(s)" in readyz_body(proxy)

    kafka_3nodes.kill_node(leader)
    try:
        took = wait_until(
            lambda: [metric(p, "kqp_fleet_exchange_state", state=s) for p, s in
                     zip(proxies, ["share", "share", "local"], strict=True)] == [1, 1, 1],
            30, "every instance switched to its policy")
        print(f"instances switched to their policy {took:.1f} s after the usage topic's broker stopped")
        # Within one quota window (11 s), the reports' own failure time (2 s) included.
        assert took <= 11
        for proxy in proxies[:2]:
            assert metric(proxy, "kqp_fleet_budget_share") == pytest.approx(1 / 3)
            assert "enforcing 1/3 of each quota (policy share)" in readyz_body(proxy)
            assert proxy.readyz() == 200  # still serving
            assert "own usage reports not seen back" in proxy.log_tail(400)
        assert metric(proxies[2], "kqp_fleet_budget_share") == 1
        assert "policy local" in readyz_body(proxies[2])
    finally:
        kafka_3nodes.start_node(leader)
    wait_until(lambda: all(metric(p, "kqp_fleet_exchange_state", state="ok") == 1 for p in proxies), 60,
               "every instance recovered by itself")
    for proxy in proxies:
        assert metric(proxy, "kqp_fleet_budget_share") == 1
        assert "reachable again" in proxy.log_tail(400)
    # Later tests share this cluster (the fleet behind HAProxy two tests on): the restarted
    # broker back in sync and in front of its partitions before they start.
    kafka_3nodes.settle_after_restart()


def test_a_quota_altered_through_one_instance_reaches_the_others(
    kafka_1node: KafkaCluster, tmp_path: Path, usage_topic: str, stop_at_end: list[ProxyProcess]
) -> None:
    proxies = start_fleet(kafka_1node, tmp_path, usage_topic, ["share", "share"])
    stop_at_end.extend(proxies)
    wait_for_fleet(proxies)
    first, second = proxies
    kafka_1node.run_tool("kafka.admin.ConfigCommand", "--bootstrap-server", first.bootstrap, "--alter",
                         "--add-config", "producer_byte_rate=4096", "--entity-type", "clients",
                         "--entity-name", "batch-job")
    altered = time.monotonic()
    second_file = tmp_path / "fleet-1.yaml"
    took = wait_until(lambda: "batch-job" in second_file.read_text(), 10, "the other instance's quota file")
    print(f"the alteration reached the other instance {time.monotonic() - altered:.2f} s after kafka-configs "
          f"returned ({took:.2f} s of polling)")
    assert took <= 2.0
    described = kafka_1node.run_tool("kafka.admin.ConfigCommand", "--bootstrap-server", second.bootstrap,
                                     "--describe", "--entity-type", "clients", "--entity-name", "batch-job").stdout
    assert "producer_byte_rate=4096.0" in described, described
    # Both instances still hold the entry they started with.
    for index in range(2):
        assert CLIENT_ID in (tmp_path / f"fleet-{index}.yaml").read_text()
    assert "quotas from instance" in second.log_tail(200)
    # kqp check-config tells where the entry came from on each instance.
    origins = {index: check_config_output(tmp_path / f"fleet-{index}.yaml") for index in range(2)}
    batch_line = [next(line for line in origins[i].splitlines() if "client-id=batch-job" in line) for i in range(2)]
    assert re.search(r"fleet-0\.yaml:\d+, written by AlterClientQuotas from \S+ \(127\.0\.0\.1:\d+\) through "
                     r"instance \S+ at \d{4}-\d\d-\d\dT", batch_line[0]), batch_line[0]
    assert re.search(r"fleet-1\.yaml:\d+, written by the fleet's quota topic, from instance \S+ through instance "
                     r"\S+ at ", batch_line[1]), batch_line[1]
    # The entries both files started with were not touched: no stamp.
    assert all(next(line for line in origins[i].splitlines() if f"client-id={CLIENT_ID}" in line).endswith(
        f"fleet-{i}.yaml:4") for i in range(2)), origins


def check_config_output(path: Path) -> str:
    result = subprocess.run([sys.executable, "-m", "kqp", "check-config", str(path)], capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_two_instances_admit_the_partitions_one_controller_would(
    kafka_3nodes: KafkaCluster, tmp_path: Path, usage_topic: str, topic_name: str, stop_at_end: list[ProxyProcess]
) -> None:
    """Criterion 2: KIP-599 across instances. `controller_mutation_rate: 5` over Kafka's 11
    windows of 1 s is a bucket of 55 partitions; two instances each receive a CreateTopics of
    7 topics x 40 partitions at the same moment. One controller given both requests admits 2
    topics of the first (strict mode admits a topic while the bucket is not negative: 55, then
    15, then -25) and nothing of the second. The issue's "at most 55 + 5" is not what Kafka
    does: one broker alone creates 80 (test_mutation_quota_and_quota_admin.py). The fleet must
    create those 80 partitions and refuse the other 12 topics with THROTTLING_QUOTA_EXCEEDED,
    whichever request its topic orders first."""
    proxies = start_fleet(kafka_3nodes, tmp_path, usage_topic, ["share", "share"],
                          quota_type="controller_mutation_rate", quota=5)
    stop_at_end.extend(proxies)
    wait_for_fleet(proxies)
    names = [[f"{topic_name}-{side}-{i}" for i in range(7)] for side in ("a", "b")]
    start = threading.Barrier(2)
    responses: dict[int, object] = {}

    def create(index: int) -> None:
        start.wait()
        responses[index] = create_topics_raw(proxies[index].bootstrap_port, CLIENT_ID, names[index], 40)

    threads = [threading.Thread(target=create, args=(index,)) for index in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    errors = {t.name: t.error_code for i in range(2) for t in responses[i].topics}  # type: ignore[attr-defined]
    throttles = [responses[i].throttle_time_ms for i in range(2)]  # type: ignore[attr-defined]
    created = sorted(name for name, code in errors.items() if code == 0)
    print(f"created {created}; throttles {throttles} ms; errors {errors}")
    assert len(created) == 2, errors
    assert all(code == THROTTLING_QUOTA_EXCEEDED for name, code in errors.items() if name not in created), errors
    # Both topics from one request, the first in the fleet's order, as one controller admits them.
    first = 0 if created[0] in names[0] else 1
    assert created == names[first][:2]
    # Both clients wait for the same 25 tokens of debt: 5 s, less the time the claims took.
    assert all(4000 <= throttle <= 5000 for throttle in throttles), throttles
    listed = kafka_3nodes.topic_names(including=created)
    assert set(created) <= listed and not (set(errors) - set(created)) & listed
    # Each request waited for its claim to come back through the topic, once.
    for proxy in proxies:
        assert metric(proxy, "kqp_fleet_mutation_claim_seconds_count", result="ordered") == 1
        waited = metric(proxy, "kqp_fleet_mutation_claim_seconds_sum", result="ordered")
        print(f"{proxy.log_path.name}: the claim took {waited:.3f} s to come back")
    # An instance that joins now charges the claims of the last quota span first: its bucket for
    # the client is the others' (in debt), not a fresh one that would admit 55 more partitions.
    (tmp_path / "late").mkdir()
    late = start_fleet(kafka_3nodes, tmp_path / "late", usage_topic, ["share"],
                       quota_type="controller_mutation_rate", quota=5)[0]
    stop_at_end.append(late)
    wait_for_fleet([*proxies, late])
    response = create_topics_raw(late.bootstrap_port, CLIENT_ID, [f"{topic_name}-late"], 1)
    late_errors = [t.error_code for t in response.topics]  # type: ignore[attr-defined]
    print(f"through the instance that joined later: errors {late_errors}, "
          f"throttle {response.throttle_time_ms} ms")  # type: ignore[attr-defined]
    assert late_errors == [THROTTLING_QUOTA_EXCEEDED]
