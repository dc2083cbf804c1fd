"""The replay scheduler (pure): open loop vs deferral, and quota grouping."""

from __future__ import annotations

import pandas as pd

from kqp.spark_jobs.quota_replay import quota_groups, replay_group


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
