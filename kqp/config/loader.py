"""Reading YAML files into one `KqpConfig`, with errors that say where and what.

Several files are deep-merged in order: mappings merge key by key, and any other value
(scalars, lists) from a later file replaces the earlier one. Each problem is reported with
the file that supplied the offending value, its line and column, and the field path.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from kqp.config.errors import ConfigError, ConfigProblem
from kqp.config.models import KqpConfig

Loc = tuple[str | int, ...]


# YAML's merge key (`<<: *defaults`), which shares settings between entries or files' sections.
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key given twice in one mapping instead of keeping the last."""


def _construct_unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        # Keys brought in by a "<<: *anchor" merge may be overridden; only keys written twice are errors.
        if key_node.tag == _MERGE_TAG:
            continue
        key = loader.construct_object(key_node, deep=deep)
        try:
            repeated = key in seen
        except TypeError:
            continue  # an unhashable key; construct_mapping reports it
        if repeated:
            raise yaml.constructor.ConstructorError(
                None, None,
                f"the key {key!r} is given a second time (first on line {seen[key].start_mark.line + 1})",
                key_node.start_mark,
            )
        seen[key] = key_node
    return loader.construct_mapping(node, deep=deep)


# PyYAML keeps the last of two equal keys without a word; for a quota file that silently drops a
# limit the operator wrote, so every mapping goes through the duplicate check.
_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


@dataclass(frozen=True, slots=True)
class ConfigSource:
    """One file as read: its text and the mapping it holds."""

    path: str
    text: str
    data: dict[str, Any]


def read_config_file(path: str | Path) -> ConfigSource:
    """Read and parse one file; it must hold a non-empty mapping."""
    name = str(path)

    def fail(message: str, line: int | None = None, column: int | None = None) -> ConfigError:
        return ConfigError([ConfigProblem((name,), "", message, line, column)])

    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise fail("file not found") from None
    except IsADirectoryError:
        raise fail("is a directory, expected a YAML file") from None
    except UnicodeDecodeError as exc:
        raise fail(f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise fail(f"cannot read: {exc.strerror}") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        detail = " ".join(part for part in (exc.context, exc.problem) if part)
        kind = "YAML error" if isinstance(exc, yaml.constructor.ConstructorError) else "YAML syntax error"
        raise fail(
            f"{kind}: {detail}",
            mark.line + 1 if mark else None,
            mark.column + 1 if mark else None,
        ) from None
    except yaml.YAMLError as exc:
        raise fail(f"YAML syntax error: {exc}") from None
    if data is None:
        raise fail("the file is empty; expected a mapping of sections (proxy, upstream, quotas, ...)")
    if not isinstance(data, dict):
        raise fail(f"expected a mapping of sections (proxy, upstream, quotas, ...) at the top, got {_kind(data)}")
    return ConfigSource(name, text, data)


def load_config(paths: Sequence[str | Path]) -> KqpConfig:
    """Read, merge (later files win, lists replace) and validate the files."""
    if not paths:
        raise ConfigError([ConfigProblem((), "", "no configuration file given")])
    return validate_sources([read_config_file(path) for path in paths])


def validate_sources(sources: Sequence[ConfigSource]) -> KqpConfig:
    """Merge files already read and validate them into one KqpConfig; ConfigError lists every problem.

    Used by the loader, by the write-back (to check text before it replaces a file) and for the
    fleet's quota snapshots, so all three accept exactly the same configurations.
    """
    merged: dict[str, Any] = {}
    for source in sources:
        merged = merge(merged, _empty_sections_as_mappings(source.data))
    try:
        return KqpConfig.model_validate(_freeze(merged))
    except ValidationError as exc:
        raise ConfigError([_problem(error, merged, sources) for error in exc.errors()]) from None


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Deep merge: mappings merge key by key; anything else in `override` replaces."""
    result = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
            result[key] = merge(result[key], value)
        else:
            result[key] = value
    return result


def _empty_sections_as_mappings(data: dict[str, Any]) -> dict[str, Any]:
    # "quotas:" with everything under it commented out means an empty section.
    return {key: {} if value is None else value for key, value in data.items()}


def _freeze(value: Any) -> Any:
    # The models hold tuples (immutable), and strict validation takes only tuples for them.
    if isinstance(value, list):
        return tuple(_freeze(item) for item in value)
    if isinstance(value, dict):
        return {key: _freeze(item) for key, item in value.items()}
    return value


def _kind(value: object) -> str:
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    if value is None:
        return "nothing (null)"
    return f"{type(value).__name__} {value!r}"


def format_path(loc: Loc) -> str:
    """A field path as an operator writes it: `quotas.entries[2].entity`."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


def _problem(error: ErrorDetails, merged: dict[str, Any], sources: Sequence[ConfigSource]) -> ConfigProblem:
    """One pydantic error as a ConfigProblem: the file(s) to blame, the field path, line and column.

    Validation runs on the merged mapping, which has no positions; the file is found again by
    walking each source for the part of the path that exists there.
    """
    loc: Loc = tuple(part for part in error["loc"] if part != "[key]")
    context = error.get("ctx") or {}
    sub_path = context.get("sub_path")
    # A validator that checks inside a value (e.g. one entity of an entry) adds where in `sub_path`.
    if isinstance(sub_path, tuple):
        loc = loc + sub_path
    kind = error["type"]
    message = _message(error, loc)
    # Blame the deepest part of the path that is really there, in the last file that has it.
    present = _existing_prefix(merged, loc)
    owners = [source for source in sources if _has_path(source.data, present)]
    # A missing key is every contributing file's omission, unless it is inside a list (one file's).
    if kind == "missing" and len(owners) > 1 and not any(isinstance(part, int) for part in present):
        files = tuple(source.path for source in owners)
    elif owners:
        files = (owners[-1].path,)
    else:
        files = tuple(source.path for source in sources)
    line = column = None
    if owners:
        line, column = _position(owners[-1].text, present)
    return ConfigProblem(files, format_path(loc), message, line, column)


def _message(error: ErrorDetails, loc: Loc) -> str:
    """The reason in the operator's words: the YAML names and types, not pydantic's class names."""
    kind = error["type"]
    value = error.get("input")
    if kind == "extra_forbidden":
        key = loc[-1]
        allowed = _allowed_keys(loc[:-1])
        message = f"unknown key {key!r}"
        if allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            if close:
                message += f"; did you mean {close[0]!r}?"
            message += f" (expected one of: {', '.join(allowed)})"
        if key == "ip" and loc[-2:-1] == ("entity",):
            message += "; connection-rate quotas for IP addresses go in quotas.ip_entries"
        return message
    if kind == "missing":
        return "required key missing"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"expected a mapping, got {_kind(value)}"
    if kind == "tuple_type":
        return f"expected a list, got {_kind(value)}"
    if kind == "string_too_short":
        return "expected a non-empty text"
    if kind == "string_type" and isinstance(value, bool | int | float):
        # YAML reads no, on, 123 and 1.5 as booleans and numbers.
        return f"expected a string, got {value!r}; put the text in quotes"
    message = error["msg"].removeprefix("Value error, ")
    # Pydantic's "Input should be greater than 0" reads as "expected a value greater than 0".
    if message.startswith("Input should be "):
        rest = message.removeprefix("Input should be ")
        message = "expected " + ("a value " + rest if rest.startswith(("greater", "less")) else rest)
    if kind.startswith(("int_", "float_", "string_", "bool_", "greater", "less", "literal")):
        message += f", got {_kind(value) if isinstance(value, list | tuple | dict) or value is None else repr(value)}"
    return message


def _allowed_keys(loc: Loc) -> list[str]:
    """The keys the model at `loc` accepts, by their YAML names."""
    model: Any = KqpConfig
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return []
        field = next(
            (info for name, info in model.model_fields.items() if (info.alias or name) == part), None
        )
        if field is None:
            return []
        model = _inner_model(field.annotation)
    if isinstance(model, type) and issubclass(model, BaseModel):
        return [info.alias or name for name, info in model.model_fields.items()]
    return []


def _inner_model(annotation: Any) -> Any:
    # Unwrap `X | None` and `tuple[X, ...]` to reach X.
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, tuple, typing.Annotated):
        for arg in typing.get_args(annotation):
            inner = _inner_model(arg)
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                return inner
    return annotation


