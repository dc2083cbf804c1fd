"""Writing quota entries back to a config file (AlterClientQuotas, the fleet), atomically,
keeping the file the operator wrote.

The file is the operator's: its comments, key order, quoting, blank lines and indentation
survive a write-back. It is edited in place through a round-trip YAML parser (ruamel.yaml),
and only what changed is touched: the values of an entry whose quotas changed (and its
`origin` stamp, which says who changed it and when), an entry added at the end of the list,
an entry removed. An entry the write leaves as it was keeps every character.

The new text goes to a temporary file in the same directory, is fsynced, and replaces the
old file with os.replace: a reader (the live-reload watcher) sees the old file or the new
one, never a half-written one.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Two YAML libraries on purpose: PyYAML (safe_load) is what the loader validates with, so the
# written text is checked by the library that will read it back; ruamel.yaml is used only
# to edit, because it keeps comments and layout, which PyYAML drops on a dump.
import yaml
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import CommentMark, YAMLError
from ruamel.yaml.tokens import CommentToken
from ruamel.yaml.util import load_yaml_guess_indent

from kqp.config.errors import ConfigError, ConfigProblem
from kqp.config.loader import ConfigSource, read_config_file, validate_sources
from kqp.quotas.settings import QUOTA_TYPES, IpQuotaEntry, QuotaEntry

# Kafka stores these as LONG: write them as whole numbers.
_WHOLE_QUOTAS = frozenset({"producer_byte_rate", "consumer_byte_rate"})
# A key line nested in a mapping (not a list item, not a comment): its indent is the file's.
_NESTED_KEY = re.compile(r"^( +)[^\s#-][^:#]*:", re.MULTILINE)


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
    """An entry in the file's own shape (the inverse of the loader's parsing): only the quota types
    it sets, and `dry_run` / `scope` only when they differ from the defaults, so a written entry
    is as short as one an operator would write.
    """
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
    """Make `quotas.entries` (and `quotas.ip_entries` when given) of the file at `path` these,
    changing only the entries that differ and keeping the rest of the file as it is.

    `origin` (who asked for this write) is stamped on each entry the write adds or changes;
    an entry it leaves as it was keeps its stamp, or its lack of one.

    Raises ConfigError, leaving the file untouched, when the file cannot be read or the
    result would not be a valid configuration file.
    """
    # The file is read again here, not taken from the running config: the operator may have edited
    # it since the last reload, and those edits must survive this write.
    source = read_config_file(path)
    round_trip = _round_trip_yaml(source.text)
    try:
        document = round_trip.load(source.text)
    except YAMLError as exc:  # read_config_file accepted it, so this is a parser difference
        raise ConfigError([ConfigProblem((source.path,), "", f"cannot be edited in place: {exc}")]) from None
    if document is None:
        document = CommentedMap()
    quotas = document.get("quotas")
    if not isinstance(quotas, CommentedMap):
        quotas = document["quotas"] = CommentedMap()
    quotas["entries"] = _merged(
        quotas.get("entries"), [entry_as_yaml(entry) for entry in entries], _entity_key, origin
    )
    if ip_entries is not None and (ip_entries or "ip_entries" in quotas):
        wanted = [{"ip": e.ip, "connection_creation_rate": round(e.connection_creation_rate)} for e in ip_entries]
        quotas["ip_entries"] = _merged(quotas.get("ip_entries"), wanted, _ip_key, None)
    out = io.StringIO()
    round_trip.dump(document, out)
    text = out.getvalue()
    # An alteration to the values already in effect changes nothing: the file is not rewritten, so
    # the reload watcher has nothing to pick up.
    if text == source.text:
        return
    # Validate what would be written, as the file will be read back by the reload loop.
    validate_sources([ConfigSource(source.path, text, yaml.safe_load(text))])
    replace_file_atomically(Path(path), text)


def _round_trip_yaml(text: str) -> YAML:
    """A round-trip dumper that writes new lines with the indentation the file already uses."""
    round_trip = YAML()  # round-trip mode: comments, order, quotes and flow style are kept
    round_trip.preserve_quotes = True
    round_trip.width = 1 << 16  # never fold a long line the operator wrote on one
    # ruamel guesses the lists' indentation; the mappings' indent is the smallest nested key indent
    # of the text, so an entry appended to a 4-space file is written with 4 spaces, not ruamel's 2.
    _, sequence_indent, dash_offset = load_yaml_guess_indent(text)
    nested = [len(match.group(1)) for match in _NESTED_KEY.finditer(text)]
    round_trip.indent(mapping=min(nested, default=2), sequence=sequence_indent or 2, offset=dash_offset or 0)
    first = next((line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")), "")
    # A `---` document start the operator wrote is kept; one is never added.
    round_trip.explicit_start = first.startswith("---")
    return round_trip


def _entity_key(item: object) -> object:
    """What identifies an entry: its (user, client-id), as Kafka's quota entities are keyed."""
    entity = item.get("entity") if isinstance(item, dict) else None
    return (entity.get("user"), entity.get("client-id")) if isinstance(entity, dict) else None


