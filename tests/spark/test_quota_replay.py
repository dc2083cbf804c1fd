"""The replay scheduler (pure): open loop vs deferral, and quota grouping."""

from __future__ import annotations

import pandas as pd

from kqp.protocol.api_keys import ApiKey
from kqp.quotas import DEFAULT_ENTITY, QuotaEngine, QuotaEntity, QuotaEntry, QuotaSettings
from kqp.quotas.recording import (
    QuotaClient,
    RequestCharges,
    RequestOutcome,
    ResponseCharges,
    charge_request,
    charge_response,
    exchange_throttle,
    request_charges,
    response_charges,
)
from kqp.spark_jobs.quota_replay import charged_inputs, is_recorded, quota_groups, replay_group, replay_recorded


def requests(rows: list[tuple[int, int]]) -> pd.DataFrame:
    """(ts_ms, connection_id) rows of Produce requests of 100 bytes by one client."""
    return pd.DataFrame(
        {
            "ts_ms": [ts for ts, _ in rows],
            "connection_id": [c for _, c in rows],
            "broker": 0,
            "principal": "a",
            "client_id": "c",
            "api_key": 0,
            "nbytes": 100,
            "request_time_ms": 1.0,
        }
    )


def throttle_early_requests(calls: list[tuple[int, int]]):  # type: ignore[no-untyped-def]
    """500 ms for requests reaching the engine before t=150, none later."""

    def throttle(api_key, broker, principal, client_id, nbytes, request_ms, now_ms):  # type: ignore[no-untyped-def]
        calls.append((now_ms, nbytes))
        return 500.0 if now_ms < 150 else 0.0

    return throttle


def test_open_loop_keeps_recorded_times() -> None:
    calls: list[tuple[int, int]] = []
    result = replay_group(requests([(0, 1), (100, 1), (2_000, 1)]), throttle_early_requests(calls), "open_loop")
    assert list(result["sim_ts_ms"]) == [0, 100, 2_000]
    assert list(result["sim_throttle_ms"]) == [500.0, 500.0, 0.0]
    assert [now for now, _ in calls] == [0, 100, 2_000]


def test_deferral_shifts_the_rest_of_the_connection_only() -> None:
    calls: list[tuple[int, int]] = []
    frame = requests([(0, 1), (100, 1), (300, 1), (50, 2)])
    result = replay_group(frame, throttle_early_requests(calls), "deferral").set_index(["connection_id", "ts_ms"])
    # Connection 1: throttled 500 ms at t=0, so its next request (recorded at 100) goes at 600,
    # and the one after keeps its 200 ms gap (800).
    assert result.loc[(1, 100), "sim_ts_ms"] == 600
    assert result.loc[(1, 300), "sim_ts_ms"] == 800
    # Connection 2 is not held back by connection 1's throttle; it gets its own.
    assert result.loc[(2, 50), "sim_ts_ms"] == 50
    assert result.loc[(2, 50), "sim_throttle_ms"] == 500.0
    assert result.loc[(1, 100), "sim_throttle_ms"] == 0.0
    # The engine saw the requests in simulated time order.
    assert [now for now, _ in calls] == sorted(now for now, _ in calls)


def _interleaved_produce(seed: int) -> pd.DataFrame:
    """Three connections of one client, 10 KB Produce requests 20 ms apart on each, offset
    by a few ms: 300 KB/s against the 100 KB/s quota of `_produce_quota`."""
    rows = [(connection * 7 + 20 * step, connection) for step in range(100) for connection in (1, 2, 3)]
    frame = requests(rows)
    frame["nbytes"] = 10_000
    frame["request_time_ms"] = float("nan")  # acks=0-like rows: no response time charged
    return frame.sample(frac=1.0, random_state=seed).reset_index(drop=True)


def _produce_quota() -> QuotaSettings:
    entry = QuotaEntry(QuotaEntity(client_id=DEFAULT_ENTITY), {"producer_byte_rate": 100_000.0})
    return QuotaSettings(entries=(entry,))


def test_deferral_through_the_engine_depends_on_the_rows_not_their_order() -> None:
    """The same rows in two orders give the same simulated times and throttles: the replay
    sorts them by (recorded time, connection) before anything reaches the engine."""
    from kqp.spark_jobs.whatif import engine_throttle_function

    first = replay_group(_interleaved_produce(1), engine_throttle_function(_produce_quota()), "deferral")
    second = replay_group(_interleaved_produce(2), engine_throttle_function(_produce_quota()), "deferral")
    pd.testing.assert_frame_equal(first, second)
    assert list(first.index) == list(range(len(first)))
    assert list(first["ts_ms"]) == sorted(first["ts_ms"])
    # Over quota threefold: throttled, and every connection pushed later than recorded.
    assert (first["sim_throttle_ms"] > 0).sum() > 50
    assert (first.groupby("connection_id")["sim_ts_ms"].max() > first.groupby("connection_id")["ts_ms"].max()).all()


