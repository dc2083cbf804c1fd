"""The cost of the fleet's usage exchange: records, bytes and CPU per second, against real Kafka.

Runs N exchanges (kqp.proxy.fleet.FleetExchange, the proxy's own code) in this process against
a real Kafka cluster, each in front of a quota engine whose E clients record traffic every
report interval, and measures what crosses the usage topic and what the exchange costs in CPU:
the encoding and sending of reports and the decoding and applying of everyone else's.

    .venv/bin/python -m bench.fleet_exchange --instances 1 2 3 --entities 100 1000 10000

Prints a Markdown table (docs/scaling.md has the figures and the extrapolation).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from dataclasses import dataclass

from harness.local_kafka import KafkaCluster
from kqp.config.models import FleetSection
from kqp.proxy.fleet import FleetExchange, FleetOptions
from kqp.quotas import QuotaEngine, QuotaEntity, QuotaEntry, QuotaSettings
from kqp.quotas.fleet import UsageDelta, UsageReport, encode_report


@dataclass(frozen=True)
class Result:
    """Totals over `seconds` until `per_second` turns them into rates."""

    instances: int
    entities: int
    seconds: float
    records_per_s: float  # written, all instances
    bytes_per_s: float  # written, all instances
    bytes_read_per_s: float  # read, per instance
    deltas_applied_per_s: float  # all instances
    cpu_share: float  # of one core, all instances: the exchange's, the traffic's own CPU taken off
    # The pacing at the end (kqp.quotas.fleet.ReportPacer), the longest of the instances': the interval
    # the reports went at, and the round trip of an instance's own reports that set it.
    interval_ms: float = 0.0
    round_trip_ms: float = 0.0

    def per_second(self) -> Result:
        s = self.seconds
        return Result(self.instances, self.entities, s, self.records_per_s / s, self.bytes_per_s / s,
                      self.bytes_read_per_s / s, self.deltas_applied_per_s / s, self.cpu_share / s,
                      self.interval_ms, self.round_trip_ms)


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


REQUEST_BYTES = 16384  # what each client records per report interval


def engine_for(client_rate: float, client_load: float) -> QuotaEngine:
    """Each client's quota such that its traffic is `client_load` of it (1: at its limit,
    every delta reported; far below `max_unreported_share` / instances: none reported)."""
    quota = client_rate / client_load
    default = QuotaEntry(QuotaEntity(client_id="<default>"), {"producer_byte_rate": quota})
    return QuotaEngine(QuotaSettings(entries=(default,), scope="cluster"))


def report_bytes(entities: int) -> int:
    """Bytes of the report one instance sends per interval for this many active clients."""
    usage = tuple(UsageDelta("producer_byte_rate", None, (("user", ""), ("client-id", f"client-{i:06d}")), 16384.0)
                  for i in range(entities))
    return len(encode_report(UsageReport("host:9192:12345", 1, usage)))


async def drive(engines: list[QuotaEngine], entities: int, interval_s: float, seconds: float) -> float:
    """Every client of every engine records one produce request per interval; CPU seconds used."""
    cpu_before = time.process_time()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        now = time.monotonic() * 1000.0
        for index, engine in enumerate(engines):
            for client in range(entities):
                engine.record_produce("1", "", f"i{index}-client-{client:06d}", REQUEST_BYTES, now)
        await asyncio.sleep(interval_s)
    return time.process_time() - cpu_before


async def measure(bootstrap: str, instances: int, entities: int, seconds: float, interval_s: float,
                  client_load: float, max_unreported_share: float) -> Result:
    client_rate = REQUEST_BYTES / interval_s
    # The same traffic without the exchange first: what remains after it is the exchange's CPU.
    baseline_cpu = await drive([engine_for(client_rate, client_load) for _ in range(instances)], entities,
                               interval_s, seconds)
    topic = f"_kqp_bench_usage_{instances}_{entities}_{int(time.time())}"
    engines = [engine_for(client_rate, client_load) for _ in range(instances)]
    exchanges = []
    for index, engine in enumerate(engines):
        options = FleetOptions(bootstrap_servers=(bootstrap,), topic=topic, instance_id=f"bench-{index}",
                               report_interval_seconds=interval_s, max_unreported_share=max_unreported_share)
        exchange = FleetExchange(options, engine, lambda: time.monotonic() * 1000.0, lambda: 11_000.0)
        exchanges.append(exchange)
        await exchange.start()
    for _ in range(600):  # the exchange polls its own state: at most a minute to see its reports back
        if all(e.state() == "ok" for e in exchanges):
            break
        await asyncio.sleep(0.1)
    else:
        raise RuntimeError(f"exchanges not ok after 60 s: {[e.describe() for e in exchanges]}")
    records = [e.records_sent for e in exchanges]
    written = [e.bytes_sent for e in exchanges]
    read = [e.bytes_received for e in exchanges]
    applied = [e.deltas_applied for e in exchanges]
    start = time.monotonic()
    cpu = await drive(engines, entities, interval_s, seconds)
    elapsed = time.monotonic() - start
    result = Result(
        instances, entities, elapsed,
        records_per_s=sum(e.records_sent for e in exchanges) - sum(records),
        bytes_per_s=sum(e.bytes_sent for e in exchanges) - sum(written),
        bytes_read_per_s=(sum(e.bytes_received for e in exchanges) - sum(read)) / instances,
        deltas_applied_per_s=sum(e.deltas_applied for e in exchanges) - sum(applied),
        cpu_share=max(0.0, cpu - baseline_cpu),
        interval_ms=max(e.pacer.interval_ms for e in exchanges),
        round_trip_ms=max(e.pacer.round_trip_ms or 0.0 for e in exchanges),
    )
    for exchange in exchanges:
        await exchange.stop()
    return result.per_second()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--instances", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--entities", type=int, nargs="+", default=[10, 1000, 10000],
                        help="active clients per instance")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--interval", type=float, default=FleetSection().report_interval_seconds,
                        help="fleet.report_interval_seconds: the shortest report interval, in seconds")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--client-load", type=float, default=1.0,
                        help="each client's traffic as a fraction of its quota (1: the worst case)")
    parser.add_argument("--max-unreported-share", type=float, default=0.02, help="fleet.max_unreported_share")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    results = []
    with KafkaCluster(nodes=args.nodes) as cluster:
        for instances in args.instances:
            for entities in args.entities:
                progress(f"{instances} instance(s) x {entities} active clients each, {args.seconds:.0f} s")
                results.append(asyncio.run(measure(cluster.bootstrap, instances, entities, args.seconds,
                                                   args.interval, args.client_load, args.max_unreported_share)))
    print(f"report interval {args.interval} s; clients at {args.client_load:g} x their quota, "
          f"max_unreported_share {args.max_unreported_share:g}; one report's delta is "
          f"{(report_bytes(1000) - report_bytes(0)) / 1000:.0f} bytes of JSON\n")
    print("| instances | active clients per instance | records/s written | bytes/s written "
          "| bytes/s read per instance | deltas applied/s (all instances) | CPU, share of one core (all instances) "
          "| report interval at the end, ms (own round trip) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r.instances} | {r.entities} | {r.records_per_s:.0f} | {r.bytes_per_s:,.0f} "
              f"| {r.bytes_read_per_s:,.0f} | {r.deltas_applied_per_s:,.0f} | {r.cpu_share:.3f} "
              f"| {r.interval_ms:.0f} ({r.round_trip_ms:.1f}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
