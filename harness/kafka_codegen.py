"""Generate kqp's Kafka codec from Kafka's JSON message definitions.

    python -m harness.kafka_codegen          # rewrite kqp/protocol/generated/
    python -m harness.kafka_codegen --check  # fail if the committed modules are not what the JSON gives

`make kafka-messages` refreshes the JSON (and errors.tsv, Kafka's error names) from the
kafka-clients jar and runs this; the unit test tests/unit/protocol/test_generated_codec.py
regenerates in memory and fails when a committed module differs, so the modules always match
the definitions beside them.

Written, each module marked generated on its first line: kqp/protocol/generated/__init__.py,
the table of APIs (name, module, versions, first flexible version) and Kafka's error names;
per API, messages/<api>.py (its request and response classes, decoders and encoders) and
walks/<api>.py (its responses' skippers and error-code collectors); messages/ holds the
request and response headers too. kqp.protocol.apis imports an API's modules on first use,
so a proxy loads only the APIs its traffic uses, and nothing reads the JSON at run time.

What is generated, per message and per API version, as straight-line functions (no schema is
interpreted at run time):
- a class per struct (fields as slots, named as kafka-python names them), with a decoder and an
  encoder per version; versions whose wire layout is the same share one function;
- for every response version, where ThrottleTimeMs sits: a constant offset from the start of
  the body when every field before it has a fixed size, else a skipper that walks the fields
  before it without decoding them (one-byte varints read inline: Produce's comes once per
  produce request); and likewise the NodeEndpoints of ShareFetch and ShareAcknowledge and the
  top-level tagged fields of Produce and Fetch (LOCATED_FIELDS);
- for every response version, a collector of every non-zero ErrorCode (the metrics), in the
  order of the decoded message's dict form.

Every skipper and collector makes the checks of the interpreted walk it replaced
(kqp.protocol.schema_walk), so that on any bytes both give the same result or both fail: an
array's count against the bytes left, a string's end against the buffer's; fixed-size fields
are skipped unread (callers check the final offset).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFINITIONS = ROOT / "kqp" / "protocol" / "kafka_message_definitions"
OUTPUT = ROOT / "kqp" / "protocol" / "generated"
_COMMENT = re.compile(r"(?m)^\s*//.*\n?")
# Top-level fields whose offset the proxy reads or writes in place, by message name.
# TAG_SECTION stands for the top-level tagged-field section (after every other field), where
# Produce and Fetch responses carry NodeEndpoints (KIP-951).
TAG_SECTION = "TaggedFields"
LOCATED_FIELDS: dict[str, tuple[str, ...]] = {
    "ShareFetchResponse": ("NodeEndpoints",),
    "ShareAcknowledgeResponse": ("NodeEndpoints",),
    "ProduceResponse": (TAG_SECTION,),
    "FetchResponse": (TAG_SECTION,),
}
THROTTLE = "ThrottleTimeMs"
FIXED = {"bool": ("?", 1), "int8": ("b", 1), "int16": ("h", 2), "uint16": ("H", 2), "int32": ("i", 4),
         "uint32": ("I", 4), "int64": ("q", 8), "float64": ("d", 8), "uuid": ("16s", 16)}


def snake(name: str) -> str:
    """kafka-python's attribute name for a field (so code reads the same against either)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def versions(text: str | None) -> tuple[int, int] | None:
    if text is None or text.strip() in ("", "none"):
        return None
    text = text.strip()
    if text.endswith("+"):
        return int(text[:-1]), 32767
    if "-" in text:
        low, high = text.split("-")
        return int(low), int(high)
    return int(text), int(text)


def in_versions(text: str | None, version: int) -> bool:
    bounds = versions(text)
    return bounds is not None and bounds[0] <= version <= bounds[1]


def load(path: Path) -> dict[str, Any]:
    definition: dict[str, Any] = json.loads(_COMMENT.sub("", path.read_text()))
    return definition


@dataclass
class Struct:
    """One struct of a message (the message itself is the outermost), and its Python class."""

    name: str
    class_name: str
    fields: list[dict[str, Any]]
    children: list[Struct] = field(default_factory=list)


def _is_error_code(spec: Mapping[str, Any]) -> bool:
    return bool(spec["name"] == "ErrorCode" and spec["type"] == "int16")


def _default(spec: Mapping[str, Any], structs: dict[str, Struct]) -> str:
    """The Python expression of a field's default (a callable where a fresh value is needed)."""
    type_name = str(spec["type"])
    default = spec.get("default", "")
    if default == "null":
        return "None"
    if type_name.startswith("[]"):
        return "list"
    if type_name == "bool":
        return "True" if str(default).lower() == "true" else "False"
    if type_name in ("int8", "int16", "uint16", "int32", "uint32", "int64"):
        text = str(default)
        return str(int(text, 16) if text.lower().startswith(("0x", "-0x")) else int(text)) if text else "0"
    if type_name == "float64":
        return repr(float(default)) if default else "0.0"
    if type_name == "uuid":
        return "_ZERO_UUID"
    if type_name == "string":
        return repr(str(default))
    if type_name in ("bytes", "records"):
        return "b''" if type_name == "bytes" else "None"
    if spec.get("tag") is not None:
        return "None"
    return structs[type_name].class_name


class Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.indent = 1
        self.counter = 0

    def line(self, text: str) -> None:
        self.lines.append("    " * self.indent + text)

    def fresh(self, stem: str) -> str:
        self.counter += 1
        return f"{stem}{self.counter}"


