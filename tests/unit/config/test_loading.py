"""Merging several files, defaults, immutability and the conversion into QuotaSettings."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from kqp.config import load_config
from kqp.config.loader import merge
from kqp.protocol.framing import DEFAULT_MAX_FRAME_BYTES
from kqp.quotas.settings import IpQuotaEntry, QuotaEntity, QuotaEntry, QuotaSettings


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_merge_is_deep_and_later_files_win_but_lists_replace() -> None:
    base = {"proxy": {"bootstrap_port": 1, "bind_host": "a"}, "upstream": {"bootstrap_servers": ["x:1", "y:2"]}}
    override = {"proxy": {"bootstrap_port": 2}, "upstream": {"bootstrap_servers": ["z:3"]}}
    assert merge(base, override) == {
        "proxy": {"bootstrap_port": 2, "bind_host": "a"},
        "upstream": {"bootstrap_servers": ["z:3"]},
    }
    assert base["proxy"] == {"bootstrap_port": 1, "bind_host": "a"}  # inputs untouched


def test_listener_file_plus_quota_file(tmp_path: Path) -> None:
    listener = write(tmp_path, "listener.yaml", (
        "proxy: {bootstrap_port: 19192, advertised_host: proxy.example}\n"
        "upstream: {bootstrap_servers: ['k1:9092', '[::1]:9093']}\n"
        "quotas:\n  scope: cluster\n  entries:\n    - entity: {user: old}\n      producer_byte_rate: 1\n"
    ))
    quotas = write(tmp_path, "quotas.yaml", (
        "proxy: {advertised_host: other.example}\n"
        "quotas:\n  dry_run: true\n  entries:\n    - entity: {client-id: app}\n      consumer_byte_rate: 2048\n"
    ))
    config = load_config([listener, quotas])
    assert config.proxy.bootstrap_port == 19192  # from the first file
    assert config.proxy.advertised_host == "other.example"  # the later file wins
    assert config.upstream is not None
    assert config.upstream.addresses() == (("k1", 9092), ("::1", 9093))
    assert config.quotas.scope == "cluster"  # merged key by key ...
    assert config.quotas.dry_run is True
    # ... but the entries list is the second file's, not a concatenation.
    assert [entry.entity.client_id for entry in config.quotas.entries] == ["app"]


def test_defaults_match_kafka_and_the_runtime_settings(tmp_path: Path) -> None:
    config = load_config([write(tmp_path, "q.yaml", "quotas: {}\n")])
    assert config.upstream is None
    assert config.proxy.max_frame_bytes == DEFAULT_MAX_FRAME_BYTES
    assert (config.metrics.host, config.metrics.port, config.metrics.enabled) == ("127.0.0.1", 9644, True)
    assert config.capture.enabled is False
    assert (config.enforcement.default_partitions, config.enforcement.charge_validate_only) == (1, False)
    # QuotaSettings' own defaults are Kafka's; an empty quotas section must produce exactly them.
    assert config.quota_settings() == QuotaSettings()


def test_section_left_empty_means_defaults(tmp_path: Path) -> None:
    config = load_config([write(tmp_path, "q.yaml", "proxy:\n  # everything commented out\nquotas:\n")])
    assert config.proxy.bootstrap_port == 9192
    assert config.quotas.entries == ()


def test_quota_settings_conversion(tmp_path: Path) -> None:
    path = write(tmp_path, "q.yaml", """
quotas:
  scope: cluster
  dry_run: true
  window_num: 5
  window_size_seconds: 2
  controller_window_num: 3
  controller_window_size_seconds: 4
  sensor_expiry_seconds: 60
  callback:
    class: "teams.quota:Callback"
    options: {teams: [a, b], strict: true}
  entries:
    - entity: {user: alice, client-id: "<default>"}
      producer_byte_rate: 1048576.0
      request_percentage: 12.5
      dry_run: true
      scope: broker
    - entity: {client-id: app}
      consumer_byte_rate: 2048
      controller_mutation_rate: 0.5
  ip_entries:
    - {ip: "<default>", connection_creation_rate: 20}
    - {ip: "0:0::1", connection_creation_rate: 3}
""")
    settings = load_config([path]).quota_settings()
    assert settings == QuotaSettings(
        entries=(
            QuotaEntry(
                QuotaEntity(user="alice", client_id="<default>"),
                {"producer_byte_rate": 1048576.0, "request_percentage": 12.5},
                dry_run=True,
                scope="broker",
            ),
            QuotaEntry(
                QuotaEntity(user=None, client_id="app"),
                {"consumer_byte_rate": 2048.0, "controller_mutation_rate": 0.5},
            ),
        ),
        ip_entries=(IpQuotaEntry("<default>", 20.0), IpQuotaEntry("::1", 3.0)),
        scope="cluster",
        dry_run=True,
        window_num=5,
        window_size_s=2,
        controller_window_num=3,
        controller_window_size_s=4,
        sensor_expiry_s=60.0,
        callback="teams.quota:Callback",
        callback_options={"teams": ("a", "b"), "strict": True},
    )
    assert all(isinstance(v, float) for entry in settings.entries for v in entry.limits.values())


def test_models_are_frozen(tmp_path: Path) -> None:
    config = load_config([write(tmp_path, "q.yaml", "proxy: {bootstrap_port: 9000}\n")])
    with pytest.raises(ValidationError):
        config.proxy.bootstrap_port = 1
    assert config.proxy.bootstrap_port == 9000


def test_kafka_accepts_whole_valued_doubles_for_long_quotas(tmp_path: Path) -> None:
    # AlterClientQuotas carries doubles; Kafka accepts a LONG quota within 1e-6 of a whole number.
    path = write(tmp_path, "q.yaml", (
        "quotas:\n  entries:\n    - entity: {user: a}\n      producer_byte_rate: 1024.0000001\n"
    ))
    [entry] = load_config([path]).quotas.entries
    assert entry.producer_byte_rate == 1024


def test_yaml_anchors_and_merge_keys_may_override(tmp_path: Path) -> None:
    path = write(tmp_path, "q.yaml", """
quotas:
  entries:
    - &team
      entity: {user: alice}
      producer_byte_rate: 1024
      consumer_byte_rate: 2048
    - <<: *team
      entity: {user: bob}
      consumer_byte_rate: 4096
""")
    alice, bob = load_config([path]).quotas.entries
    assert (bob.entity.user, bob.producer_byte_rate, bob.consumer_byte_rate) == ("bob", 1024, 4096)
    assert alice.consumer_byte_rate == 2048
