"""The advice, proven on the wire: capture -> advise -> live reload -> the same traffic again.

One real broker behind `kqp serve` (capture on, no quota yet), five producers at fixed rates:
three quiet ones and two noisy ones that together push NW_IN past the capacity file's limit.
`advise` runs on that capture; its quotas.yaml is copied over the proxy's quota file, which the
running proxy reloads; the same traffic runs again and `analyze` reads the second capture.

Run twice, once per resolution the advice can be judged at, and the second run judged at the
same one: advise's default, buckets of the quota window (here 2 x 1 s, so the p99 of 2 s
buckets, counted from the capture), where Kafka holds a throttled client to its quota and the
advice is the plain fair share; and the p99 of 1 s buckets (analyze's headroom, on a 15 s run its
busiest second). Kafka throttles after the fact over its quota window, so a throttled producer
still bursts above its quota within a second (measured: up to 2.3x the quota with this 2 x 1 s
window, in bursts that grow over the run); at 1 s advise plans for that burst (advice_math's
burst_factor = window / bucket), which is what lets the 1 s figure hold (docs/replay.md, advise).
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.dataset as ds
import pytest

from harness.local_kafka import KafkaCluster
from harness.proxy_process import ProxyProcess
from kqp.spark_jobs.advise import AdviseOptions, run_advise
from kqp.spark_jobs.analyze import AnalyzeOptions, run_analyze
from kqp.spark_jobs.common import Progress
from tests.integration.helpers.kafka_throttles import throttles_differing_from_kafkas

pytestmark = pytest.mark.spark

TOPIC = "advised-traffic"
MESSAGE_BYTES = 10_000
RUN_SECONDS = 15
QUIET = {"quiet-a": 100_000, "quiet-b": 100_000, "quiet-c": 100_000}  # bytes/s offered
NOISY = {"noisy-a": 800_000, "noisy-b": 800_000}
# 1,500 KB/s x 0.8 = 1.2 MB/s of NW_IN: the quiet three (0.3 MB/s) fit, the noisy two do not.
CAPACITY = {
    "brokerCapacities": [
        {"brokerId": "-1", "capacity": {"DISK": "100000", "CPU": "100", "NW_IN": "1500", "NW_OUT": "100000"}}
    ]
}
LIMIT = 1_500 * 1024 * 0.8
WINDOW_SECONDS = 2  # the proxy's quota window below: 2 x 1 s
# Capture files close every second, so advise can read the first run while the proxy runs; a
# 2 x 1 s quota window holds a per-second statistic (docs/replay.md, advise).
BASE_YAML = "capture:\n  rotate_seconds: 1\n"
NO_QUOTAS_YAML = "quotas:\n  window_num: 2\n  window_size_seconds: 1\n  entries: []\n"


class TwoFileProxy(ProxyProcess):
    """`kqp serve --config base.yaml --config quotas.yaml --capture-dir DIR`."""

    def __init__(self, upstream: str, log_path: Path, configs: list[Path], capture: Path) -> None:
        super().__init__(upstream, log_path)
        self.extra = [argument for config in configs for argument in ("--config", str(config))]
        self.extra += ["--capture-dir", str(capture)]

    def command(self) -> list[str]:
        return [*super().command(), *self.extra]


def run_traffic(bootstrap: str, topic: str) -> tuple[int, int]:
    """Every producer at its rate for RUN_SECONDS; returns the window (start_us, end_us)."""
    from confluent_kafka import Producer

    start = time.time()
    errors: list[str] = []

    def produce(client_id: str, rate: int) -> None:
        producer = Producer({"bootstrap.servers": bootstrap, "client.id": client_id})
        payload = b"x" * MESSAGE_BYTES
        sent = 0
        while (elapsed := time.time() - start) < RUN_SECONDS:
            due = int(elapsed * rate / MESSAGE_BYTES) + 1
            while sent < due:
                producer.produce(topic, payload, on_delivery=lambda e, _m: e and errors.append(str(e)))
                sent += 1
            producer.poll(0.01)
        # What a throttled producer still holds is not part of the measured window.
        producer.purge(in_queue=True, in_flight=False)
        producer.flush(10)

    threads = [threading.Thread(target=produce, args=item) for item in {**QUIET, **NOISY}.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not [e for e in errors if "Purged" not in e], errors[:5]
    return int(start * 1e6), int((start + RUN_SECONDS) * 1e6)


def produced_per_second(capture: Path, window: tuple[int, int]) -> pd.Series:
    rows = ds.dataset(str(capture), format="parquet", partitioning="hive").to_table().to_pandas()
    rows = rows[(rows["ts_request_received_us"] >= window[0]) & (rows["ts_request_received_us"] < window[1])]
    return rows[rows["api_key"] == 0].groupby("client_id")["request_bytes"].sum() / RUN_SECONDS


def wait_for_capture(capture: Path, after_us: int, timeout_s: float = 20.0) -> None:
    """Until a closed capture file holds a request from after `after_us` (files close every second)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            rows = ds.dataset(str(capture), format="parquet", partitioning="hive").to_table(
                columns=["ts_request_received_us"]
            )
            if len(rows) and rows["ts_request_received_us"].to_pandas().max() >= after_us:
                return
        except Exception:  # a file being renamed into place
            pass
        time.sleep(0.5)
    raise AssertionError(f"no capture file with requests after {after_us} in {timeout_s} s")