_KIND_WORDS = {"d": "decode", "e": "encode", "s": "skip", "c": "collect"}


class Generator:
    def __init__(self) -> None:
        self.out: list[str] = []
        self.structs_fmt: dict[str, str] = {}
        self.functions: dict[str, str] = {}  # body -> name, so identical layouts share one function
        self.function_count = 0
        self.names: set[str] = set()

    # ---- shared constants -------------------------------------------------------------------
    def struct_const(self, fmt: str) -> str:
        if fmt not in self.structs_fmt:
            self.structs_fmt[fmt] = "_S_" + fmt.lstrip(">").replace("16s", "u").replace("?", "o")
        return self.structs_fmt[fmt]

    def function(self, kind: str, signature: str, body: list[str], doc: str) -> str:
        key = kind + signature + "\n".join(body)
        if key in self.functions:
            return self.functions[key]
        # Named after what it does and the first message and version it serves (versions with
        # the same layout share it), e.g. _decode_ProduceRequest_v3, _skip_ProduceResponse_v3_ThrottleTimeMs.
        name = f"_{_KIND_WORDS[kind]}_{re.sub(r'[^0-9A-Za-z]+', '_', doc).strip('_')}"
        if name in self.names:
            self.function_count += 1
            name = f"{name}_{self.function_count}"
        self.names.add(name)
        self.functions[key] = name
        self.out.append(f"def {name}{signature}:")
        self.out.extend(body)
        self.out.append("")
        self.out.append("")
        return name

    # ---- structs ----------------------------------------------------------------------------
    def collect_structs(self, message: dict[str, Any]) -> tuple[Struct, dict[str, Struct]]:
        name = str(message["name"])
        structs: dict[str, Struct] = {}
        for common in message.get("commonStructs", ()):
            structs[common["name"]] = Struct(common["name"], f"{name}_{common['name']}", common["fields"])

        def visit(owner: Struct) -> None:
            for spec in owner.fields:
                if "fields" in spec:
                    struct_name = str(spec["type"]).removeprefix("[]")
                    child = Struct(struct_name, f"{name}_{struct_name}", spec["fields"])
                    structs[struct_name] = child
                    owner.children.append(child)
                    visit(child)
        root = Struct(name, name, message.get("fields", []))
        for common in list(structs.values()):
            visit(common)
        visit(root)
        return root, structs

    def field_flexible(self, spec: Mapping[str, Any], flexible: bool, version: int) -> bool:
        if "flexibleVersions" in spec:
            return in_versions(spec["flexibleVersions"], version)
        return flexible

    def decoder(self, struct: Struct, structs: dict[str, Struct], version: int, flexible: bool) -> str:
        w = Writer()
        present = [f for f in struct.fields if in_versions(f.get("versions"), version)]
        tagged = [f for f in present if in_versions(f.get("taggedVersions"), version)]
        wire = [f for f in present if f not in tagged]
        w.line(f"m = _new({struct.class_name})")
        w.line("m.unknown_tags = None")
        for spec in struct.fields:
            if spec not in wire:
                default = _default(spec, structs)
                value = f"{default}()" if default == "list" or default in {s.class_name for s in structs.values()} \
                    else default
                w.line(f"m.{snake(spec['name'])} = {value}")
        run: list[Mapping[str, Any]] = []

        def flush() -> None:
            if not run:
                return
            fmt = ">" + "".join(FIXED[str(f["type"])][0] for f in run)
            size = sum(FIXED[str(f["type"])][1] for f in run)
            const = self.struct_const(fmt)
            targets = [f"m.{snake(f['name'])}" if f["type"] != "uuid" else f"_u{i}" for i, f in enumerate(run)]
            w.line(f"{', '.join(targets)}{',' if len(run) == 1 else ''} = {const}.unpack_from(b, o)")
            for i, f in enumerate(run):
                if f["type"] == "uuid":
                    w.line(f"m.{snake(f['name'])} = _read_uuid(_u{i})")
            w.line(f"o += {size}")
            run.clear()

        for spec in wire:
            if str(spec["type"]) in FIXED:
                run.append(spec)
                continue
            flush()
            self.read_value(w, f"m.{snake(spec['name'])}", spec, structs, version,
                            self.field_flexible(spec, flexible, version))
        flush()
        if flexible:
            w.line("if b[o] == 0:")
            w.line("    o += 1")
            w.line("else:")
            w.indent += 1
            w.line("n, o = _read_uvarint(b, o)")
            w.line("for _ in range(n):")
            w.indent += 1
            w.line("t, o, e = _tagged_field_end(b, o)")
            keyword = "if"
            for spec in sorted(tagged, key=lambda f: int(f["tag"])):
                w.line(f"{keyword} t == {int(spec['tag'])}:")
                w.indent += 1
                self.read_value(w, f"m.{snake(spec['name'])}", spec, structs, version, True)
                w.line("_check_tag_end(t, o, e)")
                w.indent -= 1
                keyword = "elif"
            if tagged:
                w.line("else:")
                w.indent += 1
            w.line("if m.unknown_tags is None:")
            w.line("    m.unknown_tags = {}")
            w.line("m.unknown_tags[t] = bytes(b[o:e])")
            if tagged:
                w.indent -= 1
            w.line("o = e")
            w.indent -= 2
        w.line("return m, o")
        return self.function("d", "(b: _Buffer, o: int) -> tuple[Any, int]", w.lines,
                             f"{struct.class_name} v{version}")

    def read_value(self, w: Writer, target: str, spec: Mapping[str, Any], structs: dict[str, Struct],
                   version: int, flexible: bool) -> None:
        type_name = str(spec["type"])
        nullable = in_versions(spec.get("nullableVersions"), version)
        if type_name.startswith("[]"):
            element = type_name[2:]
            n = w.fresh("n")
            if flexible:  # a one-byte count (nearly all of them) read inline
                w.line(f"{n} = b[o] - 1")
                w.line(f"if 0 <= {n} < 0x7F and {n} <= len(b) - o - 1:")
                w.line("    o += 1")
                w.line("else:")
                w.line(f"    {n}, o = _compact_count(b, o)")
            else:
                w.line(f"{n}, o = _count(b, o)")
            w.line(f"if {n} < 0:")
            w.line(f"    {target} = None")
            w.line("else:")
            w.indent += 1
            if element in FIXED and element != "uuid":
                fmt, size = FIXED[element]
                w.line(f"{target} = list(_unpack_from(f'>{{{n}}}{fmt}', b, o))")
                w.line(f"o += {n} * {size}")
            else:
                items = w.fresh("items")
                w.line(f"{items} = []")
                w.line(f"for _ in range({n}):")
                w.indent += 1
                value = w.fresh("v")
                self.read_scalar_or_struct(w, value, element, structs, version, flexible, nullable=False)
                w.line(f"{items}.append({value})")
                w.indent -= 1
                w.line(f"{target} = {items}")
            w.indent -= 1
            return
        if type_name in structs and nullable:
            w.line("if b[o] != 1:")
            w.line("    if b[o] != 0xFF:")
            w.line("        raise _bad_nullable(b[o])")
            w.line(f"    {target} = None")
            w.line("    o += 1")
            w.line("else:")
            w.indent += 1
            self.read_scalar_or_struct(w, target, type_name, structs, version, flexible, nullable=False, skip=1)
            w.indent -= 1
            return
        self.read_scalar_or_struct(w, target, type_name, structs, version, flexible, nullable)

    def read_scalar_or_struct(self, w: Writer, target: str, type_name: str, structs: dict[str, Struct],
                              version: int, flexible: bool, nullable: bool, skip: int = 0) -> None:
        at = f"o + {skip}" if skip else "o"
        if type_name in FIXED:
            fmt, size = FIXED[type_name]
            const = self.struct_const(">" + fmt)
            if type_name == "uuid":
                w.line(f"{target} = _read_uuid({const}.unpack_from(b, {at})[0])")
            else:
                w.line(f"{target} = {const}.unpack_from(b, {at})[0]")
            w.line(f"o += {size + skip}")
        elif type_name == "string" and flexible and not skip:
            # A short string (one-byte length, nearly all of them) read inline.
            length = w.fresh("length")
            w.line(f"{length} = b[o]")
            w.line(f"if 1 < {length} < 0x80 and o + {length} <= len(b):")
            w.line(f"    {target} = str(b[o + 1:o + {length}], 'utf-8')")
            w.line(f"    o += {length}")
            w.line("else:")
            w.line(f"    {target}, o = _compact_string(b, o)")
        elif type_name == "string":
            w.line(f"{target}, o = {'_compact_string' if flexible else '_string'}(b, {at})")
        elif type_name in ("bytes", "records"):
            w.line(f"{target}, o = {'_compact_blob' if flexible else '_blob'}(b, {at})")
        else:
            decoder = self.decoder(structs[type_name], structs, version, flexible)
            w.line(f"{target}, o = {decoder}(b, {at})")

    # ---- encoders ---------------------------------------------------------------------------
    def encoder(self, struct: Struct, structs: dict[str, Struct], version: int, flexible: bool) -> str:
        w = Writer()
        present = [f for f in struct.fields if in_versions(f.get("versions"), version)]
        tagged = [f for f in present if in_versions(f.get("taggedVersions"), version)]
        wire = [f for f in present if f not in tagged]
        run: list[Mapping[str, Any]] = []

        def flush() -> None:
            if not run:
                return
            fmt = ">" + "".join(FIXED[str(f["type"])][0] for f in run)
            values = [f"_uuid_bytes(m.{snake(f['name'])})" if f["type"] == "uuid" else f"m.{snake(f['name'])}"
                      for f in run]
            w.line(f"w += {self.struct_const(fmt)}.pack({', '.join(values)})")
            run.clear()

        for spec in wire:
            if str(spec["type"]) in FIXED:
                run.append(spec)
                continue
            flush()
            self.write_value(w, "w", f"m.{snake(spec['name'])}", spec, structs, version,
                             self.field_flexible(spec, flexible, version))
        flush()
        if flexible:
            if not tagged:
                w.line("if m.unknown_tags:")
                w.line("    _write_tags(w, [], m.unknown_tags)")
                w.line("else:")
                w.line("    w.append(0)")
            else:
                w.line("tags: list[tuple[int, bytes | bytearray]] = []")
                for spec in sorted(tagged, key=lambda f: int(f["tag"])):
                    name = f"m.{snake(spec['name'])}"
                    default = _default(spec, structs)
                    if default == "list":
                        condition = f"{name}"
                    elif default == "None":
                        condition = f"{name} is not None"
                    elif default == "_ZERO_UUID":
                        condition = f"{name} is not None and {name} != _ZERO_UUID"
                    else:
                        condition = f"{name} != {default}"
                    w.line(f"if {condition}:")
                    w.indent += 1
                    w.line("t = bytearray()")
                    self.write_value(w, "t", name, spec, structs, version, True)
                    w.line(f"tags.append(({int(spec['tag'])}, t))")
                    w.indent -= 1
                w.line("_write_tags(w, tags, m.unknown_tags)")
        if not w.lines:
            w.line("pass")
        return self.function("e", "(m: Any, w: bytearray) -> None", w.lines, f"{struct.class_name} v{version}")

    def write_value(self, w: Writer, out: str, value: str, spec: Mapping[str, Any], structs: dict[str, Struct],
                    version: int, flexible: bool) -> None:
        type_name = str(spec["type"])
        nullable = in_versions(spec.get("nullableVersions"), version)
        if type_name.startswith("[]"):
            element = type_name[2:]
            items = w.fresh("items")
            w.line(f"{items} = {value}")
            w.line(f"{'_write_compact_count' if flexible else '_write_count'}({out}, {items})")
            if element in FIXED and element != "uuid":
                w.line(f"if {items}:")
                w.line(f"    {out} += _pack(f'>{{len({items})}}{FIXED[element][0]}', *{items})")
                return
            item = w.fresh("item")
            w.line(f"for {item} in {items} or ():")
            w.indent += 1
            self.write_scalar_or_struct(w, out, item, element, structs, version, flexible)
            w.indent -= 1
            return
        if type_name in structs and nullable:
            w.line(f"if {value} is None:")
            w.line(f"    {out}.append(0xFF)")
            w.line("else:")
            w.indent += 1
            w.line(f"{out}.append(1)")
            self.write_scalar_or_struct(w, out, value, type_name, structs, version, flexible)
            w.indent -= 1
            return
        self.write_scalar_or_struct(w, out, value, type_name, structs, version, flexible)

    def write_scalar_or_struct(self, w: Writer, out: str, value: str, type_name: str, structs: dict[str, Struct],
                               version: int, flexible: bool) -> None:
        if type_name in FIXED:
            const = self.struct_const(">" + FIXED[type_name][0])
            packed = f"_uuid_bytes({value})" if type_name == "uuid" else value
            w.line(f"{out} += {const}.pack({packed})")
        elif type_name == "string":
            w.line(f"{'_write_compact_string' if flexible else '_write_string'}({out}, {value})")
        elif type_name in ("bytes", "records"):
            w.line(f"{'_write_compact_blob' if flexible else '_write_blob'}({out}, {value})")
        else:
            encoder = self.encoder(structs[type_name], structs, version, flexible)
            w.line(f"{encoder}({value}, {out})")

    # ---- skippers (where a top-level field sits) -------------------------------------------
    def skipper(self, message: str, target: str, fields: list[dict[str, Any]], structs: dict[str, Struct],
                version: int, flexible: bool) -> str | int | None:
        """A constant offset, the name of a skipper function, or None when the version lacks the field."""
        before: list[Mapping[str, Any]] = []
        for spec in fields:
            if not in_versions(spec.get("versions"), version) or in_versions(spec.get("taggedVersions"), version):
                continue
            if spec["name"] == target:
                break
            before.append(spec)
        else:
            if target != TAG_SECTION or not flexible:
                return None
        sizes = [self.fixed_size(spec, structs, version) for spec in before]
        if all(size is not None for size in sizes):
            return sum(size for size in sizes if size is not None)
        w = Writer()
        w.line("end = len(b)")
        pending = 0
        for wanted in before:
            size = self.fixed_size(wanted, structs, version)
            if size is not None:
                pending += size
                continue
            if pending:
                w.line(f"o += {pending}")
                pending = 0
            self.skip_value(w, wanted, structs, version, self.field_flexible(wanted, flexible, version))
        w.line(f"return o + {pending}" if pending else "return o")
        return self.function("s", "(b: _Buffer, o: int) -> int", w.lines, f"{message} v{version}: {target}")

    def fixed_size(self, spec: Mapping[str, Any], structs: dict[str, Struct], version: int) -> int | None:
        """The size of a field of a fixed-size type; None for the rest, structs included (walked)."""
        type_name = str(spec["type"])
        return FIXED[type_name][1] if type_name in FIXED else None

    def struct_fixed(self, struct: Struct, structs: dict[str, Struct], version: int, flexible: bool) -> int | None:
        if flexible:
            return None
        total = 0
        for spec in struct.fields:
            if not in_versions(spec.get("versions"), version):
                continue
            type_name = str(spec["type"])
            if type_name in FIXED:
                total += FIXED[type_name][1]
            elif type_name in structs and not in_versions(spec.get("nullableVersions"), version):
                size = self.struct_fixed(structs[type_name], structs, version, flexible)
                if size is None:
                    return None
                total += size
            else:
                return None
        return total

    def skip_value(self, w: Writer, spec: Mapping[str, Any], structs: dict[str, Struct], version: int,
                   flexible: bool) -> None:
        """Code that moves `o` past one field, reading only lengths and counts. The checks are the
        schema walk's (kqp.protocol.schema_walk): a count against the bytes left, a string's end
        against the buffer's; fixed sizes are skipped unread (the caller checks the final offset)."""
        type_name = str(spec["type"])
        if type_name.startswith("[]"):
            element = type_name[2:]
            n = w.fresh("n")
            self.skip_count(w, n, flexible)
            size = FIXED[element][1] if element in FIXED else (
                self.struct_fixed(structs[element], structs, version, flexible) if element in structs else None)
            if size is not None:
                w.line(f"if {n} > 0:")
                w.line(f"    o += {n} * {size}")
                return
            w.line(f"for _ in range({n}):")
            w.indent += 1
            if element in structs:
                self.skip_struct(w, structs[element], structs, version, flexible)
            else:
                self.skip_blob(w, element, flexible)
            w.indent -= 1
            return
        if type_name in FIXED:
            w.line(f"o += {FIXED[type_name][1]}")
        elif type_name in structs:
            if in_versions(spec.get("nullableVersions"), version):
                w.line("if b[o] == 0xFF:")
                w.line("    o += 1")
                w.line("else:")
                w.indent += 1
                w.line("o += 1")
                self.skip_struct(w, structs[type_name], structs, version, flexible)
                w.indent -= 1
            else:
                self.skip_struct(w, structs[type_name], structs, version, flexible)
        else:
            self.skip_blob(w, type_name, flexible)

    def skip_struct(self, w: Writer, struct: Struct, structs: dict[str, Struct], version: int,
                    flexible: bool) -> None:
        pending = 0
        for spec in struct.fields:
            if not in_versions(spec.get("versions"), version) or in_versions(spec.get("taggedVersions"), version):
                continue
            size = self.fixed_size(spec, structs, version)
            if size is not None:
                pending += size
                continue
            if pending:
                w.line(f"o += {pending}")
                pending = 0
            self.skip_value(w, spec, structs, version, self.field_flexible(spec, flexible, version))
        if pending:
            w.line(f"o += {pending}")
        if flexible:
            w.line("o = o + 1 if b[o] == 0 else _skip_tagged_fields(b, o)")

    def skip_count(self, w: Writer, n: str, flexible: bool) -> None:
        if flexible:
            w.line(f"{n} = b[o]")
            w.line(f"if {n} < 0x80:")
            w.line(f"    {n} -= 1")
            w.line("    o += 1")
            w.line("else:")
            w.line(f"    {n}, o = _read_uvarint(b, o)")
            w.line(f"    {n} -= 1")
        else:
            w.line(f"{n} = _INT32.unpack_from(b, o)[0]")
            w.line("o += 4")
            w.line(f"if {n} < -1:")
            w.line(f"    raise _ProtocolDecodeError(f'invalid array length {{{n}}}')")
        w.line(f"if {n} > end - o:")
        w.line(f"    raise _ProtocolDecodeError(f'array of {{{n}}} elements in {{end - o}} bytes')")

    def skip_blob(self, w: Writer, type_name: str, flexible: bool) -> None:
        """A string (int16 length) or bytes (int32 length); -1 (0 when compact) is null."""
        length = w.fresh("length")
        if flexible:
            w.line(f"{length} = b[o]")
            w.line(f"if {length} < 0x80:")
            w.line(f"    {length} -= 1")
            w.line("    o += 1")
            w.line("else:")
            w.line(f"    {length}, o = _read_uvarint(b, o)")
            w.line(f"    {length} -= 1")
        else:
            const = "_INT16" if type_name == "string" else "_INT32"
            w.line(f"{length} = {const}.unpack_from(b, o)[0]")
            w.line(f"o += {2 if type_name == 'string' else 4}")
            w.line(f"if {length} < -1:")
            w.line(f"    raise _ProtocolDecodeError(f'invalid length {{{length}}}')")
        w.line(f"if {length} > 0:")
        w.line(f"    o += {length}")
        w.line("    if o > end:")
        w.line("        raise _ProtocolDecodeError('field runs past the end of the message')")

    # ---- error-code collectors --------------------------------------------------------------
    def carries_error_code(self, spec: Mapping[str, Any], structs: dict[str, Struct], version: int) -> bool:
        """Whether the field is, or holds at some depth, an ErrorCode present at this version."""
        if not in_versions(spec.get("versions"), version):
            return False
        if _is_error_code(spec):
            return True
        struct = structs.get(str(spec["type"]).removeprefix("[]"))
        return struct is not None and any(self.carries_error_code(f, structs, version) for f in struct.fields)

    def collector(self, message: str, struct: Struct, structs: dict[str, Struct], version: int,
                  flexible: bool) -> str | int:
        """A function (buffer, offset, found) -> offset after the struct, appending every non-zero
        ErrorCode to `found` in the order of the decoded message's dict form (kqp.protocol.wire's
        to_dict): a struct's own code first, then the code-bearing fields as declared, tagged ones
        included; or the struct's size when it has no codes and a fixed size."""
        if not any(self.carries_error_code(f, structs, version) for f in struct.fields):
            size = self.struct_fixed(struct, structs, version, flexible)
            if size is not None:
                return size
        w = Writer()
        w.line("end = len(b)")
        self.collect_struct(w, message, struct, structs, version, flexible, "found")
        w.line("return o")
        return self.function("c", "(b: _Buffer, o: int, found: list[int]) -> int", w.lines,
                             f"{message} v{version}: error codes")

    def value_collector(self, message: str, spec: Mapping[str, Any], structs: dict[str, Struct],
                        version: int) -> str:
        """A collector over one tagged field's value (its own buffer: the value's bytes)."""
        w = Writer()
        w.line("end = len(b)")
        self.collect_value(w, message, spec, structs, version, True, "found")
        w.line("return o")
        return self.function("c", "(b: _Buffer, o: int, found: list[int]) -> int", w.lines,
                             f"{message} v{version}: error codes")

    def collect_struct(self, w: Writer, message: str, struct: Struct, structs: dict[str, Struct], version: int,
                       flexible: bool, target: str) -> None:
        present = [f for f in struct.fields if in_versions(f.get("versions"), version)]
        tagged = [f for f in present if in_versions(f.get("taggedVersions"), version)]
        wire = [f for f in present if f not in tagged]
        bearing = sorted((f for f in present if self.carries_error_code(f, structs, version)),
                         key=lambda f: not _is_error_code(f))
        in_order = not [f for f in bearing if f in tagged] and [f for f in wire if f in bearing] == bearing
        # Out of wire order, each code-bearing field collects into its own list, joined at the end.
        slots = {id(f): (target if in_order else w.fresh("codes")) for f in bearing}
        if not in_order:
            for f in bearing:
                w.line(f"{slots[id(f)]}: list[int] = []")
        pending = 0
        for spec in wire:
            if id(spec) not in slots:
                size = self.fixed_size(spec, structs, version)
                if size is not None:
                    pending += size
                    continue
            if pending:
                w.line(f"o += {pending}")
                pending = 0
            field_flexible = self.field_flexible(spec, flexible, version)
            if id(spec) not in slots:
                self.skip_value(w, spec, structs, version, field_flexible)
            elif _is_error_code(spec):
                code = w.fresh("code")
                w.line(f"{code} = _INT16.unpack_from(b, o)[0]")
                w.line(f"if {code}:")
                w.line(f"    {slots[id(spec)]}.append({code})")
                pending = 2
            else:
                self.collect_value(w, message, spec, structs, version, field_flexible, slots[id(spec)])
        if pending:
            w.line(f"o += {pending}")
        bearing_tags = sorted((f for f in bearing if f in tagged), key=lambda f: int(f["tag"]))
        if flexible and not bearing_tags:
            w.line("o = o + 1 if b[o] == 0 else _skip_tagged_fields(b, o)")
        elif flexible:
            # A tagged value is walked within its size, as the schema walk bounds it.
            n = w.fresh("n")
            w.line(f"{n}, o = _read_uvarint(b, o)")
            w.line(f"for _ in range({n}):")
            w.indent += 1
            w.line("t, o, e = _tagged_field_end(b, o)")
            keyword = "if"
            for spec in bearing_tags:
                function = self.value_collector(f"{message} tag {spec['tag']}", spec, structs, version)
                w.line(f"{keyword} t == {int(spec['tag'])}:")
                w.line(f"    if {function}(_memoryview(b)[:e], o, {slots[id(spec)]}) > e:")
                w.line(f"        raise _ProtocolDecodeError('tagged field {int(spec['tag'])} runs past its size')")
                keyword = "elif"
            w.line("o = e")
            w.indent -= 1
        if not in_order:
            for f in bearing:
                w.line(f"{target} += {slots[id(f)]}")

    def collect_value(self, w: Writer, message: str, spec: Mapping[str, Any], structs: dict[str, Struct],
                      version: int, flexible: bool, target: str) -> None:
        type_name = str(spec["type"])
        if _is_error_code(spec):  # a tagged ErrorCode of its own
            code = w.fresh("code")
            w.line(f"{code} = _INT16.unpack_from(b, o)[0]")
            w.line(f"if {code}:")
            w.line(f"    {target}.append({code})")
            w.line("o += 2")
            return
        struct = structs[type_name.removeprefix("[]")]
        if type_name.startswith("[]"):
            n = w.fresh("n")
            self.skip_count(w, n, flexible)
            w.line(f"for _ in range({n}):")
            w.indent += 1
            self.collect_struct(w, message, struct, structs, version, flexible, target)
            w.indent -= 1
        elif in_versions(spec.get("nullableVersions"), version):
            w.line("if b[o] == 0xFF:")
            w.line("    o += 1")
            w.line("else:")
            w.indent += 1
            w.line("o += 1")
            self.collect_struct(w, message, struct, structs, version, flexible, target)
            w.indent -= 1
        else:
            self.collect_struct(w, message, struct, structs, version, flexible, target)

    # ---- the module -------------------------------------------------------------------------
    def message(self, definition: dict[str, Any], assignments: list[str]) -> Iterator[str]:
        """Class definitions of one message; what refers to functions goes to `assignments`,
        which the module places after them (functions go to self.out)."""
        root, structs = self.collect_structs(definition)
        valid = versions(definition.get("validVersions"))
        flexible_from = versions(definition.get("flexibleVersions"))
        all_structs = [*structs.values(), root] if root.name not in structs else list(structs.values())
        for struct in all_structs:
            names = [snake(f["name"]) for f in struct.fields]
            yield f"class {struct.class_name}(_Message):"
            yield f"    __slots__ = ({''.join(repr(n) + ', ' for n in names)})"
            yield f"    FIELDS = ({''.join(repr(n) + ', ' for n in names)})"
            yield ""
            yield ""
        for struct in all_structs:
            defaults = [_default(f, structs) for f in struct.fields]
            assignments.append(f"{struct.class_name}.DEFAULTS = ({''.join(d + ', ' for d in defaults)})")
            for child in struct.children:
                assignments.append(f"{struct.class_name}.{child.name} = {child.class_name}")
        for struct in structs.values():
            if struct not in root.children:
                assignments.append(f"{root.class_name}.{struct.name} = {struct.class_name}")
        if valid is None:
            return
        decoders: dict[int, str] = {}
        encoders: dict[int, str] = {}
        for version in range(valid[0], valid[1] + 1):
            flexible = flexible_from is not None and version >= flexible_from[0]
            decoders[version] = self.decoder(root, structs, version, flexible)
            encoders[version] = self.encoder(root, structs, version, flexible)
        assignments.append(f"{root.class_name}.DECODERS = {{{', '.join(f'{v}: {n}' for v, n in decoders.items())}}}")
        assignments.append(f"{root.class_name}.ENCODERS = {{{', '.join(f'{v}: {n}' for v, n in encoders.items())}}}")
        assignments.append("")

    def error_collectors(self, definition: dict[str, Any]) -> dict[int, str | int]:
        root, structs = self.collect_structs(definition)
        valid = versions(definition.get("validVersions"))
        flexible_from = versions(definition.get("flexibleVersions"))
        found: dict[int, str | int] = {}
        if valid is None:
            return found
        for version in range(valid[0], valid[1] + 1):
            flexible = flexible_from is not None and version >= flexible_from[0]
            found[version] = self.collector(root.name, root, structs, version, flexible)
        return found

    def locations(self, definition: dict[str, Any], target: str) -> dict[int, str | int | None]:
        root, structs = self.collect_structs(definition)
        valid = versions(definition.get("validVersions"))
        flexible_from = versions(definition.get("flexibleVersions"))
        found: dict[int, str | int | None] = {}
        if valid is None:
            return found
        for version in range(valid[0], valid[1] + 1):
            flexible = flexible_from is not None and version >= flexible_from[0]
            found[version] = self.skipper(root.name, target, root.fields, structs, version, flexible)
        return found


