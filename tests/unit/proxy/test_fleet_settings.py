"""`kqp serve` settings for the fleet exchange: where it connects and as whom."""

from __future__ import annotations

from pathlib import Path

from kqp.config import load_config
from kqp.config.models import CommandLine
from kqp.proxy.app import app_settings_from_config, fleet_options, load_serve_setup


def test_the_exchange_uses_the_upstream_given_on_the_command_line(tmp_path: Path) -> None:
    path = tmp_path / "kqp.yaml"
    path.write_text("fleet:\n  enabled: true\n  on_unreachable: local\n")
    setup = load_serve_setup([str(path)], CommandLine(upstream=("k1:9092",)))
    assert setup is not None
    settings = setup.settings
    assert settings.fleet is not None
    assert settings.fleet.bootstrap_servers == ("k1:9092",)
    assert settings.fleet.on_unreachable == "local"


def test_the_exchange_may_use_a_cluster_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "kqp.yaml"
    path.write_text('upstream: {bootstrap_servers: ["k1:9092"]}\n'
                    'fleet: {enabled: true, bootstrap_servers: ["usage:9092"], topic: usage}\n')
    settings = app_settings_from_config(load_config([path]))
    assert settings.fleet is not None
    assert (settings.fleet.bootstrap_servers, settings.fleet.topic) == (("usage:9092",), "usage")


def test_no_exchange_unless_enabled(tmp_path: Path) -> None:
    path = tmp_path / "kqp.yaml"
    path.write_text('upstream: {bootstrap_servers: ["k1:9092"]}\n')
    assert app_settings_from_config(load_config([path])).fleet is None


def test_workers_turn_the_exchange_on_with_the_files_settings(tmp_path: Path) -> None:
    path = tmp_path / "kqp.yaml"
    path.write_text("fleet: {topic: team-usage, on_unreachable: local}\n")
    setup = load_serve_setup([str(path)], CommandLine(upstream=("k1:9092",)))
    assert setup is not None and setup.settings.fleet is None
    fleet = fleet_options(setup.config, setup.settings.proxy, enable=True)
    assert fleet is not None
    assert (fleet.topic, fleet.on_unreachable, fleet.bootstrap_servers) == ("team-usage", "local", ("k1:9092",))


def test_the_proxy_options_know_which_proxy_settings_the_file_gave(tmp_path: Path) -> None:
    path = tmp_path / "kqp.yaml"
    path.write_text('upstream: {bootstrap_servers: ["k1:9092"]}\nproxy: {idle_timeout_seconds: 5}\n')
    proxy = app_settings_from_config(load_config([path])).proxy
    assert proxy.idle_timeout_seconds == 5 and proxy.bootstrap_port == 9192
    assert proxy.model_fields_set == {"idle_timeout_seconds", "upstream_bootstrap", "upstream_tls"}
