"""`kqp check-config FILE...`: validate, then show what the proxy would run with.

Meant for review before a deploy or in CI: the same loader as `kqp serve` (so a file that
passes here is one the proxy accepts), and a summary that shows the quota entries in the
order Kafka resolves them (KIP-55 precedence), with the file and line each comes from, so a
reviewer can see which entry a given client will get without reading the YAML by hand.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from kqp.config.capacity_file import load_capacity
from kqp.config.errors import ConfigError
from kqp.config.loader import line_of, load_config, read_config_file
from kqp.config.models import KqpConfig, ListenerSaslSection, ProxySection, entity_text
from kqp.config.quota_sections import GuardSection
from kqp.quotas.capacity import DEFAULT_BROKER_ID
from kqp.quotas.settings import DEFAULT_ENTITY, QuotaEntity, QuotaType

# Each quota type's unit, as Kafka defines it: byte rates in bytes per second (per broker),
# request_percentage in percent of one network/IO thread's time (KIP-124: 200 = two threads'
# worth), mutations in partitions created or deleted per second (KIP-599), connection
# creations per second per IP (KIP-612).
_UNITS: dict[str, str] = {
    "producer_byte_rate": "B/s",
    "consumer_byte_rate": "B/s",
    "request_percentage": "% of a thread",
    "controller_mutation_rate": "partitions/s",
    "connection_creation_rate": "connections/s",
}


def check_config_command(files: Sequence[str | Path]) -> int:
    """Exit status 0 with a summary on stdout, or 2 with the problems on stderr."""
    try:
        config = load_config(files)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(render_summary(config, files, entry_origins(config, files)))
    return 0


def unreadable_login_warnings(config: KqpConfig) -> list[str]:
    """Warnings for user-level quotas on a listener that may see logins whose principal the
    proxy cannot read (kqp.protocol.sasl): those connections count as ANONYMOUS, so a quota
    keyed on a user never reaches them.

    "May see" is read from proxy.sasl.mechanisms, what the brokers' listener enables: a
    mechanism other than PLAIN, SCRAM-SHA-256/512 and OAUTHBEARER, or no list at all (then
    any mechanism may pass). An empty list (no SASL) or readable mechanisms only: no warning.
    OAUTHBEARER counts as readable: its tokens are JWTs in Kafka's own and the usual identity
    providers' setups, and a token that is not is counted and logged when it is seen.
    """
    users = sorted({entry.entity.user for entry in config.quotas.entries if entry.entity.user is not None})
    if not users:
        return []
    sasl = config.proxy.sasl or ListenerSaslSection()
    unreadable = sasl.unreadable_mechanisms()
    named = ", ".join(users)
    advice = ("those connections count as ANONYMOUS and user quotas do not apply to them; key their quotas "
              "on client-id instead (docs/quotas.md)")
    if unreadable is None:
        return [f"user-level quotas ({named}) are configured, but proxy.sasl.mechanisms is not set, so the "
                f"listener may see SASL logins whose principal the proxy cannot read (GSSAPI, AWS_MSK_IAM, ...): "
                f"{advice}. Set proxy.sasl.mechanisms to the brokers' sasl.enabled.mechanisms ([] without SASL) "
                f"to say which it sees."]
    if unreadable:
        return [f"user-level quotas ({named}) are configured, but proxy.sasl.mechanisms includes "
                f"{', '.join(unreadable)}, whose principal the proxy cannot read: {advice}."]
    return []


def entry_origins(config: KqpConfig, files: Sequence[str | Path]) -> list[str]:
    """Where each of `config.quotas.entries` comes from: "FILE:LINE", and who wrote it when
    the proxy did (AlterClientQuotas, the fleet's quota topic)."""
    sources = [read_config_file(path) for path in files]
    # Lists replace when files merge: the entries are those of the last file that sets them.
    holder = next((source for source in reversed(sources)
                   if isinstance(source.data.get("quotas"), dict) and "entries" in source.data["quotas"]), None)
    origins = []
    for index, entry in enumerate(config.quotas.entries):
        line = line_of(holder, ("quotas", "entries", index)) if holder is not None else None
        where = f"{holder.path}:{line}" if holder is not None and line is not None else "?"
        origins.append(f"{where}, written by {entry.origin}" if entry.origin else where)
    return origins


def precedence_level(entity: QuotaEntity) -> int:
    """Kafka's KIP-55 level of an entity: 1 (user + client-id) is the most specific, 8 the least.

    The eight levels, as in Kafka's documentation of quota precedence:
      1 /config/users/<user>/clients/<client-id>      5 /config/users/<default>/clients/<default>
      2 /config/users/<user>/clients/<default>        6 /config/users/<default>
      3 /config/users/<user>                          7 /config/clients/<client-id>
      4 /config/users/<default>/clients/<client-id>   8 /config/clients/<default>
    A client gets the first level that has a quota of the type in question."""
    user, client = entity.user, entity.client_id
    if user is not None and user != DEFAULT_ENTITY:
        return {None: 3, DEFAULT_ENTITY: 2}.get(client, 1)
    if user == DEFAULT_ENTITY:
        return {None: 6, DEFAULT_ENTITY: 5}.get(client, 4)
    return 8 if client == DEFAULT_ENTITY else 7


def format_limit(quota_type: QuotaType | str, value: float) -> str:
    # Byte rates are shown exact (what Kafka compares against) with a binary-unit reading
    # beside them, since operators think in MiB/s but the config holds bytes.
    unit = _UNITS[quota_type]
    if unit == "B/s":
        text = f"{round(value)} B/s"
        if value >= 1024:
            text += f" ({_binary(value)}/s)"
        return text
    return f"{value:g} {unit}"


def _binary(value: float) -> str:
    units = ("KiB", "MiB", "GiB", "TiB")
    index = 0
    value /= 1024
    while value >= 1024 and index < len(units) - 1:
        value /= 1024
        index += 1
    return f"{value:.3g} {units[index]}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return ["  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            for row in [header, *rows]]


