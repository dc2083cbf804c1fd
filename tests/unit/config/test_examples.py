"""Every shipped example, and the README's example, is a valid configuration."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from kqp.config import load_config
from kqp.config.check import check_config_command

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((REPO / "config").glob("*.yaml"))


def test_the_examples_are_there() -> None:
    names = {path.name for path in EXAMPLES}
    assert {"minimal.yaml", "quotas.yaml", "split-listener.yaml", "split-quotas.yaml", "sasl.yaml", "sni.yaml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.name)
def test_example_loads(path: Path) -> None:
    config = load_config([path])
    raw = yaml.safe_load(path.read_text())
    # The loaded entries are the ones written in the file, none dropped on the way.
    assert len(config.quota_settings().entries) == len(raw.get("quotas", {}).get("entries", []))
    assert (config.upstream is not None) == ("upstream" in raw)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.name)
def test_example_passes_check_config(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert check_config_command([str(path)]) == 0
    assert capsys.readouterr().err == ""


def test_split_example_combines_listener_and_quotas() -> None:
    config = load_config([REPO / "config/split-listener.yaml", REPO / "config/split-quotas.yaml"])
    assert config.proxy.node_ports == {1001: 9301}
    assert config.upstream is not None and len(config.upstream.bootstrap_servers) == 3
    assert config.quotas.scope == "cluster"


def test_quotas_example_shows_every_quota_feature() -> None:
    q = load_config([REPO / "config/quotas.yaml"]).quotas
    set_keys = {key for entry in q.entries for key in entry.limits()}
    assert set_keys == {"producer_byte_rate", "consumer_byte_rate", "request_percentage", "controller_mutation_rate"}
    assert any(entry.dry_run for entry in q.entries)
    assert any(entry.scope is not None for entry in q.entries)
    assert {"<default>", "10.0.0.12"} <= {entry.ip for entry in q.ip_entries}
    levels = {(entry.entity.user is not None, entry.entity.client_id is not None) for entry in q.entries}
    assert levels == {(True, True), (True, False), (False, True)}


def test_readme_example_loads(tmp_path: Path) -> None:
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", readme, flags=re.DOTALL)
    assert len(blocks) == 1, "expected exactly one YAML block in README.md"
    path = tmp_path / "readme.yaml"
    path.write_text(blocks[0])
    config = load_config([path])
    assert config.upstream is not None
    assert config.upstream.addresses() == (("kafka-1", 9092), ("kafka-2", 9092))
    assert len(config.quotas.entries) == 2