GENERATED_MARK = ("# Generated by harness/kafka_codegen.py from kqp/protocol/kafka_message_definitions: DO NOT EDIT.\n"
                  "# Regenerate with `make kafka-messages` (or `python -m harness.kafka_codegen`).\n")

HEADER = GENERATED_MARK + '''"""{what}, Kafka {kafka_version}.

{detail}
"""

# ruff: noqa
{mypy}from __future__ import annotations

from struct import Struct as _Struct, pack as _pack, unpack_from as _unpack_from
from typing import Any

_memoryview = memoryview

from kqp.protocol.errors import ProtocolDecodeError as _ProtocolDecodeError
from kqp.protocol.wire import (
    INT16 as _INT16,
    INT32 as _INT32,
    ZERO_UUID as _ZERO_UUID,
    Buffer as _Buffer,
    Message as _Message,
    bad_nullable as _bad_nullable,
    blob as _blob,
    check_tag_end as _check_tag_end,
    compact_blob as _compact_blob,
    compact_count as _compact_count,
    compact_string as _compact_string,
    count as _count,
    read_uuid as _read_uuid,
    read_uvarint as _read_uvarint,
    skip_tagged_fields as _skip_tagged_fields,
    string as _string,
    tagged_field_end as _tagged_field_end,
    uuid_bytes as _uuid_bytes,
    write_blob as _write_blob,
    write_compact_blob as _write_compact_blob,
    write_compact_count as _write_compact_count,
    write_compact_string as _write_compact_string,
    write_count as _write_count,
    write_string as _write_string,
    write_tags as _write_tags,
)

_new = object.__new__
'''