def _routing_rows(proxy: ProxySection) -> list[list[str]]:
    """How clients reach the bootstrap and each broker: a port each, or one port by SNI name."""
    sni = proxy.sni_routing
    if sni is None:
        return [
            ["bootstrap", f"{proxy.bind_host}:{proxy.bootstrap_port}, advertised as {proxy.advertised_host}"],
            ["brokers", "node N on port " + f"{proxy.node_port_base} + N"
             + "".join(f"; node {node} on {port}" for node, port in sorted(proxy.node_ports.items()))],
        ]
    port = sni.advertised_port or proxy.bootstrap_port
    return [
        ["routing", f"by TLS server name (SNI), everything on {proxy.bind_host}:{proxy.bootstrap_port}"],
        ["bootstrap", f"{sni.bootstrap_host}:{port}"],
        ["brokers", f"node N as {sni.broker_host_pattern.replace('$(nodeId)', 'N')}:{port}"],
    ]


def render_summary(config: KqpConfig, files: Sequence[str | Path], origins: Sequence[str] | None = None) -> str:
    """The summary; `origins` (entry_origins) adds where each quota entry comes from."""
    lines = [f"OK: {', '.join(str(f) for f in files)}", "", "Listener"]
    proxy = config.proxy
    listener_rows = [*_routing_rows(proxy),
        ["upstream", ", ".join(config.upstream.bootstrap_servers) if config.upstream
         else "not configured (give it in a file or with kqp serve --upstream)"],
        ["connections", f"max {proxy.max_connections or 'unlimited'}, "
         f"per IP {proxy.max_connections_per_ip or 'unlimited'}, idle timeout {proxy.idle_timeout_seconds:g} s"],
        ["client IPs", "the connections' own" if proxy.proxy_protocol is None or not proxy.proxy_protocol.enabled
         else f"from PROXY protocol {proxy.proxy_protocol.mode} headers of "
              f"{', '.join(proxy.proxy_protocol.trusted_networks)}"],
        ["metrics", f"http://{config.metrics.host}:{config.metrics.port}/metrics" if config.metrics.enabled
         else "off"],
        ["capture", f"to {config.capture.directory}, 1 in {config.capture.sample_one_in} connections"
         if config.capture.enabled else "off"],
    ]
    lines.extend(f"  {name.ljust(12)}{value}" for name, value in listener_rows)

    q = config.quotas
    settings = config.quota_settings()
    lines += [
        "",
        f"Quotas: scope {q.scope}, {'DRY RUN (not enforced)' if q.dry_run else 'enforced'}, "
        f"windows {q.window_num} x {q.window_size_seconds} s, "
        f"controller windows {q.controller_window_num} x {q.controller_window_size_seconds} s",
    ]
    if q.callback is not None:
        lines.append(f"  callback {q.callback.class_} (it decides the quotas; the entries are passed to it)")
    enforcement = config.enforcement
    lines.append(
        f"  CreateTopics asking for the broker default counts {enforcement.default_partitions} partition(s); "
        f"validateOnly requests are {'charged' if enforcement.charge_validate_only else 'not charged'}"
    )
    rows = []
    # Most specific first, the order in which a client's quota is looked up; `enumerate`
    # keeps each entry's index into `origins`, which follows the file order.
    numbered = sorted(enumerate(settings.entries), key=lambda e: (precedence_level(e[1].entity), str(e[1].entity)))
    for index, entry in numbered:
        for quota_type, value in entry.limits.items():
            rows.append([
                str(precedence_level(entry.entity)),
                entity_text(entry.entity),
                quota_type,
                format_limit(quota_type, value),
                "yes" if entry.dry_run or q.dry_run else "no",
                entry.scope or q.scope,
                *([origins[index]] if origins is not None else []),
            ])
    if rows:
        header = ["level", "entity", "quota", "limit", "dry-run", "scope"]
        lines.extend(_table([*header, "from"] if origins is not None else header, rows))
    else:
        lines.append("  no quota entries: clients are not throttled by the proxy")
    if settings.ip_entries:
        lines += ["", "Connection-rate quotas (KIP-612)"]
        lines.extend(_table(
            ["ip", "limit"],
            [[e.ip, format_limit("connection_creation_rate", e.connection_creation_rate)]
             for e in settings.ip_entries],
        ))
    lines += guard_summary(config.guard)
    warnings = unreadable_login_warnings(config)
    if warnings:
        lines += ["", "Warnings"]
        lines.extend(f"  WARNING: {warning}" for warning in warnings)
    return "\n".join(lines)


