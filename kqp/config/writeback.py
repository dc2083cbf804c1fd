"""Writing quota entries back to a config file (AlterClientQuotas), atomically.

The file is rewritten from its parsed form, so its other keys survive but its comments do
not. The new text goes to a temporary file in the same directory, is fsynced, and replaces
the old file with os.replace: a reader (the live-reload watcher) sees the old file or the
new one, never a half-written one.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from kqp.config.errors import ConfigError, ConfigProblem
from kqp.config.loader import ConfigSource, read_config_file, validate_sources
from kqp.quotas.settings import QUOTA_TYPES, IpQuotaEntry, QuotaEntry

# Kafka stores these as LONG: write them as whole numbers.
_WHOLE_QUOTAS = frozenset({"producer_byte_rate", "consumer_byte_rate"})


def find_quota_file(paths: Sequence[str | Path]) -> Path:
    """The file whose `quotas.entries` is in effect, i.e. where alterations must be written.

    That is the last file that sets `quotas.entries`; failing that the last with a `quotas`
    section; failing that the last file (the section is then added to it).
    """
    if not paths:
        raise ConfigError([ConfigProblem((), "", "no configuration file given")])
    sources = [read_config_file(path) for path in paths]
    for predicate in (_has_entries, _has_quotas):
        for path, source in zip(reversed(paths), reversed(sources), strict=True):
            if predicate(source):
                return Path(path)
    return Path(paths[-1])


def _has_quotas(source: ConfigSource) -> bool:
    return "quotas" in source.data


def _has_entries(source: ConfigSource) -> bool:
    quotas = source.data.get("quotas")
    return isinstance(quotas, dict) and "entries" in quotas


def entry_as_yaml(entry: QuotaEntry) -> dict[str, Any]:
    entity: dict[str, str] = {}
    if entry.entity.user is not None:
        entity["user"] = entry.entity.user
    if entry.entity.client_id is not None:
        entity["client-id"] = entry.entity.client_id
    item: dict[str, Any] = {"entity": entity}
    for quota_type in QUOTA_TYPES:
        if quota_type in entry.limits:
            value = entry.limits[quota_type]
            item[quota_type] = round(value) if quota_type in _WHOLE_QUOTAS else value
    if entry.dry_run:
        item["dry_run"] = True
    if entry.scope is not None:
        item["scope"] = entry.scope
    return item


def write_quota_entries(
    path: str | Path,
    entries: Sequence[QuotaEntry],
    ip_entries: Sequence[IpQuotaEntry] | None = None,
    origin: str | None = None,
) -> None:
    """Replace `quotas.entries` (and `quotas.ip_entries` when given) in the file at `path`,
    keeping its other keys.

    `origin` (who asked for this write) is stamped on each entry the write adds or changes;
    an entry it leaves as it was keeps its stamp, or its lack of one.

    Raises ConfigError, leaving the file untouched, when the file cannot be read or the
    result would not be a valid configuration file.
    """
    source = read_config_file(path)
    data = dict(source.data)
    quotas = data.get("quotas")
    quotas = dict(quotas) if isinstance(quotas, dict) else {}
    quotas["entries"] = [_stamped(entry_as_yaml(entry), quotas.get("entries"), origin) for entry in entries]
    if ip_entries is not None and (ip_entries or "ip_entries" in quotas):
        quotas["ip_entries"] = [
            {"ip": e.ip, "connection_creation_rate": round(e.connection_creation_rate)} for e in ip_entries
        ]
    data["quotas"] = quotas
    text = yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)
    # Validate what would be written, as the file will be read back by the reload loop.
    validate_sources([ConfigSource(source.path, text, yaml.safe_load(text))])
    replace_file_atomically(Path(path), text)


def _stamped(item: dict[str, Any], written: object, origin: str | None) -> dict[str, Any]:
    """`item` with the origin of the same entry as the file holds it, if unchanged, else `origin`."""
    for old in written if isinstance(written, list) else ():
        if isinstance(old, dict) and _comparable(old) == _comparable(item):
            return {**item, "origin": old["origin"]} if "origin" in old else item
    return {**item, "origin": origin} if origin else item


def _comparable(item: dict[str, Any]) -> dict[str, Any]:
    # 100 and 100.0 are one limit, and `dry_run: false` is the default spelled out.
    return {key: float(value) if isinstance(value, int | float) and not isinstance(value, bool) else value
            for key, value in item.items() if key != "origin" and not (key == "dry_run" and value is False)}


def replace_file_atomically(path: Path, text: str) -> None:
    directory = path.parent
    mode = path.stat().st_mode & 0o7777 if path.exists() else 0o644
    handle = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed below, before the rename
        "w", encoding="utf-8", dir=directory, prefix=f".{path.name}.", suffix=".tmp", delete=False
    )
    try:
        with handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(handle.name, mode)
        os.replace(handle.name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(handle.name)
        raise
    # Make the rename itself durable.
    directory_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(directory_fd)
    finally:
        os.close(directory_fd)


# -- the fleet's quota configuration (docs/scaling.md) ------------------------------------------

QUOTA_SNAPSHOT_FORMAT = 1
_SNAPSHOT_SOURCE = "the fleet's quota topic"


def encode_quota_snapshot(instance: str, entries: Sequence[QuotaEntry], ip_entries: Sequence[IpQuotaEntry]) -> bytes:
    """The quota entries as one record of the fleet's compacted quota topic, in the YAML
    files' own shape (so a snapshot reads back exactly as a file would)."""
    body = {
        "format": QUOTA_SNAPSHOT_FORMAT,
        "instance": instance,
        "entries": [entry_as_yaml(entry) for entry in entries],
        "ip_entries": [{"ip": e.ip, "connection_creation_rate": round(e.connection_creation_rate)} for e in ip_entries],
    }
    return json.dumps(body, separators=(",", ":")).encode()


def decode_quota_snapshot(data: bytes) -> tuple[str, tuple[QuotaEntry, ...], tuple[IpQuotaEntry, ...]]:
    """(instance, entries, ip entries) of a snapshot; ConfigError says what is wrong with it."""
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError([ConfigProblem((_SNAPSHOT_SOURCE,), "", f"not JSON: {exc}")]) from None
    if not isinstance(body, dict) or body.get("format") != QUOTA_SNAPSHOT_FORMAT:
        reason = f"not a format {QUOTA_SNAPSHOT_FORMAT} quota snapshot"
        raise ConfigError([ConfigProblem((_SNAPSHOT_SOURCE,), "", reason)])
    text = yaml.safe_dump({"quotas": {"entries": body.get("entries", []), "ip_entries": body.get("ip_entries", [])}})
    config = validate_sources([ConfigSource(_SNAPSHOT_SOURCE, text, yaml.safe_load(text))])
    entries = tuple(entry.to_entry() for entry in config.quotas.entries)
    ip_entries = tuple(entry.to_entry() for entry in config.quotas.ip_entries)
    return str(body.get("instance", "")), entries, ip_entries