def _ip_key(item: object) -> object:
    """What identifies an IP entry (KIP-612's connection_creation_rate): its address."""
    return item.get("ip") if isinstance(item, dict) else None


def _merged(written: object, wanted: list[dict[str, Any]], key: Any, origin: str | None) -> CommentedSeq:
    """The list as the file holds it, edited into `wanted`: an item already there and equal
    stays untouched, a changed one is edited in place, a new one is appended, a gone one removed."""
    items = written if isinstance(written, CommentedSeq) else CommentedSeq()
    wanted_by_key = {key(item): item for item in wanted}
    # Removal runs back to front so that deleting an item does not shift the ones still to visit.
    for index in reversed(range(len(items))):
        if key(items[index]) not in wanted_by_key:
            trailing = _take_trailing_lines(items[index], next(reversed(items[index]), None))
            del items[index]
            if trailing and index > 0 and index == len(items):
                # What followed the list follows its new end, instead of what separated the
                # new last entry from the removed one.
                previous = items[index - 1]
                last_key = next(reversed(previous))
                _take_trailing_lines(previous, last_key)
                _give_trailing_lines(previous, last_key, trailing)
    present = {key(item): item for item in items}
    # Additions and edits keep `wanted`'s order for new items but never reorder the operator's.
    for item in wanted:
        old = present.get(key(item))
        if old is None:
            if items:
                # The lines that followed the list follow it still, after the new entry.
                last = items[-1]
                trailing = _take_trailing_lines(last, next(reversed(last), None))
            else:
                trailing = ""
            new = _new_item(item, origin)
            items.append(new)
            _give_trailing_lines(new, next(reversed(new)), trailing)
        elif _comparable(old) != _comparable(item):
            _edit_in_place(old, item, origin)
    return items


def _new_item(item: dict[str, Any], origin: str | None) -> CommentedMap:
    """A new entry as a ruamel map, with the `origin` stamp right after `entity` so it reads first."""
    new = CommentedMap()
    for name, value in item.items():
        if isinstance(value, dict):
            value = CommentedMap(value)
            value.fa.set_flow_style()  # `entity: {client-id: x}`, as the documentation writes it
        new[name] = value
        if name == "entity" and origin:
            new["origin"] = origin
    return new