def nw_in_per_second(capture: Path, window: tuple[int, int], warm_up_s: int = WINDOW_SECONDS) -> pd.Series:
    """NW_IN (every request's bytes: one broker, replication factor 1) per whole second inside
    the run, less its first quota window, as advise's verification judges its replay: the
    producers were idle between the runs, so their sensors hold nothing and each may send a
    window's allowance at once when it starts (measured: 820 KB in one second against a 462 KB/s
    quota), which a running cluster's warm sensors do not let through. warm_up_s=0 keeps it
    (printed beside)."""
    rows = ds.dataset(str(capture), format="parquet", partitioning="hive").to_table().to_pandas()
    seconds = rows["ts_request_received_us"] // 1_000_000
    first, last = -(-(window[0] + warm_up_s * 1_000_000) // 1_000_000), window[1] // 1_000_000
    inside = rows[(seconds >= first) & (seconds < last)]
    return inside.groupby(seconds[inside.index])["request_bytes"].sum().reindex(range(first, last), fill_value=0)


def nw_in_at_window_p99(per_second: pd.Series) -> float:
    """NW_IN at the p99 of the quota window's buckets, as advise judges it: only the buckets
    wholly inside `per_second` (nw_in_per_second)."""
    first, last = int(per_second.index[0]), int(per_second.index[-1]) + 1
    full = range(-(-first // WINDOW_SECONDS), last // WINDOW_SECONDS)
    per_bucket = per_second.groupby(per_second.index // WINDOW_SECONDS).sum().reindex(full, fill_value=0)
    return float(np.percentile(per_bucket / WINDOW_SECONDS, 99))


def window_buckets_at_both_alignments(per_second: pd.Series) -> tuple[float, float]:
    """The busiest 2 s bucket of NW_IN, with buckets starting on even and on odd seconds."""
    values = per_second.to_numpy()
    pairs = (values[:-1] + values[1:]) / WINDOW_SECONDS
    starts = per_second.index[:-1]
    return float(pairs[starts % 2 == 0].max()), float(pairs[starts % 2 == 1].max())


def advised_quotas(advice: Any) -> dict[tuple[str | None, str | None], float]:
    """The advice's producer_byte_rate entries as the reference's (user, client-id) entities."""
    quotas: dict[tuple[str | None, str | None], float] = {}
    for row in advice.tables["entries"].itertuples(index=False):
        value = row.producer_byte_rate
        if value is None or pd.isna(value):
            continue
        parts = dict(part.strip().split("=", 1) for part in str(row.entity).split(","))
        quotas[(parts.get("user"), parts.get("client-id"))] = float(value)
    return quotas


@pytest.mark.parametrize("resolution", ["window", "1s"])
def test_the_advice_holds_on_real_kafka(spark: Any, kafka: KafkaCluster, tmp_path: Path, resolution: str) -> None:
    topic = f"{TOPIC}-{resolution}"
    kafka.create_topic(topic, partitions=1, replication=1)
    base, quotas, capture = tmp_path / "base.yaml", tmp_path / "quotas.yaml", tmp_path / "capture"
    base.write_text(BASE_YAML)
    quotas.write_text(NO_QUOTAS_YAML)
    (tmp_path / "capacity.json").write_text(json.dumps(CAPACITY))
    proxy = TwoFileProxy(kafka.bootstrap, tmp_path / "proxy.log", [base, quotas], capture)
    proxy.start()
    try:
        first = run_traffic(proxy.bootstrap, topic)
        wait_for_capture(capture, first[1] - 2_000_000)
        first_rates = produced_per_second(capture, first)

        options = AdviseOptions(
            capture=str(capture),
            capacity=str(tmp_path / "capacity.json"),
            output=str(tmp_path / "advice"),
            replication_factor=1,
            current=str(quotas),  # the proxy's quota file: its 2 x 1 s window
            headroom_resolution=resolution,
        )
        advice = run_advise(spark, options, Progress("advise", 9))
        print(json.dumps(advice.summary["rounds"], indent=1))
        print(advice.tables["advice"].to_string())
        assert advice.summary["fits"], advice.summary["unmet"]
        table = advice.tables["advice"].set_index("entity")
        limited = set(table.index[table["limited"]])
        assert limited == {f"client-id={name}" for name in NOISY}
        quota = {name: table.loc[f"client-id={name}", "quota_bytes_per_s"] for name in NOISY}

        # Live reload: the running proxy picks the advised file up.
        shutil.copyfile(tmp_path / "advice" / "quotas.yaml", quotas)
        deadline = time.monotonic() + 30
        while "config reloaded" not in (tmp_path / "proxy.log").read_text():
            assert time.monotonic() < deadline, proxy.log_tail()
            time.sleep(0.2)

        second = run_traffic(proxy.bootstrap, topic)
        wait_for_capture(capture, second[1] - 2_000_000)
    finally:
        assert proxy.stop() == 0

    analyzed = run_analyze(
        spark,
        AnalyzeOptions(
            capture=str(capture),
            output=str(tmp_path / "analyze"),
            capacity=str(tmp_path / "capacity.json"),
            replication_factor=1,
            start_us=second[0],
            end_us=second[1],
            headroom_resolution="1s",
        ),
        Progress("analyze", 9),
    )
    analyzed.release()
    headroom = [row for row in analyzed.summary["headroom"]["rows"] if row["resource"] == "NW_IN"]
    per_second = nw_in_per_second(capture, second)
    busiest = (
        max(row["load_bytes_per_s"] for row in headroom)
        if resolution == "1s"
        else nw_in_at_window_p99(per_second)
    )
    shares = analyzed.tables["shares"].query("dimension == 'client_id'").set_index("entity")
    second_rates = shares["produce_bytes"] / RUN_SECONDS
    report = {
        "limit": LIMIT,
        "resolution": resolution,
        "nw_in_p99_after": busiest,
        "nw_in_1s_p99_after": max(row["load_bytes_per_s"] for row in headroom),
        "nw_in_window_p99_after_with_start": nw_in_at_window_p99(nw_in_per_second(capture, second, warm_up_s=0)),
        "nw_in_window_busiest_even_odd_after": window_buckets_at_both_alignments(per_second),
        "nw_in_mean_after": float(per_second.mean()),
        "quota": quota,
        "first": first_rates.to_dict(),
        "second": second_rates.to_dict(),
    }
    print(json.dumps(report, indent=1))

    # Kafka's arithmetic, exactly: every throttle of the second run is the one a broker holding
    # the advised quotas would have answered (the charges and instants the proxy used, replayed
    # through kqpsim's reference apart from kqp.quotas). Phase and load cannot move this.
    rows = ds.dataset(str(capture), format="parquet", partitioning="hive").to_table().to_pylist()
    compared, differences = throttles_differing_from_kafkas(
        rows, advised_quotas(advice), window_num=WINDOW_SECONDS,
        charged=lambda row: row["ts_response_received_us"] is not None and row["ts_response_received_us"] >= second[0],
    )
    print(f"the second run's {compared} Produce responses against Kafka's arithmetic: {len(differences)} differ")
    assert compared > 100 and not differences, (compared, differences[:20])

    if resolution == "1s":
        # At 1 s the advice planned for the burst Kafka lets a throttled client make within its
        # window (burst factor = window / bucket), so the busiest second stays under the limit.
        assert busiest <= LIMIT * 1.10, report
    else:
        # At the window's own length the advice is the plain fair share: it fills the limit, and
        # Kafka's windowed rate lets a throttled client catch up whenever its oldest sample
        # expires (a run of unthrottled requests), so where a 2 s bucket starts moves its figure:
        # one run read 100.6 % of the limit on buckets starting on even seconds and 111.7 % on
        # odd ones, the throttles exactly Kafka's. What phase cannot move is the load averaged
        # over the run past its first window: the catch-ups only return what the throttles held
        # back. (docs/replay.md, "At the default resolution on the wire".)
        assert report["nw_in_mean_after"] <= LIMIT * 1.10, report
    for name in QUIET:
        assert second_rates[name] == pytest.approx(first_rates[name], rel=0.05), report
    for name in NOISY:
        assert first_rates[name] > quota[name] * 1.5, report  # they were noisy
        assert second_rates[name] == pytest.approx(quota[name], rel=0.10), report
