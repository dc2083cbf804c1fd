"""Cost of recording one request and computing its throttle in kqp.quotas.

    .venv/bin/python bench/quota_hot_path.py [--calls N]

For 1, 10k and 1M distinct clients (every client has its own sensor: a `<default>`
client-id quota), prints ns per `record_produce` call, with the sensors already created
(steady state) and while they are being created (first call per client), then the peak
memory per tracked client measured with tracemalloc while creating them.

Times are process CPU time (time.process_time_ns), so a busy shared machine that deschedules
the process does not inflate them; they still include cache and memory effects.
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc

from kqp.quotas import QuotaEngine, QuotaEntity, QuotaEntry, QuotaSettings

BROKERS = ("1", "2", "3")


def make_engine() -> QuotaEngine:
    entry = QuotaEntry(QuotaEntity(client_id="<default>"), {"producer_byte_rate": 1_048_576})
    return QuotaEngine(QuotaSettings(entries=(entry,)))


def client_ids(n: int) -> list[str]:
    return [f"client-{i}" for i in range(n)]


def steady_ns_per_call(clients: list[str], calls: int) -> float:
    engine = make_engine()
    record = engine.record_produce
    now = 0.0
    for client in clients:  # create every sensor first
        record("1", "alice", client, 1000, now)
    n = len(clients)
    ids = [clients[i % n] for i in range(min(calls, 1_000_000))]
    rounds = max(1, calls // len(ids))
    gc.disable()
    start = time.process_time_ns()
    for _ in range(rounds):
        for client in ids:
            now += 0.01  # 100 calls per ms: samples roll over as in a busy proxy
            record("1", "alice", client, 1000, now)
    elapsed = time.process_time_ns() - start
    gc.enable()
    return elapsed / (rounds * len(ids))


def first_call_ns(clients: list[str]) -> float:
    """ns per call while every call creates its client's sensor (cache miss + resolution)."""
    engine = make_engine()
    record = engine.record_produce
    gc.collect()
    start = time.process_time_ns()
    for i, client in enumerate(clients):
        record("1", "alice", client, 1000, i * 0.01)
    return (time.process_time_ns() - start) / len(clients)


def peak_bytes_per_client(clients: list[str]) -> float:
    """Peak traced memory while creating every client's sensor, per client (ids excluded)."""
    engine = make_engine()
    record = engine.record_produce
    gc.collect()
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    for i, client in enumerate(clients):
        record("1", "alice", client, 1000, i * 0.01)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert engine.tracked_sensors() == len(clients)
    return (peak - base) / len(clients)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2_000_000, help="timed steady-state calls per client count")
    args = parser.parse_args()
    print(f"{'clients':>9} {'steady ns/call':>15} {'first-call ns':>14} {'peak bytes/client':>18}")
    for n in (1, 10_000, 1_000_000):
        clients = client_ids(n)
        steady = steady_ns_per_call(clients, args.calls)
        first = first_call_ns(clients)  # without tracemalloc, which slows allocation down
        per_client = peak_bytes_per_client(clients)
        print(f"{n:>9} {steady:>15.0f} {first:>14.0f} {per_client:>18.0f}", flush=True)


if __name__ == "__main__":
    main()