def _step(value: Any, part: str | int) -> tuple[bool, Any]:
    """One step down a parsed document: (found, value). Keys compare as text too, since YAML reads
    an unquoted `1` as an int while the error path may hold the string.
    """
    if isinstance(value, Mapping):
        for key, item in value.items():
            if key == part or str(key) == str(part):
                return True, item
        return False, None
    if isinstance(value, list | tuple) and isinstance(part, int) and 0 <= part < len(value):
        return True, value[part]
    return False, None


def _existing_prefix(data: Any, loc: Loc) -> Loc:
    """The longest start of `loc` that exists in `data`: where to point when a key is missing."""
    value = data
    for depth, part in enumerate(loc):
        found, value = _step(value, part)
        if not found:
            return loc[:depth]
    return loc


def _has_path(data: Any, loc: Loc) -> bool:
    return _existing_prefix(data, loc) == loc


def line_of(source: ConfigSource, loc: Loc) -> int | None:
    """1-based line of the key (or list item) at `loc` in a file, if it is there."""
    return _position(source.text, loc)[0]


def _position(text: str, loc: Loc) -> tuple[int | None, int | None]:
    """1-based line and column of the key (or list item) at `loc` in the YAML text."""
    try:
        # Composing (not loading) keeps each node's start mark, which the loaded dicts no longer have.
        node = yaml.compose(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.YAMLError:
        return None, None
    mark = node.start_mark if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if str(k.value) == str(part)), None)
            if match is None:
                break
            mark, node = match[0].start_mark, match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            mark = node.start_mark
        else:
            break
    if mark is None:
        return None, None
    return mark.line + 1, mark.column + 1
