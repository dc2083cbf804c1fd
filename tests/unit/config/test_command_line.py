"""`kqp serve`'s options go through the same models as the files, and are checked the same way."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kqp.config.models import CommandLine, KqpConfig, ProxySection


def test_options_override_the_files_values_and_keep_the_rest() -> None:
    config = KqpConfig.model_validate({"proxy": {"bootstrap_port": 9300, "idle_timeout_seconds": 5.0},
                                       "upstream": {"bootstrap_servers": ("k1:9092",)}})
    merged = config.with_command_line(CommandLine(upstream=("k2:9092",), node_port_base=9400, capture_dir="cap"))
    assert merged.upstream is not None and merged.upstream.bootstrap_servers == ("k2:9092",)
    assert (merged.proxy.bootstrap_port, merged.proxy.node_port_base, merged.proxy.idle_timeout_seconds) == (
        9300, 9400, 5.0)
    assert (merged.capture.enabled, merged.capture.directory) == (True, "cap")


def test_an_option_the_model_refuses_is_refused() -> None:
    with pytest.raises(ValidationError, match="bootstrap_port"):
        KqpConfig().with_command_line(CommandLine(bootstrap_port=70000))
    with pytest.raises(ValidationError, match="bootstrap_servers"):
        KqpConfig().with_command_line(CommandLine(upstream=("no-port",)))


def test_no_option_changes_nothing() -> None:
    assert KqpConfig().with_command_line(CommandLine()) == KqpConfig()
    assert KqpConfig().with_command_line(CommandLine()).proxy == ProxySection()


def test_an_update_keeps_knowing_which_values_were_given() -> None:
    # Section-wide checks may depend on what the file set, not only on the values.
    proxy = ProxySection.model_validate({"bootstrap_port": 9300})
    updated = proxy.updated(bind_host="0.0.0.0")
    assert updated.model_fields_set == {"bootstrap_port", "bind_host"}
    assert (updated.bootstrap_port, updated.bind_host, updated.node_port_base) == (9300, "0.0.0.0", 9200)
