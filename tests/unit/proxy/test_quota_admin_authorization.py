"""Quota admin requests are authorized by the brokers, over the client's own connection.

The scripted broker plays one whose authorizer allows, or refuses, everyone; the real
authorizer is exercised in tests/integration/test_quota_admin_authorization.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from kqp.protocol.apis import API_SPECS
from kqp.protocol.codec import decode_body, encode_body
from kqp.protocol.headers import RequestHeader, encode_request_header, response_body_offset
from kqp.proxy.quota_admin import ALTER_CLIENT_QUOTAS_KEY, DESCRIBE_CLIENT_QUOTAS_KEY, QuotaAdminHooks
from kqp.quotas.settings import QuotaEntity, QuotaEntry, QuotaSettings
from tests.unit.helpers.fake_broker import FakeBroker, RawClient
from tests.unit.helpers.proxy import start_proxy

CLUSTER_AUTHORIZATION_FAILED = 31
MESSAGE = "Cluster authorization failed."
ALICE = QuotaSettings(entries=(QuotaEntry(QuotaEntity(user="alice"), {"producer_byte_rate": 1000.0}),))


@dataclass
class Authorizer:
    """A broker's answers when its authorizer allows or refuses every principal."""

    allows: bool
    alter_validate_only: list[bool] = field(default_factory=list)

    def _error(self) -> tuple[int, str | None]:
        return (0, None) if self.allows else (CLUSTER_AUTHORIZATION_FAILED, MESSAGE)

    def alter(self, header: RequestHeader, body: bytes) -> bytes:
        request = decode_body(ALTER_CLIENT_QUOTAS_KEY, header.api_version, body, is_request=True)
        self.alter_validate_only.append(bool(request.validate_only))
        code, message = self._error()
        response_class = API_SPECS[ALTER_CLIENT_QUOTAS_KEY].response_class[header.api_version]
        entry = response_class.EntryData
        entries = [entry(error_code=code, error_message=message,
                         entity=[entry.EntityData(entity_type=e.entity_type, entity_name=e.entity_name)
                                 for e in item.entity])
                   for item in request.entries]
        return encode_body(response_class(throttle_time_ms=7, entries=entries), header.api_version)

    def describe(self, header: RequestHeader, body: bytes) -> bytes:
        code, message = self._error()
        response_class = API_SPECS[DESCRIBE_CLIENT_QUOTAS_KEY].response_class[header.api_version]
        return encode_body(response_class(throttle_time_ms=7, error_code=code, error_message=message,
                                          entries=None if code else []), header.api_version)


@dataclass
class QuotaFile:
    settings: QuotaSettings = ALICE
    stored: list[QuotaSettings] = field(default_factory=list)
    who: list[str] = field(default_factory=list)
    refusals: list[tuple[str, str]] = field(default_factory=list)

    async def store(self, change: Callable[[QuotaSettings], QuotaSettings], who: str) -> None:
        settings = change(self.settings)
        self.stored.append(settings)
        self.who.append(who)
        self.settings = settings

    def hooks(self, admin_principals: frozenset[str] | None = None) -> QuotaAdminHooks:
        return QuotaAdminHooks(lambda: self.settings, self.store, lambda: admin_principals,
                               lambda api, reason: self.refusals.append((api, reason)))


def alter_request(correlation_id: int, rate: float, version: int = 1, validate_only: bool = False) -> bytes:
    request_class = API_SPECS[ALTER_CLIENT_QUOTAS_KEY].request_class[version]
    entry = request_class.EntryData
    request = request_class(entries=[entry(entity=[entry.EntityData(entity_type="user", entity_name="alice")],
                                           ops=[entry.OpData(key="producer_byte_rate", value=rate, remove=False)])],
                            validate_only=validate_only)
    return encode_request_header(ALTER_CLIENT_QUOTAS_KEY, version, correlation_id, "admin") + encode_body(
        request, version)


def describe_request(correlation_id: int, version: int = 1) -> bytes:
    request_class = API_SPECS[DESCRIBE_CLIENT_QUOTAS_KEY].request_class[version]
    component = request_class.ComponentData(entity_type="user", match_type=0, match="alice")
    request = request_class(components=[component], strict=False)
    return encode_request_header(DESCRIBE_CLIENT_QUOTAS_KEY, version, correlation_id, "admin") + encode_body(
        request, version)


async def exchange(broker: FakeBroker, hooks: QuotaAdminHooks, request: bytes, api_key: int) -> Any:
    proxy = await start_proxy(broker, hooks)
    client = await RawClient.connect(proxy.bootstrap_port)
    client.send(request)
    response = await client.receive()
    client.close()
    await proxy.stop()
    return decode_body(api_key, 1, response[response_body_offset(response, api_key, 1):], is_request=False)


@pytest.fixture
async def refusing() -> AsyncIterator[tuple[FakeBroker, Authorizer]]:
    authorizer = Authorizer(allows=False)
    broker = FakeBroker(handlers={ALTER_CLIENT_QUOTAS_KEY: authorizer.alter,
                                  DESCRIBE_CLIENT_QUOTAS_KEY: authorizer.describe})
    await broker.start()
    yield broker, authorizer
    await broker.stop()


@pytest.fixture
async def allowing() -> AsyncIterator[tuple[FakeBroker, Authorizer]]:
    authorizer = Authorizer(allows=True)
    broker = FakeBroker(handlers={ALTER_CLIENT_QUOTAS_KEY: authorizer.alter,
                                  DESCRIBE_CLIENT_QUOTAS_KEY: authorizer.describe})
    await broker.start()
    yield broker, authorizer
    await broker.stop()


