"""Acceptance (issue 28): a quota file with comments and blank lines, altered through Kafka's
own `kafka-configs` (ConfigCommand) against the proxy, differs from the original only in the
altered value and the entry's origin stamp.

The stamp is the `origin` key the proxy adds to an entry it wrote (`kqp check-config` shows
it: who changed the entry, through which instance, when). It is part of the change, on the
changed entry alone, one line after its entity; every other byte of the file stays.
With `quotas.stamp_origin: false` there is no stamp, and the altered value is the whole diff.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.local_kafka import KafkaCluster
from harness.proxy_process import ProxyProcess

pytestmark = pytest.mark.integration

QUOTA_FILE = """\
# Quotas of the analytics cluster.
# Owner: the platform team; changes through kafka-configs are fine.

quotas:
  window_num: 11

  entries:
    # Nightly batch job.
    - entity: {client-id: batch-job}    # data-eng
      producer_byte_rate: 1048576       # 1 MiB/s
      consumer_byte_rate: 2_097_152

    # Dashboards.
    - entity: {user: "alice", client-id: 'reporting'}
      request_percentage: 50.0

# Nothing below this line.
"""


UNSTAMPED_FILE = QUOTA_FILE.replace("  window_num: 11\n", "  window_num: 11\n  stamp_origin: false\n")


@pytest.fixture
def proxy_with_quota_file(kafka_1node: KafkaCluster, tmp_path: Path,
                          request: pytest.FixtureRequest) -> Iterator[tuple[ProxyProcess, Path]]:
    path = tmp_path / "quotas.yaml"
    path.write_text(getattr(request, "param", QUOTA_FILE))
    proxy = ProxyProcess(kafka_1node.bootstrap, tmp_path / "proxy.log", config=path)
    proxy.start()
    try:
        yield proxy, path
    finally:
        code = proxy.stop()
        assert code == 0, f"proxy exit code {code}:\n{proxy.log_tail()}"


def config_command(cluster: KafkaCluster, bootstrap: str, *args: str) -> str:
    return cluster.run_tool("kafka.admin.ConfigCommand", "--bootstrap-server", bootstrap, *args).stdout


def alter_batch_job(cluster: KafkaCluster, proxy: ProxyProcess) -> None:
    """kafka-configs through the proxy: batch-job's producer_byte_rate from 1 MiB/s to 2 MiB/s."""
    config_command(cluster, proxy.bootstrap, "--alter", "--add-config", "producer_byte_rate=2097152",
                   "--entity-type", "clients", "--entity-name", "batch-job")


def test_kafka_configs_changes_only_the_altered_value_and_its_stamp(
    kafka_1node: KafkaCluster, proxy_with_quota_file: tuple[ProxyProcess, Path]
) -> None:
    proxy, path = proxy_with_quota_file
    alter_batch_job(kafka_1node, proxy)

    after = path.read_text()
    diff = [line for line in difflib.ndiff(QUOTA_FILE.splitlines(), after.splitlines()) if line[:1] in "+-"]
    assert len(diff) == 3, "\n".join(diff)
    stamp, removed, added = diff
    assert re.fullmatch(r"\+       origin: AlterClientQuotas from (User:)?ANONYMOUS \(127\.0\.0\.1:\d+\) "
                        r"at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", stamp), stamp
    assert removed == "-       producer_byte_rate: 1048576       # 1 MiB/s"
    assert added == "+       producer_byte_rate: 2097152       # 1 MiB/s"
    # The stamp sits in the changed entry, right after its entity line.
    assert "    - entity: {client-id: batch-job}    # data-eng\n      origin: AlterClientQuotas" in after

    # The proxy reloaded the file it wrote: Kafka's tool reads the new value back, the rest unchanged.
    described = config_command(kafka_1node, proxy.bootstrap, "--describe", "--entity-type", "clients",
                               "--entity-name", "batch-job")
    assert "producer_byte_rate=2097152.0" in described and "consumer_byte_rate=2097152.0" in described, described


@pytest.mark.parametrize("proxy_with_quota_file", [UNSTAMPED_FILE], indirect=True)
def test_without_origin_stamps_kafka_configs_changes_only_the_altered_value(
    kafka_1node: KafkaCluster, proxy_with_quota_file: tuple[ProxyProcess, Path]
) -> None:
    proxy, path = proxy_with_quota_file
    alter_batch_job(kafka_1node, proxy)
    after = path.read_text()
    assert [line for line in difflib.ndiff(UNSTAMPED_FILE.splitlines(), after.splitlines()) if line[:1] in "+-"] == [
        "-       producer_byte_rate: 1048576       # 1 MiB/s",
        "+       producer_byte_rate: 2097152       # 1 MiB/s",
    ]
