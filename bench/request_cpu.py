"""CPU the proxy spends on one request and its response, without sockets or a broker.

    .venv/bin/python bench/request_cpu.py [--requests 20000] [--rounds 5] [--profile]

A `ProxiedConnection` with the hooks `kqp serve` installs (quota admin, enforcement with a
`<default>` client-id quota, metrics, observation; capture off) is fed small Produce
requests and their responses through stand-in transports, pipelined as a busy producer
pipelines them. Prints microseconds of process CPU per request+response pair (best round),
for the whole path and for the connection alone (no hooks), so the hooks' share is visible.
This is the Python work of the hop; the syscalls and the event loop come on top of it
(bench/proxy_throughput.py measures those, end to end).

In a running proxy each request wakes the process after the broker's and the client's JVMs
have run on the same cores, so the interpreter starts every request with cold caches.
`--cold-mb N` measures that case too: one request and its response at a time, with N MB
touched between the two (what another process does to the caches), and prints the
wall-clock microseconds spent inside the proxy's calls. With 8 MB (past this machine's
2 MB L2) it gives about 107 µs per request+response where the pipelined rounds give 33,
close to the 140 µs of Python per request that `perf stat` finds in a running proxy
(docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import pstats
import socket
import time
from collections.abc import Callable
from typing import Any, Protocol

from bare_relay import _Side  # bench/ is on sys.path when this script runs
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record import MemoryRecordsBuilder

import kqp
from kqp.config.models import EnforcementSection
from kqp.protocol import session
from kqp.protocol.apis import PRODUCE_KEY
from kqp.protocol.headers import encode_request_header
from kqp.proxy.cluster import ClusterDirectory, Listener
from kqp.proxy.connection import ConnectionServices, ProxiedConnection
from kqp.proxy.hooks import TrafficHooks
from kqp.proxy.metrics import ProxyMetrics
from kqp.proxy.observation import ObservationHooks
from kqp.proxy.options import ProxyOptions
from kqp.proxy.policies.chain import EnforcementPolicies
from kqp.proxy.quota_admin import QuotaAdminHooks
from kqp.proxy.topics import TopicDirectory
from kqp.quotas import QuotaEngine, QuotaEntity, QuotaEntry, QuotaSettings

try:
    from kqp.proxy.hook_chain import HookChain
except ImportError:  # a tree from before the chain had a module of its own (a baseline to compare with)
    from kqp.proxy.hooks import HookChain  # type: ignore[attr-defined,no-redef]

PRODUCE_VERSION = 11  # what Kafka 4.3's Java producer sends by name
PIPELINE = 5  # max.in.flight.requests.per.connection


class NullTransport:
    """Takes what a connection writes and drops it."""

    def __init__(self) -> None:
        self.written = 0

    def writelines(self, parts: Any) -> None:
        for part in parts:
            self.written += len(part)

    def write(self, data: Any) -> None:
        self.written += len(data)

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def set_write_buffer_limits(self, high: int) -> None: ...
    def close(self) -> None: ...

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else None


def produce_frame(correlation_id: int, record_bytes: int, records: int) -> bytes:
    builder = MemoryRecordsBuilder(2, 0, batch_size=1 << 20)
    for index in range(records):
        builder.append(1_700_000_000_000 + index, None, b"x" * record_bytes, [])
    builder.close()
    topic_cls = ProduceRequest.TopicProduceData
    body = ProduceRequest[PRODUCE_VERSION](transactional_id=None, acks=-1, timeout_ms=30_000, topic_data=[
        topic_cls(name="bench", partition_data=[
            topic_cls.PartitionProduceData(index=0, records=bytes(builder.buffer()))])]).encode()
    return encode_request_header(PRODUCE_KEY, PRODUCE_VERSION, correlation_id, "perf-producer") + bytes(body)


def produce_response_frame(correlation_id: int) -> bytes:
    topic_cls = ProduceResponse.TopicProduceResponse
    body = ProduceResponse[PRODUCE_VERSION](throttle_time_ms=0, responses=[
        topic_cls(name="bench", partition_responses=[topic_cls.PartitionProduceResponse(
            index=0, error_code=0, base_offset=1, log_append_time_ms=-1, log_start_offset=0,
            record_errors=[], error_message=None)])]).encode()
    return correlation_id.to_bytes(4, "big") + b"\x00" + bytes(body)  # header v1: no tagged fields


def sized(frame: bytes) -> bytes:
    return len(frame).to_bytes(4, "big") + frame


def kqp_serve_hooks(topics: TopicDirectory, *, default_quota: bool = True) -> TrafficHooks:
    """The hooks `kqp serve` installs, with a `<default>` client-id producer quota (large: it
    never throttles here) or, without `default_quota`, none, as `kqp serve` runs with no
    configuration (bench/proxy_throughput.py)."""
    entries = (QuotaEntry(QuotaEntity(client_id="<default>"), {"producer_byte_rate": 10 * 2**30}),)
    engine = QuotaEngine(QuotaSettings(entries=entries if default_quota else ()))
    metrics = ProxyMetrics(top_n_client_ids=100)
    metrics.set_quota_stats_source(engine.snapshot)
    loop = asyncio.get_running_loop()
    return HookChain([
        QuotaAdminHooks(lambda: engine.settings, lambda _settings, _who: None),
        EnforcementPolicies(engine, EnforcementSection(), lambda: time.monotonic() * 1000.0, topics),
        ObservationHooks(metrics, None, clock=loop.time, topics=topics),
    ])


def connection(hooks: TrafficHooks) -> ProxiedConnection:
    options = ProxyOptions(upstream_bootstrap=(("127.0.0.1", 9092),))
    directory = ClusterDirectory(options, lambda _listener, _sock: None)
    services = ConnectionServices(
        asyncio.get_running_loop(), options, directory, TopicDirectory(), hooks, None, lambda: None,
        lambda _c, _r: None, lambda _c, _r, _e: None, lambda _k: None, lambda _c, _m: None,
    )
    proxied = ProxiedConnection(services, Listener(1, 0), 1)
    proxied.client_connected(NullTransport())  # type: ignore[arg-type]
    proxied.upstream_connected(NullTransport())  # type: ignore[arg-type]
    proxied._apply(proxied._gate.upstream_open())  # as _connect_upstream does once connected
    return proxied


class Hop(Protocol):
    """What a round drives: bytes from the client, bytes from the broker."""

    def client_data(self, data: bytes) -> None: ...
    def upstream_data(self, data: bytes) -> None: ...


class RelayHop:
    """bench/bare_relay.py's two protocol objects, wired to stand-in transports: the floor."""

    def __init__(self) -> None:
        self.client, self.upstream = _Side(), _Side()
        self.client.peer, self.upstream.peer = self.upstream, self.client
        self.client.connection_made(NullTransport())  # type: ignore[arg-type]
        self.upstream.connection_made(NullTransport())  # type: ignore[arg-type]
        self.client_data = self.client.data_received
        self.upstream_data = self.upstream.data_received


