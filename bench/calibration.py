"""The simulator's client models beside the real clients: the calibration shapes of the system
test (issue 39, "calibrated client models"; `make system-test SHAPES=calibrate-librdkafka,...`).

Calibration is client against Kafka, no proxy on either side: each real client, configured
with its library's defaults (only bootstrap, client-id and what the shape names are set), runs
against one real Kafka 4.3.1 broker that enforces a quota on its client-id; the simulator runs
the client's model in the same shape straight to its modelled Kafka (kqpsim/kafka_reference.py
in the modelled broker), over several seeds. Both are measured as an operator measures: what
was acknowledged (produced), delivered (fetched) or created inside the measured seconds, the
backlog left at the end dropped, not counted. A shape passes when the model's median admitted
rate is within 5% of the real client's.

The shapes:

* calibrate-librdkafka: one confluent-kafka (librdkafka) producer offering 1.5x a 256 KiB/s
  producer_byte_rate in 1 KiB records, 75 s, the first 15 s not counted.
* calibrate-java-producer: Kafka's Java producer, 1.5x a 1 MiB/s producer_byte_rate, 75 s.
* calibrate-aiokafka: one aiokafka producer, 1.5x a 256 KiB/s producer_byte_rate, 75 s.
* calibrate-consumer: Kafka's Java consumer reading a pre-filled one-partition topic under a
  512 KiB/s consumer_byte_rate, 75 s.
* calibrate-admin: Kafka's Java Admin client creating 4-partition topics one after another
  under a controller_mutation_rate of 4 partitions/s, 60 s, the first 10 s not counted.

Kafka charges a producer its requests' size and a consumer its responses' size; the real
clients count record values. Each real figure is turned into what Kafka charged by the
client's own ratio of batch bytes to value bytes (its metrics: librdkafka's batchsize and
batchcnt, the Java clients' request-size / records-per-request and fetch-size /
records-per-request; aiokafka's from its own batch builder at its default batch size); the
request header (under 0.5% of a request in every shape) is left out.

Throttling is compared by what each side can see: responses in the measured seconds and their
mean ThrottleTimeMs (librdkafka's statistics window, the Java clients' throttle-time sensors
over their last 30-60 s; aiokafka and the admin client publish none), and request time-outs.

`python bench/calibration.py --real FILE.json` runs only the models again against real figures
a system test saved (`--calibration-out`), to show a model's change before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.local_kafka import KafkaCluster
from kqpsim.clients import CLIENT_SHAPES, ConnectionRecord
from kqpsim.scenario import KIB, MIB, Clients, Figures, Quota, Scenario, straight_to_kafka

CLIENTS_JAVA = Path(__file__).resolve().parent.parent / "harness" / "java" / "CalibrationClients.java"
RECORD_SIZE = 1024
SEEDS = range(1, 6)
TOLERANCE = 0.05
SECONDS = 75
WARMUP_S = 15
ADMIN_SECONDS = 60
ADMIN_WARMUP_S = 10
OFFER = 1.5  # x quota, the producers' offer
# aiokafka's default max_batch_size (16384) holds 15 records of 1 KiB: 15,556 batch bytes.
AIOKAFKA_BATCH_BYTES = 15556
AIOKAFKA_BATCH_BYTES_PER_VALUE_BYTE = AIOKAFKA_BATCH_BYTES / (15 * RECORD_SIZE)


@dataclass(frozen=True)
class Calibration:
    """One calibration shape: the real client's quota and the model's scenario."""

    name: str
    client_id: str
    quota_key: str  # the broker quota kafka-configs sets on the client-id
    quota: float
    model: Scenario
    real_setup: str  # how the real client runs, in words

    @property
    def seconds(self) -> int:
        return round(self.model.warmup_s + self.model.measure_s)

    @property
    def warmup(self) -> int:
        return round(self.model.warmup_s)


def _scenario(client: str, quota: float, request_bytes: int, warmup: int = WARMUP_S,
              seconds: int = SECONDS, offer: float = 0.0) -> Scenario:
    return Scenario(Clients(client, request_bytes=request_bytes, offer=offer), Quota(quota), warmup_s=float(warmup),
                    measure_s=float(seconds - warmup))


CALIBRATIONS = {c.name: c for c in (
    # librdkafka's batch.size default (1,000,000 bytes) is what a backlog fills each request to.
    Calibration("calibrate-librdkafka", "calib-rdkafka", "producer_byte_rate", 256 * KIB,
                _scenario("librdkafka", 256 * KIB, 1_000_000, offer=OFFER),
                "confluent-kafka producer, defaults, 1 KiB records offered at 1.5x"),
    # The Java producer's batch.size default (16,384 bytes): 15 records of 1 KiB and the header.
    Calibration("calibrate-java-producer", "calib-java-producer", "producer_byte_rate", 1 * MIB,
                _scenario("java-producer", 1 * MIB, 16_384, offer=OFFER),
                "Kafka's Java producer, defaults, 1 KiB records offered at 1.5x"),
    Calibration("calibrate-aiokafka", "calib-aiokafka", "producer_byte_rate", 256 * KIB,
                _scenario("aiokafka", 256 * KIB, 16_384, offer=OFFER),
                "aiokafka producer, defaults, 1 KiB records offered at 1.5x"),
    # max.partition.fetch.bytes (1 MiB) bounds a one-partition fetch.
    Calibration("calibrate-consumer", "calib-consumer", "consumer_byte_rate", 512 * KIB,
                _scenario("consumer", 512 * KIB, 1 * MIB),
                "Kafka's Java consumer, defaults, one partition pre-filled with 1 KiB records"),
    Calibration("calibrate-admin", "calib-admin", "controller_mutation_rate", 4,
                _scenario("admin", 4, 4, ADMIN_WARMUP_S, ADMIN_SECONDS),
                "Kafka's Java Admin client, defaults, 4-partition topics created one after another"),
)}
NAMES = tuple(CALIBRATIONS)


@dataclass
class Side:
    """One run of one side, over the measured seconds."""

    admitted: float  # x quota, as Kafka charges it
    # A producer's mean request (batch) size, what the model's requests are made of: it comes
    # from the client's batching against the offer and the host's scheduling, not a setting
    # (librdkafka's model batches as the client does and makes its own sizes).
    request_bytes: float | None = None
    responses: int | None = None
    mean_throttle_ms: float | None = None
    timeouts: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    detail: str = ""
    # librdkafka's statistics, one row a second from its start: TRACE_COLUMNS.
    trace: list[list[float]] = field(default_factory=list)


TRACE_COLUMNS = ("second", "awaiting response", "their records", "not yet written", "their records",
                 "batches", "largest batch B", "mean batch B", "throttled responses", "their mean ThrottleTimeMs",
                 "requests sent (all so far)", "responses (all so far)")


# ---- the models -----------------------------------------------------------------------------

def model_side(figures: Figures, api: str) -> Side:
    start, end = figures.span
    records: list[ConnectionRecord] = figures.records
    responses = [size for r in records for at, size in r.acks if start <= at < end]
    throttles = [ms for r in records for at, ms in r.throttles if start <= at < end]
    refused = sum(1 for size in responses if size == 0) if api == "create_topics" else 0
    detail = (f"{len(throttles)} of {len(responses)} responses throttled (their mean ThrottleTimeMs "
              f"{sum(throttles) / len(throttles) if throttles else 0:.0f})")
    if api == "create_topics":
        detail += f", {refused} refused with THROTTLING_QUOTA_EXCEEDED"
    return Side(figures.admitted, None, len(responses), sum(throttles) / len(responses) if responses else None,
                figures.timeouts, detail=detail)


def model_scenario(calibration: Calibration, real: list[Side]) -> Scenario:
    """The calibration's scenario, its requests the size the real producer sent (median over rounds);
    a model that batches as its client does (librdkafka's) makes its own sizes."""
    sizes = [s.request_bytes for s in real if s.request_bytes]
    if not sizes or CLIENT_SHAPES[calibration.model.clients.model].batching is not None:
        return calibration.model
    model = calibration.model
    return dataclasses.replace(model, clients=dataclasses.replace(model.clients,
                                                                  request_bytes=round(statistics.median(sizes))))


def run_model(scenario: Scenario) -> list[Side]:
    api = CLIENT_SHAPES[scenario.clients.model].api
    return [model_side(straight_to_kafka(scenario, seed), api) for seed in SEEDS]


# ---- the real clients -----------------------------------------------------------------------

def real_librdkafka(bootstrap: str, topic: str, calibration: Calibration) -> Side:
    from confluent_kafka import Producer
    seconds, warmup = calibration.seconds, calibration.warmup
    snapshots: list[tuple[float, dict[str, object]]] = []
    counted = [0]
    errors: dict[str, int] = {}
    start = time.monotonic()

    def on_stats(text: str) -> None:
        snapshots.append((time.monotonic() - start, json.loads(text)))

    def on_delivery(error: object, _message: object) -> None:
        at = time.monotonic() - start
        if error is not None:
            name = str(getattr(error, "name", lambda: error)())
            if not name.startswith("_PURGE"):  # the backlog purged at the end, not the client's error
                errors[name] = errors.get(name, 0) + 1
        elif warmup <= at < seconds:
            counted[0] += RECORD_SIZE

    producer = Producer({"bootstrap.servers": bootstrap, "client.id": calibration.client_id,
                         "statistics.interval.ms": 1000, "stats_cb": on_stats})
    payload = b"x" * RECORD_SIZE
    offered = OFFER * calibration.quota
    sent = 0
    while (elapsed := time.monotonic() - start) < seconds:
        while sent * RECORD_SIZE < offered * elapsed:
            try:
                producer.produce(topic, payload, on_delivery=on_delivery)
            except BufferError:
                break
            sent += 1
        producer.poll(0.005)
    producer.poll(0)
    producer.purge()  # the backlog is not part of the measurement
    producer.flush(30)
    # Each statistics snapshot's window stats cover the second before it.
    inside = [stats for at, stats in snapshots if warmup < at <= seconds]
    brokers = [b for stats in inside for b in stats["brokers"].values() if b.get("nodeid", -1) >= 0]  # type: ignore[attr-defined]
    # librdkafka's throttle window counts only the responses that carried a throttle
    # (rd_kafka_op_throttle_time); every response is in the broker's rx counter.
    throttled = sum(b["throttle"]["cnt"] for b in brokers)
    throttle_sum = sum(b["throttle"]["sum"] for b in brokers)

    def total(key: str, stats: dict[str, object]) -> int:
        return sum(int(b.get(key, 0)) for b in stats["brokers"].values())  # type: ignore[attr-defined]

    # The snapshot nearest the measured span's start (they come about a second apart).
    base = min(snapshots, key=lambda snapshot: abs(snapshot[0] - warmup))[1] if snapshots else None
    responses = total("rx", inside[-1]) - total("rx", base) if inside and base else 0
    timeouts = total("req_timeouts", inside[-1]) - total("req_timeouts", inside[0]) if inside else 0
    batches = [stats["topics"][topic] for stats in inside if topic in stats["topics"]]  # type: ignore[operator,index]
    batch_bytes = sum(t["batchsize"]["sum"] for t in batches)
    batch_values = sum(t["batchcnt"]["sum"] for t in batches) * RECORD_SIZE
    factor = batch_bytes / batch_values if batch_values else 1.0
    in_flight = max((b.get("waitresp_cnt", 0) for b in brokers), default=0)
    unsent = max((b.get("outbuf_cnt", 0) for b in brokers), default=0)
    trace = [_trace_row(at, stats, topic) for at, stats in snapshots if at <= seconds]
    sizes = [t["batchsize"] for t in batches if t["batchsize"]["cnt"]]
    spread = (f"{min(s['min'] for s in sizes)}-{max(s['max'] for s in sizes)} B, per-second p50 "
              f"{statistics.median(s['p50'] for s in sizes):.0f} B, "
              f"p99 {statistics.median(s['p99'] for s in sizes):.0f} B" if sizes else "none")
    admitted = counted[0] * factor / (seconds - warmup) / calibration.quota
    mean_batch = batch_bytes / max(1, sum(t["batchsize"]["cnt"] for t in batches))
    return Side(admitted, mean_batch, responses, throttle_sum / responses if responses else None, timeouts, errors,
                f"{throttled} of {responses} responses throttled (their mean ThrottleTimeMs "
                f"{throttle_sum / throttled if throttled else 0:.0f}), "
                f"value bytes {counted[0] / (seconds - warmup) / calibration.quota:.3f}x, batch bytes per value byte "
                f"{factor:.4f}, mean batch {mean_batch:.0f} B, "
                f"batches {spread}, most requests awaiting a response {in_flight}, most not yet sent {unsent}",
                trace)


def _trace_row(at: float, stats: dict[str, Any], topic: str) -> list[float]:
    """One statistics snapshot as a row of TRACE_COLUMNS (the broker's queues now; the batches and
    responses of the second before it)."""
    brokers = [b for b in stats["brokers"].values() if b.get("nodeid", -1) >= 0]
    batch = stats["topics"].get(topic, {}).get("batchsize", {})

    def total(key: str) -> float:
        return float(sum(b.get(key, 0) for b in brokers))

    responses = sum(b["throttle"]["cnt"] for b in brokers)
    throttle = sum(b["throttle"]["sum"] for b in brokers)
    return [round(at, 1), total("waitresp_cnt"), total("waitresp_msgcnt"), total("outbuf_cnt"),
            total("outbuf_msgcnt"), float(batch.get("cnt", 0)), float(batch.get("max", 0)),
            float(batch.get("avg", 0)), float(responses), round(throttle / responses, 1) if responses else 0.0,
            total("tx"), total("rx")]


def real_aiokafka(bootstrap: str, topic: str, calibration: Calibration) -> Side:
    from aiokafka import AIOKafkaProducer
    seconds, warmup = calibration.seconds, calibration.warmup
    counted = [0]
    errors: dict[str, int] = {}

    async def produce() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, client_id=calibration.client_id)
        await producer.start()
        loop = asyncio.get_running_loop()
        start = loop.time()

        def delivered(future: asyncio.Future[object]) -> None:
            at = loop.time() - start
            if future.cancelled():
                return
            error = future.exception()
            if error is not None:
                errors[type(error).__name__] = errors.get(type(error).__name__, 0) + 1
            elif warmup <= at < seconds:
                counted[0] += RECORD_SIZE

        payload = b"x" * RECORD_SIZE
        offered = OFFER * calibration.quota
        sent = 0
        while (elapsed := loop.time() - start) < seconds:
            if sent * RECORD_SIZE < offered * elapsed:
                # send() waits while the partition's batch is full: the application waits with it.
                remaining = seconds - elapsed
                try:
                    future = await asyncio.wait_for(producer.send(topic, payload), remaining)
                except TimeoutError:
                    break
                future.add_done_callback(delivered)
                sent += 1
            else:
                await asyncio.sleep(0.002)
        # aiokafka has no purge: stop() sends what is queued (a batch or two, as send() waits
        # while one is full), acknowledged after the measured seconds and so not counted.
        await producer.stop()

    asyncio.run(produce())
    admitted = counted[0] * AIOKAFKA_BATCH_BYTES_PER_VALUE_BYTE / (seconds - warmup) / calibration.quota
    timeouts = sum(n for name, n in errors.items() if "Timeout" in name or "TimedOut" in name)
    return Side(admitted, AIOKAFKA_BATCH_BYTES, None, None, timeouts, errors,
                f"value bytes {counted[0] / (seconds - warmup) / calibration.quota:.3f}x, batch bytes per value byte "
                f"{AIOKAFKA_BATCH_BYTES_PER_VALUE_BYTE:.4f} (its builder, full batches)")