def guard_summary(guard: GuardSection) -> list[str]:
    """The cluster guard's settings and the limits it judges each broker against (nothing when off,
    as for the other opt-in sections)."""
    if not guard.enabled:
        return []
    lines = [
        "",
        f"Guard: {'DRY RUN (limits computed and reported, nothing throttled)' if guard.dry_run else 'on'}, "
        f"per {guard.granularity}, every {guard.interval_seconds:g} s, replication factor {guard.replication_factor}"
        f"{', the fleet load shared through the fleet exchange' if guard.fleet_wide else ''}",
        f"  thresholds NW_IN {guard.nw_in_threshold:g}, NW_OUT {guard.nw_out_threshold:g} of {guard.capacity_file}; "
        f"releases at {1 - guard.release_margin:g} x the limit; limits rise by at most "
        f"{guard.raise_per_second:.0%} a second; floor {format_limit('producer_byte_rate', guard.floor)}",
    ]
    assert guard.capacity_file is not None  # the section's check requires it when enabled
    capacity = load_capacity(guard.capacity_file)
    declared = sorted(capacity.brokers)
    if capacity.default is not None:
        declared.append(DEFAULT_BROKER_ID)
    limits = guard.limits(declared)
    lines.extend(_table(
        ["broker", "NW_IN limit", "NW_OUT limit"],
        [["every other" if broker == DEFAULT_BROKER_ID else str(broker),
          format_limit("producer_byte_rate", limits[(broker, "NW_IN")]),
          format_limit("consumer_byte_rate", limits[(broker, "NW_OUT")])] for broker in declared],
    ))
    if guard.weights:
        lines.append("  weights: " + "; ".join(f"{w.entity.describe()} x{w.weight:g}" for w in guard.weights))
    if guard.protected:
        lines.append("  protected (never limited): " + "; ".join(e.describe() for e in guard.protected))
    return lines