def check_answered(hop: Hop) -> None:
    if isinstance(hop, ProxiedConnection) and (hop.closed or hop.in_flight):
        raise RuntimeError("the connection did not answer every request")


def run_cold_round(hop: Hop, requests: list[bytes], responses: list[bytes], evict: bytearray,
                   pieces: int = 1) -> float:
    """Seconds inside the hop per request+response pair, caches evicted before each call;
    each request arrives in `pieces` reads."""
    half = len(evict) // 2

    def touch() -> None:
        evict[:half], evict[half:] = evict[half:], evict[:half]  # read and write every cache line

    spent = 0.0
    gc.collect()
    gc.disable()
    for request, response in zip(requests, responses, strict=True):
        step = -(-len(request) // pieces)
        for offset in range(0, len(request), step):
            touch()
            start = time.perf_counter()
            hop.client_data(request[offset : offset + step])
            spent += time.perf_counter() - start
        touch()
        start = time.perf_counter()
        hop.upstream_data(response)
        spent += time.perf_counter() - start
    gc.enable()
    check_answered(hop)
    return spent / len(requests)


def run_round(hop: Hop, requests: list[bytes], responses: list[bytes]) -> float:
    """Seconds of process CPU per request+response pair, PIPELINE requests in flight."""
    gc.collect()
    gc.disable()
    start = time.process_time()
    for index in range(0, len(requests), PIPELINE):
        for request in requests[index : index + PIPELINE]:
            hop.client_data(request)
        for response in responses[index : index + PIPELINE]:
            hop.upstream_data(response)
    elapsed = time.process_time() - start
    gc.enable()
    check_answered(hop)
    return elapsed / len(requests)


def protocol_for_free(requests: list[bytes], responses: list[bytes]) -> None:
    """Replace the session's header, acks, correlation, body-offset, ThrottleTimeMs and
    rewrite routines by lookups of their precomputed answers: the most a compiled extension
    of those routines could save (framing and everything around them stay as they are)."""
    if kqp.PURE_BECAUSE is None:
        # The compiled session calls the compiled routines directly: replacing the module's
        # names would change nothing it calls, and the figures would say otherwise.
        raise SystemExit("--protocol-for-free replaces the pure session's names: run it with KQP_PURE=1")
    real: Any = session  # the module's own names, before they are replaced
    headers = {frame[4:]: real.parse_request_header(frame[4:]) for frame in requests}
    body_offset = real.response_body_offset(responses[0][4:], PRODUCE_KEY, PRODUCE_VERSION)
    throttle_offsets = {frame[4:]: real.throttle_field_offset(frame[4:], body_offset, PRODUCE_KEY, PRODUCE_VERSION)
                        for frame in responses}
    correlation_ids = {frame[4:]: real.response_correlation_id(frame[4:]) for frame in responses}
    replacements: dict[str, Callable[..., Any]] = {
        "parse_request_header": headers.__getitem__,
        "expects_response": lambda _key, _version, _body: True,
        "response_correlation_id": correlation_ids.__getitem__,
        "response_body_offset": lambda _frame, _key, _version: body_offset,
        "throttle_field_offset": lambda frame, _offset, _key, _version: throttle_offsets[frame],
        "client_response": lambda _key, _version, frame, *_args, **_kwargs: (frame, False),
    }
    for name, replacement in replacements.items():
        setattr(session, name, replacement)


async def measure(count: int, rounds: int, record_bytes: int, records: int, profile: bool, cold_mb: int,
                  pieces: int, free_protocol: bool) -> None:
    requests = [sized(produce_frame(i, record_bytes, records)) for i in range(count)]
    responses = [sized(produce_response_frame(i)) for i in range(count)]
    if free_protocol:
        protocol_for_free(requests, responses)
        print("protocol routines replaced by lookups (--protocol-for-free)")
    print(f"{count} Produce v{PRODUCE_VERSION} requests of {len(requests[0])} bytes "
          f"({records} records of {record_bytes} bytes in one batch), {PIPELINE} in flight")
    hops: list[tuple[str, Callable[[], Hop]]] = [
        ("bare relay", RelayHop),
        ("connection alone", lambda: connection(TrafficHooks())),
        ("kqp serve hooks", lambda: connection(kqp_serve_hooks(TopicDirectory()))),
    ]
    for name, make_hop in hops:
        hop = make_hop()
        run_round(hop, requests[:1000], responses[:1000])  # warm caches and sensors
        best = min(run_round(hop, requests, responses) for _ in range(rounds))
        print(f"  {name:18s} {best * 1e6:7.1f} µs per request+response (best of {rounds})")
        if profile and name == "kqp serve hooks":
            profiler = cProfile.Profile()
            profiler.enable()
            run_round(hop, requests, responses)
            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
        if cold_mb:
            evict = bytearray(cold_mb * 2**20)
            cold_count = min(count, 1000)
            cold = sorted(run_cold_round(make_hop(), requests[:cold_count], responses[:cold_count], evict, pieces)
                          for _ in range(rounds))
            print(f"  {name:18s} {cold[len(cold) // 2] * 1e6:7.1f} µs per request+response, caches cold "
                  f"({cold_mb} MB touched between calls, requests in {pieces} reads, median of {rounds})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--record-bytes", type=int, default=100)
    parser.add_argument("--records", type=int, default=1, help="records per request (one batch)")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of one round with the hooks")
    parser.add_argument("--cold-mb", type=int, default=0,
                        help="also measure with this many MB touched between calls (cold caches)")
    parser.add_argument("--pieces", type=int, default=1, help="reads each request arrives in (cold rounds)")
    parser.add_argument("--protocol-for-free", action="store_true",
                        help="replace the session's protocol routines by lookups (a compiled extension's best case)")
    args = parser.parse_args()
    socket.setdefaulttimeout(None)
    asyncio.run(measure(args.requests, args.rounds, args.record_bytes, args.records, args.profile, args.cold_mb,
                        args.pieces, args.protocol_for_free))


if __name__ == "__main__":
    main()