def _java(cluster: KafkaCluster, workdir: Path, calibration: Calibration, *args: str) -> dict[str, object]:
    """CalibrationClients.java in one mode: its counted figure, errors and metrics."""
    log = workdir / f"{calibration.name}.log"
    with log.open("w") as stderr:
        result = subprocess.run(
            ["java", "-cp", f"{cluster.kafka_dir / 'libs'}/*", f"-Dlog4j2.configurationFile={cluster.tools_log4j}",
             str(CLIENTS_JAVA), *args], stdout=subprocess.PIPE, stderr=stderr, text=True,
            timeout=calibration.seconds + 180, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{calibration.name}: {log.read_text()[-3000:]}")
    parsed: dict[str, object] = {"errors": {}, "start": {}, "end": {}}
    for line in result.stdout.splitlines():
        kind, *rest = line.split()
        if kind == "counted":
            parsed["counted"] = int(rest[0])
        elif kind == "error":
            parsed["errors"][rest[0]] = int(rest[1])  # type: ignore[index]
        elif kind in ("metric-start", "metric"):
            parsed["start" if kind == "metric-start" else "end"][rest[0]] = float(rest[1])  # type: ignore[index]
    return parsed


def real_java_producer(cluster: KafkaCluster, topic: str, workdir: Path, calibration: Calibration) -> Side:
    out = _java(cluster, workdir, calibration, "produce", cluster.bootstrap, topic, calibration.client_id,
                str(OFFER * calibration.quota), str(calibration.seconds), str(calibration.warmup))
    start, end = out["start"], out["end"]
    assert isinstance(start, dict) and isinstance(end, dict)
    group = "producer-metrics:"
    factor = end[group + "request-size-avg"] / (end[group + "records-per-request-avg"] * RECORD_SIZE)
    counted = int(out["counted"])  # type: ignore[call-overload]
    seconds = calibration.seconds - calibration.warmup
    errors = out["errors"]
    assert isinstance(errors, dict)
    closes = end[group + "connection-close-total"] - start[group + "connection-close-total"]
    return Side(counted * factor / seconds / calibration.quota, end[group + "request-size-avg"],
                round(end[group + "request-total"] - start[group + "request-total"]),
                end[group + "produce-throttle-time-avg"], int(closes), errors,
                f"value bytes {counted / seconds / calibration.quota:.3f}x, request bytes per value byte "
                f"{factor:.4f}, mean request {end[group + 'request-size-avg']:.0f} B, ThrottleTimeMs max "
                f"{end[group + 'produce-throttle-time-max']:.0f}; time-outs: connections closed")


def real_java_consumer(cluster: KafkaCluster, topic: str, workdir: Path, calibration: Calibration) -> Side:
    out = _java(cluster, workdir, calibration, "consume", cluster.bootstrap, topic, calibration.client_id,
                str(calibration.seconds), str(calibration.warmup))
    start, end = out["start"], out["end"]
    assert isinstance(start, dict) and isinstance(end, dict)
    group = "consumer-fetch-manager-metrics:"
    factor = end[group + "fetch-size-avg"] / (end[group + "records-per-request-avg"] * RECORD_SIZE)
    counted = int(out["counted"])  # type: ignore[call-overload]
    seconds = calibration.seconds - calibration.warmup
    errors = out["errors"]
    assert isinstance(errors, dict)
    closes = end["consumer-metrics:connection-close-total"] - start["consumer-metrics:connection-close-total"]
    return Side(counted * factor / seconds / calibration.quota, None,
                round(end[group + "fetch-total"] - start[group + "fetch-total"]),
                end[group + "fetch-throttle-time-avg"], int(closes), errors,
                f"value bytes {counted / seconds / calibration.quota:.3f}x, fetched bytes per value byte "
                f"{factor:.4f}, ThrottleTimeMs max {end[group + 'fetch-throttle-time-max']:.0f}; "
                "time-outs: connections closed")


def real_java_admin(cluster: KafkaCluster, workdir: Path, calibration: Calibration) -> Side:
    partitions = calibration.model.clients.request_bytes
    out = _java(cluster, workdir, calibration, "admin", cluster.bootstrap, calibration.client_id, str(partitions),
                str(calibration.seconds), str(calibration.warmup))
    start, end = out["start"], out["end"]
    assert isinstance(start, dict) and isinstance(end, dict)
    counted = int(out["counted"])  # type: ignore[call-overload]
    seconds = calibration.seconds - calibration.warmup
    errors = out["errors"]
    assert isinstance(errors, dict)
    group = "admin-client-metrics:"
    requests = end.get(group + "request-total", 0.0) - start.get(group + "request-total", 0.0)
    closes = end.get(group + "connection-close-total", 0.0) - start.get(group + "connection-close-total", 0.0)
    return Side(counted / seconds / calibration.quota, None, round(requests), None, int(closes), errors,
                f"{counted // partitions} topics created in the measured seconds; responses: all the admin "
                "client's requests (CreateTopics, Metadata); time-outs: connections closed")


# ---- the system test's part -----------------------------------------------------------------

def prepare(cluster: KafkaCluster, names: list[str]) -> None:
    """Quotas on the calibration client-ids, their topics, the consumer's topic pre-filled."""
    from harness import perf_tools
    for name in names:
        calibration = CALIBRATIONS[name]
        quota = calibration.quota if calibration.quota_key == "controller_mutation_rate" else int(calibration.quota)
        cluster.run_tool("kafka.admin.ConfigCommand", "--bootstrap-server", cluster.bootstrap, "--alter",
                         "--add-config", f"{calibration.quota_key}={quota}", "--entity-type", "clients",
                         "--entity-name", calibration.client_id)
        if calibration.quota_key != "controller_mutation_rate":
            cluster.create_topic(calibration.client_id, partitions=1, replication=1)
    if "calibrate-consumer" in names:
        calibration = CALIBRATIONS["calibrate-consumer"]
        records = int(2 * calibration.quota * calibration.seconds) // RECORD_SIZE  # twice what the quota lets out
        perf_tools.producer_perf(cluster, cluster.bootstrap, calibration.client_id, records, RECORD_SIZE,
                                 props={"acks": "1", "linger.ms": "5", "batch.size": "262144"})


def run_real(cluster: KafkaCluster, workdir: Path, name: str) -> Side:
    calibration = CALIBRATIONS[name]
    topic = calibration.client_id
    if name == "calibrate-librdkafka":
        return real_librdkafka(cluster.bootstrap, topic, calibration)
    if name == "calibrate-aiokafka":
        return real_aiokafka(cluster.bootstrap, topic, calibration)
    if name == "calibrate-java-producer":
        return real_java_producer(cluster, topic, workdir, calibration)
    if name == "calibrate-consumer":
        return real_java_consumer(cluster, topic, workdir, calibration)
    return real_java_admin(cluster, workdir, calibration)


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def _throttle(side: Side) -> str:
    if side.mean_throttle_ms is None:
        return "-"
    return f"{side.mean_throttle_ms:.0f} ms"


def report(real: dict[str, list[Side]], names: list[str]) -> tuple[str, bool]:
    """Per shape: the real client per round, the model over the seeds, their ratio, PASS/FAIL."""
    lines = ["| calibration | real client (x quota) per round | model median (min-max) over seeds | model / real "
             "| responses real / model | mean ThrottleTimeMs real / model | time-outs real / model |",
             "|---|---|---|---|---|---|---|"]
    verdicts = []
    passed = True
    for name in names:
        calibration = CALIBRATIONS[name]
        scenario = model_scenario(calibration, real[name])
        model = run_model(scenario)
        real_median = statistics.median(s.admitted for s in real[name])
        model_median = statistics.median(s.admitted for s in model)
        ratio = model_median / real_median if real_median else float("inf")
        ok = abs(ratio - 1.0) <= TOLERANCE
        passed = passed and ok
        first = real[name][0]
        lines.append(
            f"| {name} | {' / '.join(f'{s.admitted:.3f}' for s in real[name])} "
            f"| {_median([s.admitted for s in model])} | {ratio:.3f} "
            f"| {first.responses if first.responses is not None else '-'} / {model[0].responses} "
            f"| {_throttle(first)} / {_throttle(model[0])} | {first.timeouts} / {model[0].timeouts} |")
        verdicts.append(f"{'PASS' if ok else 'FAIL'}  {name}: model within {TOLERANCE:.0%} of the real client "
                        f"({model_median:.3f}x against {real_median:.3f}x, ratio {ratio:.3f})")
        verdicts.append(f"      real: {calibration.real_setup}; {first.detail}; errors {first.errors or 'none'}")
        verdicts.append(f"      model (seed {SEEDS[0]}): {scenario.name}; {model[0].detail}")
    return "\n".join([*lines, "", *verdicts]), passed


def save(real: dict[str, list[Side]], path: Path, load: tuple[str, str]) -> None:
    path.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load": load,
                                "real": {name: [asdict(s) for s in sides] for name, sides in real.items()}},
                               indent=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--real", type=Path, required=True, help="real figures a system test saved")
    args = parser.parse_args(argv)
    saved = json.loads(args.real.read_text())
    real = {name: [Side(**s) for s in sides] for name, sides in saved["real"].items()}
    text, passed = report(real, [n for n in NAMES if n in real])
    print(f"real clients: {saved['date']}, load {saved['load'][0]} before, {saved['load'][1]} after\n\n{text}")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