CODEC_DETAIL = """Decoders take (buffer, offset) and return (message, next offset); encoders append a message to
a bytearray. `REQUEST` and `RESPONSE` name the API's two message classes."""

WALKS_DETAIL = """Read without decoding, for each response version: where ThrottleTimeMs sits (an offset from
the start of the body, a skipper (buffer, body offset) -> offset that reads only lengths and
counts, or None when the version has none); other top-level fields the proxy finds in place
(`FIELD_LOCATIONS`, by field, alike); and a collector (buffer, offset, found) -> offset after
the body of every non-zero ErrorCode, or the body's size when it has no codes."""

PACKAGE_DOC = '"""{what}\n\n{detail}\n"""\n'

CATALOGUE_DETAIL = """Each API's codec is in kqp.protocol.generated.messages.<module>, its response walks in
kqp.protocol.generated.walks.<module>; kqp.protocol.apis imports them the first time an API is
met, so a proxy loads only the APIs its traffic uses and no definition is parsed at run time."""


def module_name(api_name: str) -> str:
    """The Python module of one API (or header): Produce -> produce, SaslHandshake -> sasl_handshake."""
    return snake(api_name)


# The message codecs are left out of mypy's checks; the walks are checked (they pass mypy --strict)
# because mypyc compiles Produce's (kqp/compiled_modules.py), and mypyc compiles a module whose
# errors mypy ignores into functions that only abort.
CHECKED_BY_MYPY = "# The walks are type-checked: mypyc compiles some of them (kqp/compiled_modules.py).\n"
NOT_CHECKED_BY_MYPY = "# mypy: ignore-errors\n"


