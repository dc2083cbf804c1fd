"""The Spark jobs on a real Spark cluster: a standalone master and one worker from the pyspark
distribution, on loopback, and `spark-submit --master spark://... --py-files kqp.zip`.

The same capture goes through `spark-submit --master local[*]`: both summary.json files must hold
the same figures (the generation time aside), and no stage may run more tasks than the small
capture calls for (Spark's default of 200 shuffle partitions would schedule mostly empty tasks).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.local_kafka import free_ports
from kqp.spark_jobs.cli import write_package_zip
from kqp.spark_jobs.synthetic import SyntheticSpec, write_capture
from tests.spark.helpers import QUOTAS_YAML, TEST_JVM_OPTIONS

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SPEC = SyntheticSpec(requests=10_000, seconds=60, brokers=3, clients=10, principals=4, topics=5, seed=5)
WORKER_CORES = 2
# Per stage: the capture's file splits or a few shuffle partitions per core, never Spark's 200.
MAX_TASKS_PER_STAGE = 16


def spark_env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(tmp / "logs"),
        "SPARK_WORKER_DIR": str(tmp / "work"),
        # Driver and executors run this interpreter (pandas, pyarrow, numpy); kqp itself comes
        # from the zip on --py-files, which sits ahead of the editable install on sys.path.
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        # The master's and the worker's JVMs (spark-class reads it for both daemons).
        "SPARK_DAEMON_JAVA_OPTS": TEST_JVM_OPTIONS,
    })
    return env


def wait_for_line(log: Path, text: str, process: subprocess.Popen[bytes], timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in (log.read_text(errors="replace") if log.exists() else ""):
        assert process.poll() is None, f"exited {process.returncode}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {text!r} in {timeout_s:g} s:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def standalone_master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Spark standalone master and one worker on 127.0.0.1; yields the master URL."""
    tmp = tmp_path_factory.mktemp("standalone")
    env = spark_env(tmp)
    master_port, master_ui, worker_port, worker_ui = free_ports(4)
    spark_class = str(BIN / "spark-class")
    master_log, worker_log = tmp / "master.log", tmp / "worker.log"
    processes: list[subprocess.Popen[bytes]] = []
    try:
        with master_log.open("wb") as out:
            processes.append(subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                 "--port", str(master_port), "--webui-port", str(master_ui)],
                stdout=out, stderr=subprocess.STDOUT, env=env))
        wait_for_line(master_log, "New state: ALIVE", processes[0])
        url = f"spark://127.0.0.1:{master_port}"
        with worker_log.open("wb") as out:
            processes.append(subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                 "--port", str(worker_port), "--webui-port", str(worker_ui), "--cores", str(WORKER_CORES),
                 "--memory", "2g", "--work-dir", str(tmp / "work")],
                stdout=out, stderr=subprocess.STDOUT, env=env))
        wait_for_line(worker_log, "Successfully registered with master", processes[1])
        yield url
    finally:
        for process in reversed(processes):
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture(scope="module")
def small_capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("capture")
    write_capture(SPEC, directory)
    return directory


@pytest.fixture(scope="module")
def kqp_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("package") / "kqp.zip"
    write_package_zip(target)
    return target


@dataclass
class Submitted:
    summary: dict[str, Any]
    seconds: float
    tasks_per_stage: list[int]


def submit(master: str, job: str, args: list[str], kqp_zip: Path, tmp: Path) -> Submitted:
    events = tmp / "events"
    events.mkdir(parents=True)
    output = tmp / "out"
    command = [
        str(BIN / "spark-submit"), "--master", master, "--py-files", str(kqp_zip),
        "--conf", "spark.ui.enabled=false", "--conf", "spark.driver.host=127.0.0.1",
        "--conf", "spark.driver.bindAddress=127.0.0.1",
        "--driver-java-options", TEST_JVM_OPTIONS, "--conf", f"spark.executor.extraJavaOptions={TEST_JVM_OPTIONS}",
        "--conf", "spark.eventLog.enabled=true", "--conf", f"spark.eventLog.dir=file://{events}",
        "--conf", "spark.eventLog.compress=false", "--conf", "spark.eventLog.rolling.enabled=false",
        str(REPO / "kqp" / "spark_jobs" / f"{job}.py"), *args, "--output", str(output),
    ]
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=spark_env(tmp), check=False)
    seconds = time.monotonic() - started
    assert result.returncode == 0, f"{job} on {master} exited {result.returncode}:\n{result.stderr[-4000:]}"
    tasks = []
    for log in (path for path in events.rglob("*") if path.is_file()):
        for line in log.read_text().splitlines():
            event = json.loads(line)
            if event["Event"] == "SparkListenerStageCompleted":
                tasks.append(event["Stage Info"]["Number of Tasks"])
    assert tasks, "the event log recorded no stage"
    return Submitted(json.loads((output / "summary.json").read_text()), seconds, tasks)


def without_generation_time(summary: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in summary.items() if key != "generated_at"}


# Four spark-submits of a few minutes each on a busy 2-core machine: above the default 600 s.
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("job", ["analyze", "whatif"])
def test_a_standalone_cluster_gives_the_local_figures(
    job: str, standalone_master: str, small_capture: Path, kqp_zip: Path, tmp_path: Path
) -> None:
    args = [str(small_capture)]
    if job == "whatif":
        quotas = tmp_path / "quotas.yaml"
        quotas.write_text(QUOTAS_YAML)
        args += ["--quotas", str(quotas)]
    local = submit("local[*]", job, args, kqp_zip, tmp_path / "local")
    cluster = submit(standalone_master, job, args, kqp_zip, tmp_path / "cluster")
    print(f"{job}: local[*] {local.seconds:.1f} s, {standalone_master} {cluster.seconds:.1f} s "
          f"({cluster.seconds / local.seconds:.2f}x); tasks per stage: local {local.tasks_per_stage}, "
          f"cluster {cluster.tasks_per_stage}")
    assert without_generation_time(cluster.summary) == without_generation_time(local.summary)
    assert max(cluster.tasks_per_stage) <= MAX_TASKS_PER_STAGE
    assert max(local.tasks_per_stage) <= MAX_TASKS_PER_STAGE
