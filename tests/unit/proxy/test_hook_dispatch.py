"""The hook seam's per-API dispatch (kqp.proxy.hooks.HookChain): a hook is given only the
APIs it declared and only the calls it overrides, in chain order; and a Fetch request read by
one hook is not read again by the next."""

from __future__ import annotations

from typing import Any

import pytest
from kafka.protocol.consumer import FetchRequest

from kqp.capture.writer import CaptureWriter
from kqp.config.models import CaptureSection, EnforcementSection
from kqp.protocol.api_keys import ApiKey
from kqp.protocol.apis import FETCH_KEY, PRODUCE_KEY
from kqp.protocol.headers import encode_request_header, parse_request_header
from kqp.proxy.hook_chain import HookChain
from kqp.proxy.hooks import ClientView, Exchange, FetchFindings, RequestVerdict, ResponseVerdict, TrafficHooks
from kqp.proxy.observation import ObservationHooks
from kqp.proxy.policies.chain import EnforcementPolicies
from kqp.proxy.quota_admin import QuotaAdminHooks
from kqp.proxy.topics import TopicDirectory
from kqp.quotas import QuotaEngine, QuotaEntity, QuotaEntry, QuotaSettings
from tests.unit.helpers.client_views import client_view
from tests.unit.helpers.exchanges import exchange_for
from tests.unit.helpers.proxy import heartbeat_request


class Recorder(TrafficHooks):
    """Records every per-API call it is given, with the API key."""

    def __init__(self, api_keys: frozenset[int] | None, name: str, log: list[tuple[str, str, int]]) -> None:
        self.api_keys = api_keys  # type: ignore[misc]  # per instance here, to build several
        self.name = name
        self.log = log

    def hold(self, client: ClientView, exchange: Exchange, frame: bytes) -> None:
        self.log.append((self.name, "hold", exchange.header.api_key))

    def request(self, client: ClientView, exchange: Exchange, frame: bytes) -> RequestVerdict | None:
        self.log.append((self.name, "request", exchange.header.api_key))
        return None

    def response(self, client: ClientView, exchange: Exchange, frame: bytes, body_offset: int) -> None:
        self.log.append((self.name, "response", exchange.header.api_key))

    def unanswered(self, client: ClientView, exchange: Exchange) -> None:
        self.log.append((self.name, "unanswered", exchange.header.api_key))

    def needs_whole_response(self, client: ClientView, exchange: Exchange) -> bool:
        self.log.append((self.name, "needs_whole_response", exchange.header.api_key))
        return False

    def response_started(self, client: ClientView, exchange: Exchange, head: bytearray, body_offset: int,
                         frame_size: int) -> ResponseVerdict | None:
        self.log.append((self.name, "response_started", exchange.header.api_key))
        return None

    def response_streamed(self, client: ClientView, exchange: Exchange, frame_size: int, body_offset: int) -> None:
        self.log.append((self.name, "response_streamed", exchange.header.api_key))


def drive(chain: HookChain, api_key: int) -> None:
    """Every per-API call of the chain, for one exchange of `api_key`."""
    frame = encode_request_header(api_key, 0, 1, "c")
    exchange = Exchange(header=parse_request_header(frame), request_bytes=len(frame) + 4, received_at=0.0)
    client = client_view()
    chain.hold(client, exchange, frame)
    chain.request(client, exchange, frame)
    chain.needs_whole_response(client, exchange)
    chain.response(client, exchange, frame, 4)
    chain.response_started(client, exchange, bytearray(frame), 4, len(frame))
    chain.response_streamed(client, exchange, len(frame), 4)
    chain.unanswered(client, exchange)


@pytest.mark.parametrize("api_key", [ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.METADATA, ApiKey.DESCRIBE_CLIENT_QUOTAS,
                                     999])
def test_a_hook_never_sees_an_api_it_did_not_declare(api_key: int) -> None:
    log: list[tuple[str, str, int]] = []
    every = Recorder(None, "every", log)
    produce_only = Recorder(frozenset({ApiKey.PRODUCE}), "produce", log)
    admin_only = Recorder(frozenset({ApiKey.DESCRIBE_CLIENT_QUOTAS, ApiKey.ALTER_CLIENT_QUOTAS}), "admin", log)
    drive(HookChain([admin_only, produce_only, every]), api_key)
    expected = {"every"} | ({"produce"} if api_key == ApiKey.PRODUCE else set()) | (
        {"admin"} if api_key == ApiKey.DESCRIBE_CLIENT_QUOTAS else set())
    assert {name for name, _call, _key in log} == expected
    assert all(key == api_key for _name, _call, key in log)
    # Every call, in chain order for each call.
    assert len(log) == 7 * len(expected)
    order = ["admin", "produce", "every"]
    for call in {call for _name, call, _key in log}:
        names = [name for name, c, _key in log if c == call]
        assert names == sorted(names, key=order.index)


