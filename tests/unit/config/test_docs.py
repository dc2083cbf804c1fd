"""docs/configuration.md documents every setting, with the default the code really uses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from kqp.config.models import (
    CaptureSection,
    EnforcementSection,
    FleetSection,
    KqpConfig,
    ListenerSaslSection,
    MetricsSection,
    ProxyProtocolSection,
    ProxySection,
    SniRoutingSection,
    UpstreamSection,
    WorkersSection,
)
from kqp.config.quota_sections import (
    CallbackSection,
    GuardSection,
    GuardWeightSection,
    IpQuotaEntrySection,
    QuotaEntrySection,
    QuotasSection,
)

DOC = Path(__file__).resolve().parents[3] / "docs/configuration.md"

SECTIONS: dict[str, type[BaseModel]] = {
    "proxy": ProxySection,
    "proxy.sni_routing": SniRoutingSection,
    "proxy.proxy_protocol": ProxyProtocolSection,
    "upstream": UpstreamSection,
    "metrics": MetricsSection,
    "capture": CaptureSection,
    "quotas": QuotasSection,
    "quotas.entries[]": QuotaEntrySection,
    "quotas.ip_entries[]": IpQuotaEntrySection,
    "quotas.callback": CallbackSection,
    "enforcement": EnforcementSection,
    "fleet": FleetSection,
    "proxy.sasl": ListenerSaslSection,
    "workers": WorkersSection,
    "guard": GuardSection,
    "guard.weights[]": GuardWeightSection,
}


def documented_rows(heading: str) -> dict[str, list[str]]:
    """key -> cells of the settings table under the heading `## `heading`` (any level)."""
    text = DOC.read_text()
    match = re.search(rf"^#+ `{re.escape(heading)}`\n(.*?)(?=^#+ |\Z)", text, flags=re.MULTILINE | re.DOTALL)
    assert match, f"no section for {heading} in {DOC.name}"
    rows: dict[str, list[str]] = {}
    for line in match.group(1).splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 5:
            rows[cells[0].strip("`")] = cells
    return rows


def yaml_names(model: type[BaseModel]) -> set[str]:
    return {info.alias or name for name, info in model.model_fields.items()}


def test_every_section_is_documented() -> None:
    assert {name for name in SECTIONS if "." not in name} == yaml_names(KqpConfig)


@pytest.mark.parametrize("heading", SECTIONS)
def test_every_key_is_documented(heading: str) -> None:
    assert set(documented_rows(heading)) == yaml_names(SECTIONS[heading])


def expected_default_cell(value: object) -> str:
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        return f"`{int(value)}`"
    if isinstance(value, dict | tuple) and not value:
        return "`{}`" if isinstance(value, dict) else "`[]`"
    return f"`{value}`"


@pytest.mark.parametrize("heading", SECTIONS)
def test_documented_defaults_are_the_real_ones(heading: str) -> None:
    rows = documented_rows(heading)
    for name, info in SECTIONS[heading].model_fields.items():
        cell = rows[info.alias or name][3]
        default = info.get_default(call_default_factory=True)
        if default is PydanticUndefined:
            assert cell == "required", name
        elif default is None:
            assert cell in ("none", "the section's `scope`"), name
        else:
            assert cell == expected_default_cell(default), name