def test_the_engine_throttle_decides_as_a_generic_callable_of_it() -> None:
    """The replay calls whatif's EngineThrottle directly (no generic call); wrapped in a plain
    function, which takes the generic path, it gives the same replay."""
    from kqp.spark_jobs.whatif import engine_throttle_function

    direct = replay_group(_interleaved_produce(3), engine_throttle_function(_produce_quota()), "deferral")
    engine_throttle = engine_throttle_function(_produce_quota())
    calls: list[int] = []

    def wrapped(api_key, broker, principal, client_id, nbytes, request_ms, now_ms):  # type: ignore[no-untyped-def]
        calls.append(now_ms)
        return engine_throttle(api_key, broker, principal, client_id, nbytes, request_ms, now_ms)

    generic = replay_group(_interleaved_produce(3), wrapped, "deferral")
    pd.testing.assert_frame_equal(direct, generic)
    assert len(calls) == len(direct)
    assert calls == sorted(calls)


def test_quota_groups_link_shared_users_and_client_ids() -> None:
    groups = quota_groups([("a", "x"), ("a", "y"), ("b", "y"), ("c", "z")])
    assert groups[("a", "x")] == groups[("b", "y")]
    assert groups[("c", "z")] != groups[("a", "x")]


def test_quota_groups_only_link_what_the_config_shares() -> None:
    pairs = [("a", "x"), ("a", "y"), ("b", "y"), ("c", "z")]
    # Client-id quotas only: users of one client-id share, a user's client-ids do not.
    by_client = quota_groups(pairs, link_users=False, link_client_ids=True)
    assert by_client[("a", "y")] == by_client[("b", "y")]
    assert by_client[("a", "x")] != by_client[("a", "y")]
    # (user, client-id) quotas only: every pair alone.
    alone = quota_groups(pairs, link_users=False, link_client_ids=False)
    assert len(set(alone.values())) == len(pairs)


# ---- capture v2: the proxy's own engine inputs, replayed call by call ---------------------

RECORDED_QUOTAS = QuotaSettings(
    entries=(
        QuotaEntry(QuotaEntity(None, DEFAULT_ENTITY), {"producer_byte_rate": 100, "controller_mutation_rate": 1}),
    ),
    scope="cluster",
)


def _recorded_row(**fields: object) -> dict[str, object]:
    row: dict[str, object] = {
        "connection_id": 1,
        "broker": 1,
        "principal": "u",
        "client_id": "c",
        "api_key": 0,
        "api_version": 9,
        "acks": -1,
        "mutations": None,
        "quota_broker": "1",
        "quota_request_seq": None,
        "quota_request_now_ms": None,
        "quota_response_seq": None,
        "quota_response_now_ms": None,
        "quota_produce_bytes": None,
        "quota_fetch_bytes": None,
        "quota_request_time_ms": None,
    }
    row.update(fields)
    return row


def test_a_recorded_capture_replays_the_proxys_decisions_in_its_call_order() -> None:
    # What the proxy did, in the order of its engine calls: two Produce responses read in one
    # event-loop iteration (same clock), a CreateTopics charged on arrival, an acks=0 Produce,
    # then the CreateTopics' response. The wall-clock order (ts_ms) differs from the engine's.
    calls = [
        ("B", "response", 1_000.25, ResponseCharges(0, produce_bytes=1_500, request_time_ms=2.0)),
        ("A", "response", 1_000.25, ResponseCharges(0, produce_bytes=1_000, request_time_ms=1.0)),
        ("D", "request", 1_200.5, request_charges(19, 7, 60, True, [("t1", 30), ("t2", 1)])),
        ("C", "request", 1_500.75, request_charges(0, 9, 800, expects_response=False)),
        ("D", "response", 1_700.0, ResponseCharges(19, request_time_ms=499.25)),
    ]
    proxy = QuotaEngine(RECORDED_QUOTAS)
    decided: dict[str, float] = {}
    rows = {
        "A": _recorded_row(ts_ms=5_000, connection_id=1),
        "B": _recorded_row(ts_ms=5_001, connection_id=2, broker=2, quota_broker="2"),
        "C": _recorded_row(ts_ms=5_400, connection_id=1, acks=0),
        "D": _recorded_row(
            ts_ms=5_300,
            connection_id=3,
            api_key=19,
            api_version=7,
            mutations=[{"topic": "t1", "partitions": 30}, {"topic": "t2", "partitions": 1}],
        ),
    }
    outcomes: dict[str, RequestOutcome] = {}
    for seq, (name, phase, now, charges) in enumerate(calls, start=1):
        row, client = rows[name], QuotaClient(str(rows[name]["quota_broker"]), "u", "c")
        if phase == "request":
            assert isinstance(charges, RequestCharges)
            outcomes[name] = charge_request(proxy, client, charges, now)
            throttle = outcomes[name].throttle_ms
            row.update(quota_request_seq=seq, quota_request_now_ms=now)
            if charges.produce_bytes is not None:
                row["quota_produce_bytes"] = charges.produce_bytes
        else:
            assert isinstance(charges, ResponseCharges)
            # As the proxy decides: the request's (time-adjusted) throttle against the response's.
            throttle = exchange_throttle(outcomes.get(name), charge_response(proxy, client, charges, now), now)
            row.update(
                quota_response_seq=seq,
                quota_response_now_ms=now,
                quota_produce_bytes=charges.produce_bytes,
                quota_request_time_ms=charges.request_time_ms,
            )
        decided[name] = float(throttle)
    frame = pd.DataFrame(list(rows.values()), index=list(rows)).sample(frac=1.0, random_state=3)
    assert is_recorded(frame)

    replayed = replay_recorded(frame, QuotaEngine(RECORDED_QUOTAS))

    by_ts = dict(zip(replayed["ts_ms"], replayed["sim_throttle_ms"], strict=True))
    assert {name: by_ts[row["ts_ms"]] for name, row in rows.items()} == decided
    assert decided["A"] > decided["B"] > 0 and decided["D"] > 0 and decided["C"] > 0
    # The order matters: the same two responses charged in wall-clock order (A, then B)
    # would have given other throttles, so a replay sorted by ts_ms could not agree.
    wall_order = QuotaEngine(RECORDED_QUOTAS)
    first = charge_response(wall_order, QuotaClient("1", "u", "c"), ResponseCharges(0, produce_bytes=1_000), 1_000.25)
    second = charge_response(wall_order, QuotaClient("2", "u", "c"), ResponseCharges(0, produce_bytes=1_500), 1_000.25)
    assert (first, second) != (decided["A"], decided["B"])