def test_a_call_a_hook_does_not_override_is_not_in_the_table() -> None:
    class RequestOnly(TrafficHooks):
        def request(self, client: ClientView, exchange: Exchange, frame: bytes) -> RequestVerdict | None:
            return None

    hook = RequestOnly()
    chain = HookChain([hook])
    assert chain.calls_for("response", PRODUCE_KEY) == ()
    assert chain.calls_for("hold", PRODUCE_KEY) == ()
    (call,) = chain.calls_for("request", PRODUCE_KEY)
    assert call.__self__ is hook  # type: ignore[attr-defined]


def test_the_quota_admin_hook_is_given_only_its_two_apis() -> None:
    admin = QuotaAdminHooks(QuotaSettings, lambda _settings, _who: None)
    chain = HookChain([admin])
    for api_key in (PRODUCE_KEY, FETCH_KEY, 12, 33):
        assert chain.calls_for("request", api_key) == ()
        assert chain.calls_for("response", api_key) == ()
        assert chain.calls_for("hold_response", api_key) == ()
    assert len(chain.calls_for("request", ApiKey.ALTER_CLIENT_QUOTAS)) == 1
    assert len(chain.calls_for("hold_response", ApiKey.ALTER_CLIENT_QUOTAS)) == 1
    # 12 is Heartbeat, 33 AlterConfigs. A heartbeat given to the hook directly (outside a chain) is left alone.
    frame = heartbeat_request(1)
    assert admin.request(client_view(), exchange_for(frame), frame) is None


def fetch_frame(min_bytes: int, max_bytes: int) -> bytes:
    message = FetchRequest[12](
        cluster_id=None, replica_id=-1, replica_state=None, max_wait_ms=500, min_bytes=min_bytes,
        max_bytes=max_bytes, isolation_level=0, session_id=0, session_epoch=-1, topics=[],
        forgotten_topics_data=[], rack_id="")
    return encode_request_header(FETCH_KEY, 12, 9, "consumer") + bytes(message.encode())


class ListWriter:
    """The part of CaptureWriter the observation hook uses, keeping records in a list."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def sampled(self, connection_id: int) -> bool:
        return True

    def submit(self, record: dict[str, Any]) -> bool:
        self.records.append(record)
        return True


class FetchAsRead(TrafficHooks):
    """Keeps what the hooks before it read of a Fetch request (`Exchange.fetch`)."""

    def __init__(self) -> None:
        self.seen: list[FetchFindings | None] = []

    def request(self, client: ClientView, exchange: Exchange, frame: bytes) -> RequestVerdict | None:
        self.seen.append(exchange.fetch)
        return None


def test_a_fetch_is_read_once_and_the_capture_records_its_limits_as_forwarded() -> None:
    # Read once: `read_fetch_request` parses only while the exchange holds no reading, and a
    # reading made anew would replace the exchange's. (Counting the parser's calls by
    # replacing it in its module sees nothing in the compiled build: compiled callers call it
    # directly.)
    entry = QuotaEntry(QuotaEntity(client_id="consumer"), {"consumer_byte_rate": 1000.0})
    enforcement = EnforcementPolicies(QuotaEngine(QuotaSettings(entries=(entry,))), EnforcementSection(),
                                   lambda: 1_000_000.0, TopicDirectory())
    writer = ListWriter()
    observation = ObservationHooks(None, writer, clock=lambda: 100.0,  # type: ignore[arg-type]
                                   topics=TopicDirectory())
    after_enforcement = FetchAsRead()
    chain = HookChain([enforcement, after_enforcement, observation])
    frame = fetch_frame(min_bytes=50_000, max_bytes=52_428_800)
    exchange = exchange_for(frame)
    verdict = chain.request(client_view(), exchange, frame)
    assert verdict is not None and verdict.frame is not None  # capped at the quota window
    (enforcements_reading,) = after_enforcement.seen
    assert enforcements_reading is not None and exchange.fetch is enforcements_reading
    chain.unanswered(client_view(), exchange)
    (record,) = writer.records
    # 1000 B/s x 10 full samples x 1 s: MaxBytes capped, MinBytes following it down.
    assert (record["fetch_max_wait_ms"], record["fetch_min_bytes"], record["fetch_max_bytes"]) == (
        500, 10_000, 10_000)
    assert exchange.fetch_max_wait_ms == 500


def test_capture_writer_keeps_the_interface_the_test_stand_in_has() -> None:
    # ListWriter above stands in for CaptureWriter: the two methods it has must exist there.
    writer = CaptureWriter(CaptureSection())
    assert callable(writer.sampled) and callable(writer.submit)
