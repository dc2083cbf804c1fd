"""advise's quotas.yaml: kqp's own quota file format (`kqp check-config` / `kqp serve --config`),
with a comment above each entry saying why its quotas are what they are.

Written by ruamel.yaml, as the proxy writes its quota file back; pure (no Spark).
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.scalarstring import DoubleQuotedScalarString

from kqp.config.models import entity_text as entity_label
from kqp.quotas.settings import DEFAULT_ENTITY, QuotaEntity, Scope
from kqp.spark_jobs.advice_math import (
    PRODUCE,
    UNLIMITED_QUOTA,
    Entry,
    FlowAdvice,
)


def _rate(value: float) -> str:
    """A rate for the comments of quotas.yaml, in decimal units (1 MB/s = 10^6 B/s)."""
    for unit, size in (("MB/s", 1e6), ("KB/s", 1e3)):
        if value >= size:
            return f"{value / size:,.2f} {unit}"
    return f"{value:,.0f} B/s"


def _why(flow: FlowAdvice, throttled: Mapping[QuotaEntity, float], stat: str) -> str:
    """The one-line reason written above a flow's entry: demand, the rule that set the quota, replay outcome.

    Both demand figures are of the rate the quota measures (advice_math.FlowAdvice), so the
    statistic never reads above the peak.
    """
    kind = "produce" if flow.quota_type == PRODUCE else "fetch"
    text = f"{kind} {_rate(flow.demand_stat)} at the {stat}, {_rate(flow.demand_peak)} at the peak; {flow.reason}"
    if flow.quota is not None and flow.fair_share is not None:
        text += f" ({_rate(flow.fair_share)})"
    share = throttled.get(flow.entity)
    if share is not None:
        text += f"; throttled {share:.1%} of requests in the replay"
    return text


def _yaml_entity(entity: QuotaEntity) -> CommentedMap:
    # Double-quoted, in flow style ({user: "...", client-id: "..."}): any name survives, quotes included.
    names = CommentedMap()
    if entity.user is not None:
        names["user"] = DoubleQuotedScalarString(entity.user)
    if entity.client_id is not None:
        names["client-id"] = DoubleQuotedScalarString(entity.client_id)
    names.fa.set_flow_style()
    return names


def _entry_comments(
    entry: Entry, flows: Sequence[FlowAdvice], by_entity: Mapping[QuotaEntity, list[FlowAdvice]],
    explicit: set[QuotaEntity], throttled: Mapping[QuotaEntity, float], stat: str,
) -> list[str]:
    """The comment lines above an entry: why each of its quotas is what it is."""
    if DEFAULT_ENTITY not in (entry.entity.user, entry.entity.client_id):
        return [f"{entity_label(flow.entity)}: {_why(flow, throttled, stat)}"
                for flow in by_entity.get(entry.entity, [])]
    # A <default> entry covers every entity without an entry of its own (KIP-55), so its comment
    # names those entities rather than one flow.
    lines = []
    for quota_type, value in entry.limits.items():
        covered = [f for f in flows if f.quota_type == quota_type and f.entity not in explicit and f.quota is not None]
        below = [f for f in flows if f.quota_type == quota_type and f.entity not in explicit and f.quota is None]
        names = ", ".join(entity_label(f.entity) for f in covered[:10]) + (" ..." if len(covered) > 10 else "")
        lines.append(f"{quota_type} {value}: the fair share of {len(covered)} entities without an entry "
                     f"of their own ({names}); {len(below)} others never went above it")
    lines += [f"  {entity_label(flow.entity)}: {_why(flow, throttled, stat)}"
              for flow in [f for f in flows if f.entity not in explicit and f.quota is not None][:10]]
    return lines


def render_quotas_yaml(
    entries: Sequence[Entry],
    flows: Sequence[FlowAdvice],
    throttled: Mapping[QuotaEntity, float],
    header: Sequence[str],
    scope: Scope,
    windows: Mapping[str, int],
    stat: str = "p99",
) -> str:
    """quotas.yaml in kqp's own format (`kqp check-config` / `kqp serve --config`), with a
    comment per entry saying why; written by ruamel.yaml, as the proxy writes its quota file back."""
    by_entity: dict[QuotaEntity, list[FlowAdvice]] = {}
    for flow in flows:
        by_entity.setdefault(flow.entity, []).append(flow)
    explicit = {entry.entity for entry in entries}
    listed = CommentedSeq()
    for index, entry in enumerate(entries):
        item = CommentedMap(entity=_yaml_entity(entry.entity))
        for quota_type, value in entry.limits.items():
            item[quota_type] = value
            if value == UNLIMITED_QUOTA:
                item.yaml_add_eol_comment("Long.MAX_VALUE: no quota (exempt from the <default> entry)", quota_type)
        listed.append(item)
        # A blank line, then the reasons, above each entry.
        comments = _entry_comments(entry, flows, by_entity, explicit, throttled, stat)
        listed.yaml_set_comment_before_after_key(index, before="\n".join(["", *comments]), indent=4)
    quotas = CommentedMap(scope=scope)
    quotas.update(windows)
    quotas["entries"] = listed
    document = CommentedMap(quotas=quotas)
    document.yaml_set_start_comment("\n".join(header))
    writer = YAML()
    writer.indent(mapping=2, sequence=4, offset=2)
    writer.width = 1 << 16  # one line per value, however long a name
    text = io.StringIO()
    writer.dump(document, text)
    return text.getvalue()
