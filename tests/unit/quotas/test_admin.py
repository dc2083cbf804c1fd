"""DescribeClientQuotas matching (spec §9 I) and AlterClientQuotas validation (J)."""

from __future__ import annotations

import pytest

from kqp.quotas import IpQuotaEntry, QuotaEntity, QuotaEntry, QuotaSettings
from kqp.quotas.admin import (
    INVALID_REQUEST,
    MATCH_DEFAULT,
    MATCH_EXACT,
    MATCH_SPECIFIED,
    NONE,
    UNSUPPORTED_VERSION,
    FilterComponent,
    QuotaAlteration,
    QuotaOp,
    QuotaRequestError,
    apply_alterations,
    describe_quotas,
    validate_alterations,
)
from tests.unit.helpers.quotas import D

# ClientQuotasRequestTest.testDescribeClientQuotasMatchPartial's 13 entities.
FIXTURE = QuotaSettings(
    entries=tuple(
        QuotaEntry(QuotaEntity(user, client), {"request_percentage": 10.0})
        for user, client in [
            ("user-1", "client-id-1"),
            ("user-2", "client-id-1"),
            ("user-3", "client-id-2"),
            (D, "client-id-1"),
            ("user-1", D),
            ("user-3", D),
            ("user-1", None),
            ("user-2", None),
            ("user-3", None),
            (D, None),
            (None, "client-id-2"),
        ]
    ),
    ip_entries=(IpQuotaEntry("1.2.3.4", 10), IpQuotaEntry("2.3.4.5", 10)),
)


@pytest.mark.parametrize(
    ("components", "strict", "matches"),
    [
        pytest.param([FilterComponent("user", MATCH_EXACT, "user-1")], False, 3, id="I1-user-exact"),
        pytest.param([FilterComponent("user", MATCH_EXACT, "unknown")], False, 0, id="I2-unknown-user"),
        pytest.param([FilterComponent("client-id", MATCH_EXACT, "client-id-2")], False, 2, id="I3-client-exact"),
        pytest.param([FilterComponent("user", MATCH_DEFAULT)], False, 2, id="I4-default-user"),
        pytest.param([FilterComponent("user", MATCH_EXACT, "user-2")], True, 1, id="I5-strict-user"),
        pytest.param([FilterComponent("client-id", MATCH_EXACT, "client-id-1")], True, 0, id="I6-strict-client"),
        pytest.param([FilterComponent("user", MATCH_SPECIFIED)], True, 4, id="I7-strict-any-user"),
        pytest.param([FilterComponent("user", MATCH_SPECIFIED)], False, 10, id="I8-any-user"),
        pytest.param([FilterComponent("client-id", MATCH_SPECIFIED)], True, 1, id="I9-strict-any-client"),
        pytest.param([FilterComponent("client-id", MATCH_SPECIFIED)], False, 7, id="I10-any-client"),
        pytest.param([FilterComponent("ip", MATCH_SPECIFIED)], False, 2, id="I11-any-ip"),
        pytest.param([], False, 13, id="I12-empty"),
        pytest.param([], True, 0, id="I13-empty-strict"),
    ],
)
def test_client_quotas_request_test_describe_match_partial(
    components: list[FilterComponent], strict: bool, matches: int
) -> None:
    assert len(describe_quotas(FIXTURE, components, strict)) == matches


def test_describe_reports_default_entities_as_none_with_their_values() -> None:
    (found,) = describe_quotas(FIXTURE, [FilterComponent("user", MATCH_DEFAULT)], strict=True)
    assert (dict(found.entity), dict(found.values)) == ({"user": None}, {"request_percentage": 10.0})


@pytest.mark.parametrize(
    ("components", "code", "message"),
    [
        pytest.param([FilterComponent("", MATCH_SPECIFIED)], INVALID_REQUEST, "empty entity type", id="empty-type"),
        pytest.param(
            [FilterComponent("user", MATCH_SPECIFIED), FilterComponent("user", MATCH_DEFAULT)],
            INVALID_REQUEST,
            "more than once",
            id="duplicate-type",
        ),
        pytest.param([FilterComponent("group", MATCH_SPECIFIED)], UNSUPPORTED_VERSION, "Unsupported", id="unknown"),
        pytest.param([FilterComponent("user", MATCH_EXACT)], INVALID_REQUEST, "EXACT", id="exact-null"),
        pytest.param([FilterComponent("user", MATCH_DEFAULT, "x")], INVALID_REQUEST, "DEFAULT", id="default-name"),
        pytest.param(
            [FilterComponent("ip", MATCH_SPECIFIED), FilterComponent("user", MATCH_SPECIFIED)],
            INVALID_REQUEST,
            "IP filter component",
            id="ip-with-user",
        ),
    ],
)
def test_describe_rejects_bad_filters(components: list[FilterComponent], code: int, message: str) -> None:
    with pytest.raises(QuotaRequestError, match=message) as raised:
        describe_quotas(FIXTURE, components, strict=False)
    assert raised.value.error_code == code