def test_rows_without_recorded_inputs_are_not_replayed_exactly() -> None:
    frame = pd.DataFrame([_recorded_row(ts_ms=1), _recorded_row(ts_ms=2, quota_broker=None)])
    assert not is_recorded(frame)
    assert not is_recorded(frame.drop(columns=["quota_broker"]))


# ---- the charges of each row: recorded ones copied, the others by the proxy's rule -------------


def test_charged_inputs_apply_the_proxys_response_rule_to_every_row() -> None:
    """Every branch of kqp.quotas.recording.response_charges, against the rule called by hand on
    the sizes the proxy would have passed (frame less size prefix and response header), and a
    recorded row whose charges are taken as recorded."""
    nan = float("nan")
    rows = [
        # api_key, version, request_bytes, response_bytes, round_trip_ms, fetch_max_wait_ms
        (ApiKey.PRODUCE, 9, 1_004, 60.0, 3.5, nan),
        (ApiKey.PRODUCE, 9, 1_004, nan, nan, nan),  # acks=0: no response
        (ApiKey.FETCH, 11, 80, 5_000.0, 620.0, 500.0),  # long poll: its wait is not counted
        (ApiKey.FETCH, 12, 80, 5_000.0, 120.0, 500.0),  # flexible: one more header byte
        (ApiKey.FETCH, 12, 80, 5_000.0, 620.0, 0.0),  # no wait asked
        (ApiKey.FETCH, 12, 80, 5_000.0, 620.0, nan),  # wait not read
        (ApiKey.SHARE_FETCH, 0, 80, 3_000.0, 700.0, 500.0),  # flexible in every version
        (ApiKey.SASL_AUTHENTICATE, 2, 40, 30.0, 9.0, nan),  # the authenticator's time is free
        (ApiKey.METADATA, 12, 40, 300.0, 2.25, nan),
    ]
    columns = ["api_key", "api_version", "request_bytes", "response_bytes", "round_trip_ms", "fetch_max_wait_ms"]
    # The last row was recorded by the proxy (capture v2): its charges are taken as they are.
    recorded = (ApiKey.FETCH, 12, 80, 9_999.0, 1.0, nan)
    frame = pd.DataFrame([*rows, recorded], columns=columns)
    frame["quota_broker"] = [None] * len(rows) + ["1"]
    frame["quota_produce_bytes"] = [None] * (len(rows) + 1)
    frame["quota_fetch_bytes"] = [None] * len(rows) + [777]
    frame["quota_request_time_ms"] = [None] * len(rows) + [0.5]
    charged = charged_inputs(frame)
    for index, (api_key, version, request_bytes, response_bytes, round_trip, wait) in enumerate(rows):
        header = 4 + 4 + (api_key == ApiKey.SHARE_FETCH or (api_key == ApiKey.FETCH and version >= 12))
        body = None if response_bytes != response_bytes else int(response_bytes) - header
        expected = response_charges(
            api_key,
            request_bytes - 4,
            body,
            None if round_trip != round_trip else round_trip,
            None if wait != wait else int(wait),
        )
        charged_bytes = expected.produce_bytes if expected.produce_bytes is not None else expected.fetch_bytes
        assert charged["nbytes"].iat[index] == (charged_bytes or 0), rows[index]
        took = charged["request_time_ms"].iat[index]
        if expected.request_time_ms is None:
            assert took != took, rows[index]
        else:
            assert took == expected.request_time_ms, rows[index]
    assert charged["nbytes"].iat[-1] == 777
    assert charged["request_time_ms"].iat[-1] == 0.5
