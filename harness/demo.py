"""`make demo`: a real Kafka broker, the proxy in front of it, a workload, and what happened.

Starts a one-node KRaft broker from the jars `make kafka` assembled, starts `kqp serve` in
front of it with a producer quota on one client-id and capture on, runs Kafka's own
ProducerPerformance twice through the proxy (a quota-limited client and a free one), reads
everything back with ConsumerPerformance, then prints the achieved rates, the throttling the
proxy's /metrics endpoint reports, and a summary of the captured traffic.

It lives in the harness, not in the kqp package: the broker comes from the jars harness/pom.xml
assembles, which only a checkout has. The proxy it starts is whichever kqp `python -m kqp` finds
(the checkout in the Makefile's editable install, or an installed package). Run from the
repository root: `make demo` or `python -m harness.demo`.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from harness.local_kafka import KafkaCluster, free_ports
from harness.perf_tools import consumer_perf, producer_perf

QUOTA_BYTES_PER_S = 512 * 1024
RECORD_SIZE = 1024
TOPIC = "demo-events"


def _step(text: str) -> None:
    print(f"==> {text}", flush=True)


def _config(path: Path, upstream: str, ports: list[int], capture_dir: Path) -> None:
    path.write_text(
        f"""# Written by harness.demo
proxy:
  bootstrap_port: {ports[0]}
  node_port_base: {ports[1] - 1}
  advertised_host: 127.0.0.1
upstream:
  bootstrap_servers: ["{upstream}"]
metrics:
  port: {ports[2]}
capture:
  enabled: true
  directory: {capture_dir}
quotas:
  entries:
    - entity: {{client-id: demo-limited}}
      producer_byte_rate: {QUOTA_BYTES_PER_S}
"""
    )


def _wait_ready(url: str, proxy: subprocess.Popen[bytes], log: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proxy.poll() is not None:
            raise SystemExit(f"the proxy exited with {proxy.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"the proxy did not become ready in {timeout_s:g} s:\n{log.read_text()[-3000:]}")


def _metric_total(text: str, name: str, client_id: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and f'client_id="{client_id}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def main() -> int:
    workdir = Path(tempfile.mkdtemp(prefix="kqp-demo-"))
    _step("starting a one-node Apache Kafka 4.3 broker (KRaft) on loopback")
    with KafkaCluster(nodes=1) as cluster:
        cluster.create_topic(TOPIC, partitions=3, replication=1)
        ports = free_ports(3)
        config = workdir / "kqp.yaml"
        capture_dir = workdir / "capture"
        _config(config, cluster.bootstrap, ports, capture_dir)
        log = workdir / "kqp.log"
        _step(f"starting the proxy: kqp serve --config {config}")
        with log.open("wb") as log_file:
            proxy = subprocess.Popen([sys.executable, "-m", "kqp", "serve", "--config", str(config)],
                                     stdout=log_file, stderr=subprocess.STDOUT)
        try:
            _wait_ready(f"http://127.0.0.1:{ports[2]}/readyz", proxy, log)
            bootstrap = f"127.0.0.1:{ports[0]}"
            _step(f"proxy ready: clients bootstrap from {bootstrap}, metrics on :{ports[2]}")
            results = {}
            for client_id, records in (("demo-limited", 6000), ("demo-free", 60000)):
                _step(f"ProducerPerformance as client.id={client_id}: {records} x {RECORD_SIZE} B, no rate limit")
                results[client_id] = producer_perf(
                    cluster, bootstrap, TOPIC, records, RECORD_SIZE,
                    props={"client.id": client_id, "acks": "all", "linger.ms": "5"},
                )
            _step("ConsumerPerformance reads everything back through the proxy")
            consumed = consumer_perf(cluster, bootstrap, TOPIC, 66000, group="demo-group")
            with urllib.request.urlopen(f"http://127.0.0.1:{ports[2]}/metrics", timeout=5) as response:
                metrics = response.read().decode()
        finally:
            proxy.terminate()
            proxy.wait(timeout=30)

    print()
    print(f"Producer quota: client-id demo-limited, producer_byte_rate = {QUOTA_BYTES_PER_S / 1024:.0f} KiB/s")
    print(f"{'client.id':<14} {'records':>8} {'MiB/s':>8} {'avg ms':>8} {'p99 ms':>8} {'throttled s':>12}")
    for client_id, result in results.items():
        throttled = _metric_total(metrics, "kqp_throttle_time_seconds_total", client_id)
        print(f"{client_id:<14} {result.records:>8} {result.mb_per_s:>8.2f} {result.avg_latency_ms:>8.1f} "
              f"{result.p99_ms:>8.0f} {throttled:>12.1f}")
    print(f"consumer: {consumed.records} records read back, {consumed.mb_per_s:.2f} MiB/s")
    added = re.findall(r'^kqp_request_proxy_latency_seconds_(sum|count)\{api="Produce"\} (\S+)', metrics, re.M)
    figures = {kind: float(value) for kind, value in added}
    if figures.get("count"):
        print(f"time the proxy added to a Produce request, on average: "
              f"{figures['sum'] / figures['count'] * 1000:.3f} ms over {figures['count']:.0f} requests")
    print(f"(As on a broker, a fresh client may send up to {QUOTA_BYTES_PER_S * 10 / 2**20:.0f} MiB, the quota times"
          " 10 one-second windows, before it is throttled; over longer runs its rate converges to the quota.)")
    print()
    _step(f"kqp capture inspect {capture_dir}")
    from kqp.capture.inspect import inspect_command

    inspect_command(str(capture_dir))
    print(f"\nThe proxy's log and config are in {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