async def test_an_alteration_the_brokers_refuse_gets_their_answer_and_changes_nothing(
    refusing: tuple[FakeBroker, Authorizer],
) -> None:
    broker, authorizer = refusing
    quota_file = QuotaFile()
    response = await exchange(broker, quota_file.hooks(), alter_request(3, 99999999.0), ALTER_CLIENT_QUOTAS_KEY)
    assert [(e.error_code, e.error_message) for e in response.entries] == [(CLUSTER_AUTHORIZATION_FAILED, MESSAGE)]
    assert authorizer.alter_validate_only == [True]  # the brokers were only asked, never told to change
    assert quota_file.stored == [] and quota_file.settings == ALICE
    assert quota_file.refusals == [("AlterClientQuotas", "broker authorizer")]


async def test_an_alteration_the_brokers_allow_is_applied_by_the_proxy_only(
    allowing: tuple[FakeBroker, Authorizer],
) -> None:
    broker, authorizer = allowing
    quota_file = QuotaFile()
    response = await exchange(broker, quota_file.hooks(), alter_request(3, 5000.0), ALTER_CLIENT_QUOTAS_KEY)
    assert [e.error_code for e in response.entries] == [0]
    assert response.throttle_time_ms == 7  # the brokers' request-quota throttle is kept
    assert authorizer.alter_validate_only == [True]
    assert [s.entries[0].limits for s in quota_file.stored] == [{"producer_byte_rate": 5000.0}]
    # Who asked, for the entry's origin stamp (kqp check-config shows it).
    assert len(quota_file.who) == 1 and quota_file.who[0].startswith("AlterClientQuotas from ")
    assert quota_file.refusals == []


async def test_a_clients_own_validate_only_alteration_changes_nothing(allowing: tuple[FakeBroker, Authorizer]) -> None:
    broker, _authorizer = allowing
    quota_file = QuotaFile()
    request = alter_request(3, 5000.0, validate_only=True)
    response = await exchange(broker, quota_file.hooks(), request, ALTER_CLIENT_QUOTAS_KEY)
    assert [e.error_code for e in response.entries] == [0]
    assert quota_file.stored == []


async def test_admin_principals_narrow_what_the_brokers_allow(allowing: tuple[FakeBroker, Authorizer]) -> None:
    broker, _authorizer = allowing
    quota_file = QuotaFile()
    hooks = quota_file.hooks(admin_principals=frozenset({"User:admin"}))  # the raw client is ANONYMOUS
    response = await exchange(broker, hooks, alter_request(3, 5000.0), ALTER_CLIENT_QUOTAS_KEY)
    assert [(e.error_code, e.error_message) for e in response.entries] == [(CLUSTER_AUTHORIZATION_FAILED, MESSAGE)]
    assert [(e.entity_type, e.entity_name) for e in response.entries[0].entity] == [("user", "alice")]
    assert quota_file.stored == []
    assert quota_file.refusals == [("AlterClientQuotas", "admin_principals")]
    described = await exchange(broker, hooks, describe_request(4), DESCRIBE_CLIENT_QUOTAS_KEY)
    assert (described.error_code, described.entries) == (CLUSTER_AUTHORIZATION_FAILED, None)


async def test_admin_principals_let_a_listed_principal_in(allowing: tuple[FakeBroker, Authorizer]) -> None:
    broker, _authorizer = allowing
    quota_file = QuotaFile()
    hooks = quota_file.hooks(admin_principals=frozenset({"User:ANONYMOUS"}))
    response = await exchange(broker, hooks, alter_request(3, 5000.0), ALTER_CLIENT_QUOTAS_KEY)
    assert [e.error_code for e in response.entries] == [0]
    assert len(quota_file.stored) == 1


async def test_a_describe_the_brokers_refuse_gets_their_answer(refusing: tuple[FakeBroker, Authorizer]) -> None:
    broker, _authorizer = refusing
    quota_file = QuotaFile()
    response = await exchange(broker, quota_file.hooks(), describe_request(5), DESCRIBE_CLIENT_QUOTAS_KEY)
    assert (response.error_code, response.error_message, response.entries) == (
        CLUSTER_AUTHORIZATION_FAILED, MESSAGE, None)
    assert quota_file.refusals == [("DescribeClientQuotas", "broker authorizer")]


async def test_an_allowed_describe_shows_the_proxys_quotas(allowing: tuple[FakeBroker, Authorizer]) -> None:
    broker, _authorizer = allowing
    quota_file = QuotaFile()
    response = await exchange(broker, quota_file.hooks(), describe_request(5), DESCRIBE_CLIENT_QUOTAS_KEY)
    assert response.error_code == 0
    assert [([(e.entity_type, e.entity_name) for e in entry.entity], [(v.key, v.value) for v in entry.values])
            for entry in response.entries] == [([("user", "alice")], [("producer_byte_rate", 1000.0)])]


async def test_a_broker_closing_the_connection_answers_nothing() -> None:
    # What a SASL listener does with a quota request sent before authentication.
    closed: list[bool] = []

    def close(header: RequestHeader, body: bytes) -> bytes | None:
        closed.append(True)
        raise ConnectionResetError  # ends the scripted broker's connection

    broker = FakeBroker(handlers={ALTER_CLIENT_QUOTAS_KEY: close})
    await broker.start()
    quota_file = QuotaFile()
    proxy = await start_proxy(broker, quota_file.hooks())
    client = await RawClient.connect(proxy.bootstrap_port)
    client.send(alter_request(3, 99999999.0))
    assert await client.closed_by_peer()
    assert closed == [True] and quota_file.stored == []
    client.close()
    await proxy.stop()
    await broker.stop()