def _edit_in_place(old: CommentedMap, item: dict[str, Any], origin: str | None) -> None:
    """Change `old`'s values to `item`'s, keeping its keys' order, spelling and comments."""
    wanted = _comparable(item)
    for name in [name for name in old if name not in item and name != "origin"]:
        if name not in _comparable({name: old[name]}):
            continue  # a default spelled out (`dry_run: false`), still true
        _delete_keeping_trailing_lines(old, name)
    for name, value in item.items():
        if name not in old:
            _append_keeping_trailing_lines(old, name, value)
        elif _comparable({name: old[name]}).get(name) != wanted.get(name):
            old[name] = value
    if origin:
        if "origin" in old:
            old["origin"] = origin
        else:
            # After the entity: the last key may carry the blank line or comment that follows
            # the entry, which a key appended after it would push down.
            old.insert(list(old).index("entity") + 1 if "entity" in old else 0, "origin", origin)


def _comparable(item: dict[str, Any]) -> dict[str, Any]:
    # 100 and 100.0 are one limit, and `dry_run: false` is the default spelled out.
    return {key: float(value) if isinstance(value, int | float) and not isinstance(value, bool) else value
            for key, value in item.items() if key != "origin" and not (key == "dry_run" and value is False)}


# ruamel.yaml keeps what follows an entry's last line (blank lines, the comment above the next
# entry or section) on the entry's last key. A key appended after it, or that key deleted,
# would move those lines or lose them; these two keep them after whichever key is last.

def _append_keeping_trailing_lines(mapping: CommentedMap, name: str, value: object) -> None:
    last = next(reversed(mapping), None)
    trailing = _take_trailing_lines(mapping, last) if last is not None else ""
    mapping[name] = value
    _give_trailing_lines(mapping, name, trailing)


def _delete_keeping_trailing_lines(mapping: CommentedMap, name: str) -> None:
    trailing = _take_trailing_lines(mapping, name)
    mapping.ca.items.pop(name, None)
    del mapping[name]
    last = next(reversed(mapping), None)
    if last is not None:
        _give_trailing_lines(mapping, last, trailing)


def _take_trailing_lines(mapping: CommentedMap, name: object) -> str:
    """Detach the lines after `name`'s own line that ruamel keeps on it; its own comment stays."""
    comments = mapping.ca.items.get(name)
    token = comments[2] if comments is not None and len(comments) > 2 else None
    if token is None:
        return ""
    own, _, trailing = token.value.partition("\n")
    if not trailing:
        return ""
    if own.strip():
        token.value = own + "\n"
    else:
        comments[2] = None
    return str(trailing)


def _give_trailing_lines(mapping: CommentedMap, name: object, trailing: str) -> None:
    """Attach `trailing` (taken by _take_trailing_lines) after `name`'s line, so those lines keep their
    place at the end of the entry or list whichever key now ends it.
    """
    if not trailing:
        return
    comments = mapping.ca.items.setdefault(name, [None, None, None, None])
    if comments[2] is None:
        comments[2] = CommentToken("\n" + trailing, CommentMark(0), None)
    else:
        comments[2].value += trailing


def replace_file_atomically(path: Path, text: str) -> None:
    """Write `text` to `path` so that a reader sees the old file or the new one, never a mix.

    The temporary file is in the same directory (os.replace is atomic only within a file system),
    keeps the old file's permission bits (a config file may hold secrets and be 0600), is
    fsynced before the rename, and the directory after it, so a crash leaves one of the two.
    """
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

# A snapshot is one JSON record on the compacted `<fleet topic>-quotas` topic under one key, so
# compaction keeps only the latest: an instance that joins reads one record and has the fleet's
# quotas. `format` lets kqp refuse a record of a format it does not know instead of misreading it.
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
    # Validated through the same models as a file, so a snapshot cannot carry what a file could not.
    text = yaml.safe_dump({"quotas": {"entries": body.get("entries", []), "ip_entries": body.get("ip_entries", [])}})
    config = validate_sources([ConfigSource(_SNAPSHOT_SOURCE, text, yaml.safe_load(text))])
    entries = tuple(entry.to_entry() for entry in config.quotas.entries)
    ip_entries = tuple(entry.to_entry() for entry in config.quotas.ip_entries)
    return str(body.get("instance", "")), entries, ip_entries
