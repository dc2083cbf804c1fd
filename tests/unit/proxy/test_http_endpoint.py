from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from kqp.proxy.http_endpoint import DEFAULT_HOST, ObservabilityEndpoint
from kqp.proxy.metrics import ProxyMetrics


class Reply:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body


def _fetch(url: str, method: str, headers: dict[str, str]) -> Reply:
    request = urllib.request.Request(url, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return Reply(response.status, dict(response.headers), response.read())
    except urllib.error.HTTPError as error:
        return Reply(error.code, dict(error.headers), error.read())


async def http(endpoint: ObservabilityEndpoint, path: str, method: str = "GET", **headers: str) -> Reply:
    # A real HTTP client on a worker thread, so the endpoint's loop keeps serving.
    url = f"http://127.0.0.1:{endpoint.port}{path}"
    return await asyncio.to_thread(_fetch, url, method, headers)


@pytest.fixture
def metrics() -> ProxyMetrics:
    metrics = ProxyMetrics(CollectorRegistry())
    metrics.request_completed(0, 9, 1000, 60, 0.002, 0.00003, [], user="alice", client_id="p1")
    return metrics


@pytest.fixture
def readiness() -> list[bool | tuple[bool, str]]:
    return [True]


@pytest.fixture
async def endpoint(
    metrics: ProxyMetrics, readiness: list[bool | tuple[bool, str]]
) -> AsyncIterator[ObservabilityEndpoint]:
    server = ObservabilityEndpoint(metrics.registry, host="127.0.0.1", port=0, ready=lambda: readiness[-1])
    await server.start()
    yield server
    await server.stop()


async def test_metrics_serves_the_prometheus_text_format(endpoint: ObservabilityEndpoint) -> None:
    reply = await http(endpoint, "/metrics")
    assert reply.status == 200
    assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert b'kqp_requests_total{api="Produce",api_version="9"} 1.0' in reply.body
    assert b'kqp_client_request_bytes_total{client_id="p1",user="alice"} 1000.0' in reply.body


async def test_metrics_negotiates_openmetrics(endpoint: ObservabilityEndpoint) -> None:
    reply = await http(endpoint, "/metrics", Accept="application/openmetrics-text; version=1.0.0")
    assert reply.status == 200
    assert reply.headers["Content-Type"].startswith("application/openmetrics-text")
    assert reply.body.endswith(b"# EOF\n")


async def test_metrics_reflect_updates_between_scrapes(endpoint: ObservabilityEndpoint, metrics: ProxyMetrics) -> None:
    metrics.request_completed(0, 9, 1000, 60, 0.002, 0.00003, [], user="alice", client_id="p1")
    reply = await http(endpoint, "/metrics?x=1")
    assert b'kqp_requests_total{api="Produce",api_version="9"} 2.0' in reply.body


async def test_healthz_says_the_process_is_up(endpoint: ObservabilityEndpoint) -> None:
    reply = await http(endpoint, "/healthz")
    assert (reply.status, reply.body) == (200, b"ok\n")


async def test_readyz_follows_the_readiness_check(
    endpoint: ObservabilityEndpoint, readiness: list[bool | tuple[bool, str]]
) -> None:
    assert (await http(endpoint, "/readyz")).status == 200
    readiness.append((False, "upstream 127.0.0.1:9092 unreachable"))
    reply = await http(endpoint, "/readyz")
    assert reply.status == 503
    assert reply.body == b"not ready: upstream 127.0.0.1:9092 unreachable\n"
    readiness.append(False)
    assert (await http(endpoint, "/readyz")).status == 503
    readiness.append(True)
    assert (await http(endpoint, "/readyz")).status == 200


async def test_readyz_is_503_when_the_check_raises(metrics: ProxyMetrics) -> None:
    def broken() -> bool:
        raise RuntimeError("config not loaded")

    server = ObservabilityEndpoint(metrics.registry, port=0, ready=broken)
    await server.start()
    try:
        reply = await http(server, "/readyz")
    finally:
        await server.stop()
    assert reply.status == 503
    assert b"config not loaded" in reply.body


@pytest.mark.parametrize(
    ("path", "method", "status"),
    [("/nope", "GET", 404), ("/metrics", "POST", 405), ("/metrics", "DELETE", 405)],
)
async def test_other_requests_are_refused(endpoint: ObservabilityEndpoint, path: str, method: str, status: int) -> None:
    assert (await http(endpoint, path, method)).status == status


async def test_head_has_headers_but_no_body(endpoint: ObservabilityEndpoint) -> None:
    reply = await http(endpoint, "/metrics", "HEAD")
    assert reply.status == 200
    assert int(reply.headers["Content-Length"]) > 100
    assert reply.body == b""


async def test_garbage_and_silence_do_not_break_the_endpoint(endpoint: ObservabilityEndpoint) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", endpoint.port)
    writer.write(b"NONSENSE\r\n\r\n")
    answer = await reader.read()
    writer.close()
    assert answer.startswith(b"HTTP/1.1 400")
    # A client that connects and hangs up without a request.
    _, silent = await asyncio.open_connection("127.0.0.1", endpoint.port)
    silent.close()
    assert (await http(endpoint, "/healthz")).status == 200


async def test_loopback_is_the_default_and_stop_closes_the_port(metrics: ProxyMetrics) -> None:
    assert DEFAULT_HOST == "127.0.0.1"
    server = ObservabilityEndpoint(metrics.registry, port=0)
    assert server.host == DEFAULT_HOST
    await server.start()
    port = server.port
    assert (await http(server, "/readyz")).status == 200  # no check configured: ready
    await server.stop()
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)