def _module(what: str, detail: str, kafka_version: str, generator: Generator, body: list[str], *,
            checked: bool = False) -> str:
    parts = [HEADER.format(what=what, kafka_version=kafka_version, detail=detail,
                           mypy=CHECKED_BY_MYPY if checked else NOT_CHECKED_BY_MYPY)]
    parts.extend(f"{const} = _Struct({fmt!r})" for fmt, const in sorted(generator.structs_fmt.items()))
    parts += ["", ""]
    return "\n".join([*parts, *body])


def _errors(definitions: Path) -> dict[int, str]:
    """Kafka's error codes and their names (org.apache.kafka.common.protocol.Errors), one
    `code<TAB>NAME` a line, as harness/extract_kafka_messages.sh reads them from the jar."""
    names: dict[int, str] = {}
    for line in (definitions / "errors.tsv").read_text().splitlines():
        if line.strip():
            code, name = line.split("\t")
            names[int(code)] = name
    return names


def _by_version(table: Mapping[int, object]) -> str:
    """A {version: function name or offset} literal."""
    return "{" + ", ".join(f"{version}: {value}" for version, value in table.items()) + "}"


def generate(definitions: Path = DEFINITIONS) -> dict[str, str]:
    """Every generated file, by its path under kqp/protocol/generated."""
    kafka_version = (definitions / "KAFKA_VERSION").read_text().strip()
    files: dict[str, str] = {}
    apis: dict[int, tuple[str, str, int, int, int | None]] = {}
    requests: dict[str, dict[str, Any]] = {}
    responses: dict[str, dict[str, Any]] = {}
    headers: list[dict[str, Any]] = []
    for path in sorted(definitions.glob("*.json")):
        definition = load(path)
        name = str(definition["name"])
        if definition["type"] == "header":
            headers.append(definition)
        elif definition["type"] == "request" and versions(definition.get("validVersions")) is not None:
            requests[name.removesuffix("Request")] = definition
        elif definition["type"] == "response" and versions(definition.get("validVersions")) is not None:
            responses[name.removesuffix("Response")] = definition
    for definition in headers:
        generator = Generator()
        assignments: list[str] = []
        classes = list(generator.message(definition, assignments))
        files[f"messages/{module_name(definition['name'])}.py"] = _module(
            f"Kafka's {definition['name']}", "Decoders and encoders of each header version.", kafka_version,
            generator, [*classes, "", "", *generator.out, *assignments])
    for api, request in requests.items():
        response = responses[api]
        key = int(request["apiKey"])
        module = module_name(api)
        valid = versions(request["validVersions"])
        flexible = versions(request.get("flexibleVersions"))
        assert valid is not None
        apis[key] = (api, module, valid[0], valid[1], None if flexible is None else flexible[0])
        # Classes first (the functions name them only when called), then the functions, then the
        # assignments that refer to both.
        codec = Generator()
        assignments = []
        classes = [*codec.message(request, assignments), *codec.message(response, assignments)]
        names = ["", f"REQUEST = {request['name']}", f"RESPONSE = {response['name']}", ""]
        files[f"messages/{module}.py"] = _module(
            f"The {api} API's messages (key {key})", CODEC_DETAIL, kafka_version, codec,
            [*classes, "", "", *codec.out, *assignments, *names])
        walks = Generator()
        throttle = walks.locations(response, THROTTLE)
        located = {target: walks.locations(response, target) for target in LOCATED_FIELDS.get(response["name"], ())}
        collectors = walks.error_collectors(response)
        tables = ["", "", f"THROTTLE_TIME_MS: dict[int, Any] = {_by_version(throttle)}",
                  "", "FIELD_LOCATIONS: dict[str, dict[int, Any]] = {"]
        tables += [f"    {target!r}: {_by_version(table)}," for target, table in located.items()]
        tables += ["}", "", f"ERROR_CODES: dict[int, Any] = {_by_version(collectors)}", ""]
        files[f"walks/{module}.py"] = _module(
            f"The {api} API's responses walked (key {key})", WALKS_DETAIL, kafka_version, walks, [*walks.out, *tables],
            checked=True)
    catalogue = [GENERATED_MARK + PACKAGE_DOC.format(what=f"Kafka {kafka_version}'s APIs and error codes.",
                                                     detail=CATALOGUE_DETAIL).rstrip("\n"),
                 "", f"KAFKA_VERSION = {kafka_version!r}", "",
                 "# API key -> (name, module, lowest version, highest version, first flexible version or None)",
                 "APIS: dict[int, tuple[str, str, int, int, int | None]] = {"]
    catalogue += [f"    {key}: {entry!r}," for key, entry in sorted(apis.items())]
    catalogue += ["}", "",
                  "# Error code -> its name in Kafka's Errors (what the broker's ErrorsPerSec `error` tag says)",
                  "ERROR_NAMES: dict[int, str] = {"]
    catalogue += [f"    {code}: {name!r}," for code, name in sorted(_errors(definitions).items())]
    catalogue += ["}", ""]
    files["__init__.py"] = "\n".join(catalogue)
    for package, what in (("messages", "Each API's messages"), ("walks", "Each API's responses walked")):
        files[f"{package}/__init__.py"] = GENERATED_MARK + f'"""{what}, one module per API, imported on first use."""\n'
    return dict(sorted(files.items()))


def stale(files: Mapping[str, str], output: Path = OUTPUT) -> list[str]:
    """The generated files that differ from what is committed, and the committed ones no longer generated."""
    committed = {str(path.relative_to(output)) for path in output.rglob("*.py")}
    differ = [name for name, text in files.items()
              if not (output / name).is_file() or (output / name).read_text() != text]
    return sorted({*differ, *(committed - set(files))})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed modules are out of date")
    options = parser.parse_args()
    files = generate()
    if options.check:
        differ = stale(files)
        if differ:
            print(f"{OUTPUT} does not match the definitions ({', '.join(differ)}): run `make kafka-messages`",
                  file=sys.stderr)
            return 1
        return 0
    for name in stale(files):
        if name not in files:
            (OUTPUT / name).unlink()
    for name, text in files.items():
        (OUTPUT / name).parent.mkdir(parents=True, exist_ok=True)
        (OUTPUT / name).write_text(text)
    lines = sum(len(text.splitlines()) for text in files.values())
    print(f"wrote {len(files)} modules under {OUTPUT.relative_to(ROOT)} ({lines} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