@pytest.mark.parametrize(
    ("entity", "op", "message"),
    [
        pytest.param([("user", "")], QuotaOp("request_percentage", 12.34), "Empty user not supported", id="J1"),
        pytest.param([("client-id", "")], QuotaOp("request_percentage", 12.34), "Empty client-id not", id="J2"),
        pytest.param(
            [("", "name")], QuotaOp("request_percentage", 12.34), "Unhandled client quota entity type: ", id="J3"
        ),
        pytest.param([], QuotaOp("producer_byte_rate", 10000.5), "Invalid empty client quota entity", id="J4"),
        pytest.param([("user", "user")], QuotaOp("bad", 1.0), "Invalid configuration key bad", id="J5"),
        pytest.param(
            [("user", "user")], QuotaOp("producer_byte_rate", 10000.5), "cannot be a fractional value.", id="J6"
        ),
        pytest.param(
            [("user", "u"), ("ip", "1.2.3.4")],
            QuotaOp("request_percentage", 12.34),
            "Invalid quota entity combination",
            id="J7-user",
        ),
        pytest.param(
            [("client-id", "c"), ("ip", "1.2.3.4")],
            QuotaOp("request_percentage", 12.34),
            "Invalid quota entity combination",
            id="J7-client",
        ),
        pytest.param(
            [("ip", "RFC2606.invalid")], QuotaOp("connection_creation_rate", 50), "not a valid IP", id="J8-host"
        ),
        pytest.param([("ip", "1.2.3.4 ")], QuotaOp("connection_creation_rate", 50), "not a valid IP", id="J8-spaces"),
        pytest.param([("user", "u")], QuotaOp("request_percentage", 0), "must be greater than 0", id="zero"),
        pytest.param([("ip", None)], QuotaOp("connection_creation_rate", 2**31), "too large for an INT", id="int-max"),
        pytest.param([("ip", "1.2.3.4")], QuotaOp("request_percentage", 5), "Invalid configuration key", id="ip-key"),
    ],
)
def test_client_quotas_request_test_alter_validation_j(
    entity: list[tuple[str, str | None]], op: QuotaOp, message: str
) -> None:
    (result,) = validate_alterations([QuotaAlteration(entity, [op])])
    assert result.error_code == INVALID_REQUEST
    assert result.error_message is not None and message in result.error_message


def test_alter_accepts_valid_ops_and_flags_duplicates() -> None:
    ok = QuotaAlteration([("user", None), ("client-id", "c")], [QuotaOp("producer_byte_rate", 1024.0)])
    dup_key = QuotaAlteration([("user", "u")], [QuotaOp("request_percentage", 1), QuotaOp("request_percentage", 2)])
    results = validate_alterations([ok, dup_key, ok])
    assert [(r.error_code, r.error_message and r.error_message.split(" ")[0]) for r in results] == [
        (INVALID_REQUEST, "Ignoring"),  # the same entity twice
        (INVALID_REQUEST, "Ignoring"),
    ]
    removal = QuotaAlteration([("user", "u")], [QuotaOp("bad", 0, remove=True)])  # removals are not validated
    assert [(r.error_code, r.error_message) for r in validate_alterations([ok, removal])] == [(NONE, None)] * 2


def test_apply_alterations_sets_and_removes_quotas() -> None:
    settings = QuotaSettings(entries=(QuotaEntry(QuotaEntity("alice", None), {"request_percentage": 5.0}),))
    altered = apply_alterations(
        settings,
        [
            QuotaAlteration([("user", "alice")], [QuotaOp("request_percentage", remove=True)]),
            QuotaAlteration([("client-id", None)], [QuotaOp("producer_byte_rate", 2048)]),
            QuotaAlteration([("ip", "10.0.0.1")], [QuotaOp("connection_creation_rate", 5)]),
            QuotaAlteration([("user", "")], [QuotaOp("producer_byte_rate", 1)]),  # invalid: left out
        ],
    )
    assert altered.entries == (QuotaEntry(QuotaEntity(None, D), {"producer_byte_rate": 2048}),)
    assert altered.ip_entries == (IpQuotaEntry("10.0.0.1", 5),)
