"""TLS on both sides of the proxy: contexts built from PEM files and rebuilt when the files
change, the client certificate's subject as Kafka prints it, and Kafka's
`ssl.principal.mapping.rules` turning that subject into a user principal.

A broker names an mTLS client after `X500Principal.getName()` of its certificate subject
(RFC 2253, most specific RDN first) passed through the mapping rules; doing the same here
keeps quota entities identical whether a client talks to the broker or to the proxy.
"""

from __future__ import annotations

import contextvars
import logging
import os
import re
import ssl
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from kqp.config.models import ListenerTlsSection, UpstreamTlsSection
from kqp.protocol.sni_routing import SniRoutes

log = logging.getLogger(__name__)

DEFAULT_PRINCIPAL_MAPPING_RULES = "DEFAULT"

# ---- principal mapping rules (Kafka's SslPrincipalMapper semantics) ------------------------

# One rule: DEFAULT, RULE:pattern/replacement/[LU] (with `\` escaping `/`), or anything else
# (which the parser then rejects unless it is empty). The same grammar Kafka accepts.
_RULE = r"(DEFAULT)|RULE:((?:\\.|[^\\/])*)/((?:\\.|[^\\/])*)/([LU]?).*?|(.*?)"
_RULE_SPLITTER = re.compile(r"\s*(" + _RULE + r")\s*(?:,\s*|$)")
_RULE_PARSER = re.compile(_RULE)
_BACK_REFERENCE = re.compile(r"\$(\d+)")


class PrincipalMappingError(ValueError):
    """Rules that do not parse, or a subject no rule maps (the broker fails the handshake)."""


@dataclass(frozen=True, slots=True)
class PrincipalRule:
    pattern: re.Pattern[str] | None = None  # None: the DEFAULT rule
    replacement: str = ""
    to_lower: bool = False
    to_upper: bool = False

    def apply(self, subject: str) -> str | None:
        if self.pattern is None:
            return subject
        if self.pattern.fullmatch(subject) is None:
            return None
        # Every match is replaced, as Java's String.replaceAll does (an empty match at the end
        # of the subject counts too).
        result = self.pattern.sub(lambda match: _expand(self.replacement, match), subject)
        if self.to_lower:
            return result.lower()
        if self.to_upper:
            return result.upper()
        return result

    def __str__(self) -> str:
        if self.pattern is None:
            return "DEFAULT"
        flag = "/L" if self.to_lower else "/U" if self.to_upper else ""
        return f"RULE:{self.pattern.pattern}/{self.replacement}{flag}"


def _expand(replacement: str, match: re.Match[str]) -> str:
    """A Java replacement string ($n, ${name}, backslash escapes) for one match.

    Kafka treats a `$n` whose group does not exist as literal text; so does this (Kafka's own
    escaping gets the second of two such references wrong; this does not copy that).
    """
    groups = match.re.groups
    out: list[str] = []
    i, end = 0, len(replacement)
    while i < end:
        char = replacement[i]
        if char == "\\":
            if i + 1 == end:
                raise PrincipalMappingError(f"replacement {replacement!r} ends with an unescaped backslash")
            out.append(replacement[i + 1])
            i += 2
        elif char == "$" and i + 1 < end and replacement[i + 1] == "{":
            close = replacement.find("}", i + 2)
            if close < 0:
                raise PrincipalMappingError(f"replacement {replacement!r}: unterminated group name")
            try:
                out.append(match.group(replacement[i + 2 : close]) or "")
            except IndexError:
                raise PrincipalMappingError(f"replacement {replacement!r}: no group "
                                            f"{replacement[i + 2 : close]!r}") from None
            i = close + 1
        elif char == "$":
            digits = _BACK_REFERENCE.match(replacement, i)
            if digits is None:
                raise PrincipalMappingError(f"replacement {replacement!r}: illegal group reference")
            text = digits.group(1)
            number = int(text[0])
            if number > groups:
                if groups == 0:
                    raise PrincipalMappingError(f"replacement {replacement!r}: no group {number}")
                out.append("$")  # a group that does not exist: literal text
                i += 1
                continue
            used = 1
            # Java reads further digits while they still name an existing group.
            while used < len(text) and number * 10 + int(text[used]) <= groups:
                number = number * 10 + int(text[used])
                used += 1
            out.append(match.group(number) or "")
            i += 1 + used
        else:
            out.append(char)
            i += 1
    return "".join(out)


def parse_principal_mapping_rules(text: str | None) -> tuple[PrincipalRule, ...]:
    """Kafka's `ssl.principal.mapping.rules` value -> rules in order (None means DEFAULT)."""
    if text is None:
        text = DEFAULT_PRINCIPAL_MAPPING_RULES
    rules: list[PrincipalRule] = []
    for split in _RULE_SPLITTER.finditer(text.strip()):
        rule = split.group(1)
        parsed = _RULE_PARSER.match(rule)
        if parsed is None or parsed.end() != len(rule):
            unmatched = rule if parsed is None else rule[parsed.end() :]
            raise PrincipalMappingError(f"invalid principal mapping rule {rule!r}: cannot read {unmatched!r}")
        if parsed.group(1) is not None:
            rules.append(PrincipalRule())
        elif parsed.group(2) is not None:
            try:
                pattern = re.compile(parsed.group(2))
            except re.error as exc:
                raise PrincipalMappingError(f"invalid pattern in principal mapping rule {rule!r}: {exc}") from None
            flag = parsed.group(4)
            rules.append(PrincipalRule(pattern, parsed.group(3), flag == "L", flag == "U"))
        # anything else is an empty rule, ignored
    return tuple(rules)


def map_principal(rules: tuple[PrincipalRule, ...], subject: str) -> str:
    """The principal name of a certificate subject: the first rule that applies wins."""
    for rule in rules:
        name = rule.apply(subject)
        if name is not None:
            return name
    raise PrincipalMappingError(f"no principal mapping rule applies to {subject!r} "
                                f"(rules: {', '.join(map(str, rules)) or 'none'})")


# ---- certificate subjects, RFC 2253 as Java prints them ------------------------------------

# Attribute types Java names by keyword in RFC 2253 output; all others appear as
# dotted-OID=#hex of their DER value.
_RFC2253_KEYWORDS = {
    "2.5.4.3": "CN", "2.5.4.6": "C", "2.5.4.7": "L", "2.5.4.8": "ST", "2.5.4.10": "O", "2.5.4.11": "OU",
    "2.5.4.9": "STREET", "0.9.2342.19200300.100.1.25": "DC", "0.9.2342.19200300.100.1.1": "UID",
}
_STRING_CODECS = {
    0x0C: "utf-8",  # UTF8String
    0x13: "latin-1",  # PrintableString
    0x14: "latin-1",  # TeletexString, read as Latin-1 the way Java does
    0x16: "latin-1",  # IA5String
    0x1E: "utf-16-be",  # BMPString
    0x1C: "utf-32-be",  # UniversalString
}
_RFC2253_SPECIALS = frozenset(',=+<>#;"\\')


class CertificateParseError(ValueError):
    pass


def _tlv(data: bytes, offset: int) -> tuple[int, int, int]:
    """DER tag, start and end of the value at `offset`."""
    if offset + 2 > len(data):
        raise CertificateParseError("certificate truncated")
    tag, length = data[offset], data[offset + 1]
    offset += 2
    if length & 0x80:
        count = length & 0x7F
        if count == 0 or count > 4 or offset + count > len(data):
            raise CertificateParseError("bad DER length")
        length = int.from_bytes(data[offset : offset + count], "big")
        offset += count
    if offset + length > len(data):
        raise CertificateParseError("certificate truncated")
    return tag, offset, offset + length


def _children(data: bytes, start: int, end: int) -> list[tuple[int, int, int, int]]:
    """(tag, header start, value start, value end) of each element inside a constructed value."""
    items = []
    while start < end:
        tag, value_start, value_end = _tlv(data, start)
        items.append((tag, start, value_start, value_end))
        start = value_end
    return items


def _oid(value: bytes) -> str:
    if not value:
        raise CertificateParseError("empty OID")
    parts = [min(value[0] // 40, 2)]
    parts.append(value[0] - 40 * parts[0])
    number = 0
    for byte in value[1:]:
        number = (number << 7) | (byte & 0x7F)
        if not byte & 0x80:
            parts.append(number)
            number = 0
    return ".".join(map(str, parts))


def _escape_rfc2253(value: str) -> str:
    out = ["\\" + c if c in _RFC2253_SPECIALS else c for c in value]
    for i in range(len(value)):  # leading spaces
        if value[i] != " ":
            break
        out[i] = "\\ "
    for i in range(len(value) - 1, -1, -1):  # trailing spaces
        if value[i] != " ":
            break
        out[i] = "\\ "
    return "".join(out)


def subject_dn(der_certificate: bytes) -> str:
    """The subject of a DER certificate as Java's X500Principal.getName() prints it."""
    data = der_certificate
    _tag, start, end = _tlv(data, 0)  # Certificate
    _tag, start, end = _tlv(data, start)  # TBSCertificate
    fields = _children(data, start, end)
    if fields and fields[0][0] == 0xA0:  # explicit version
        fields = fields[1:]
    # serialNumber, signature, issuer, validity, subject
    if len(fields) < 5:
        raise CertificateParseError("certificate has no subject")
    _tag, _header, start, end = fields[4]
    rdns: list[str] = []
    for _set_tag, _h, set_start, set_end in _children(data, start, end):
        avas = []
        for _seq_tag, _h2, seq_start, seq_end in _children(data, set_start, set_end):
            (_oid_tag, _h3, oid_start, oid_end), (value_tag, value_header, value_start, value_end) = (
                _children(data, seq_start, seq_end)[:2]
            )
            oid = _oid(data[oid_start:oid_end])
            keyword = _RFC2253_KEYWORDS.get(oid)
            codec = _STRING_CODECS.get(value_tag)
            if keyword is not None and codec is not None:
                text = data[value_start:value_end].decode(codec, errors="replace")
                avas.append(f"{keyword}={_escape_rfc2253(text)}")
            else:
                avas.append(f"{keyword or oid}=#{data[value_header:value_end].hex()}")
        rdns.append("+".join(avas))
    return ",".join(reversed(rdns))


# ---- contexts ---------------------------------------------------------------------------

# Kafka's ssl.client.auth values: `requested` asks for a certificate but accepts a client
# without one, `required` fails the handshake of a client that sends none.
_CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


def listener_context(options: ListenerTlsSection, sni: SniSelector | None = None) -> ssl.SSLContext:
    """The server-side context for client connections (TLS termination, optional mTLS, SNI routing)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    # TLS 1.2 and 1.3 only (set below), as Kafka's default ssl.enabled.protocols (TLSv1.2,TLSv1.3).
    if sni is not None:
        context.sni_callback = sni.server_name_received
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(options.cert_file, options.key_file, options.key_password)
    context.verify_mode = _CLIENT_AUTH[options.client_auth]
    if options.ca_file is not None:
        context.load_verify_locations(cafile=options.ca_file)
    return context


def upstream_context(options: UpstreamTlsSection) -> ssl.SSLContext:
    """The client-side context for connections to the brokers (TLS origination)."""
    context = ssl.create_default_context(cafile=options.ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = options.check_hostname
    if options.cert_file is not None:
        context.load_cert_chain(options.cert_file, options.key_file, options.key_password)
    return context


def _files_state(paths: tuple[str, ...]) -> tuple[tuple[int, int], ...]:
    """(mtime, size) of each file, (-1, -1) for a missing one: cheap enough to poll every few seconds.

    A change of either starts a rebuild; a file being replaced (missing for a moment) does too,
    and the failed build then keeps the old context until the next check.
    """
    state = []
    for path in paths:
        try:
            stat = os.stat(path)
        except OSError:
            state.append((-1, -1))
        else:
            state.append((stat.st_mtime_ns, stat.st_size))
    return tuple(state)


class ReloadingContext:
    """An SSL context that is rebuilt when one of its files changes.

    Connections take `context` when they start, so a rebuilt context applies to new
    connections only. Files caught half-written, or a new certificate that does not match
    its key, leave the working context in place and are retried at the next check.
    """

    def __init__(self, name: str, paths: tuple[str, ...], build: Callable[[], ssl.SSLContext]) -> None:
        self.name = name
        self.paths = paths
        self._build = build
        self._state = _files_state(paths)
        self.context = build()
        self.reloads = 0

    def check(self) -> bool:
        """Rebuild the context if a file changed since the last look; True if it was rebuilt."""
        state = _files_state(self.paths)
        if state == self._state:
            return False
        try:
            context = self._build()
        except (OSError, ssl.SSLError, ValueError) as exc:
            log.error("%s: certificate files changed but cannot be loaded, keeping the previous ones: %s",
                      self.name, exc)
            return False
        self._state = state
        self.context = context
        self.reloads += 1
        log.info("%s: certificate files reloaded", self.name)
        return True


def listener_files(options: ListenerTlsSection) -> tuple[str, ...]:
    """The files a listener context is built from: the ones to watch for a certificate rotation."""
    return tuple(p for p in (options.cert_file, options.key_file, options.ca_file) if p is not None)


def upstream_files(options: UpstreamTlsSection) -> tuple[str, ...]:
    return tuple(p for p in (options.ca_file, options.cert_file, options.key_file) if p is not None)


# ---- SNI routing ------------------------------------------------------------------------


@dataclass(slots=True)
class Handshake:
    """One client's TLS handshake in progress, as the SNI callback sees it."""

    peer: str
    refused: bool = False  # the SNI callback refused it and said why


# Set by the task that runs a handshake; the event loop runs the TLS layer, and so the SNI
# callback, in a copy of that task's context (asyncio and uvloop alike), so the callback
# can name the client it refuses.
_handshake: contextvars.ContextVar[Handshake | None] = contextvars.ContextVar("kqp_tls_handshake", default=None)


def handshake_started(peer: str) -> Handshake:
    """Call in the task about to run a client's handshake."""
    handshake = Handshake(peer)
    _handshake.set(handshake)
    return handshake


class SniSelector:
    """The SNI callback of an SNI-routed listener: it remembers which node each connection's
    name is for, and refuses a handshake without a name, or with one that is neither the
    bootstrap name nor the name of a broker the proxy knows.

    The refusal is the `unrecognized_name` alert from the callback. asyncio's and uvloop's TLS
    layers abort the connection on a failed handshake without sending what OpenSSL queued, so
    the client sees its handshake fail (reset) rather than the alert itself; the proxy's log
    names the name it sent.
    """

    def __init__(self, routes: SniRoutes, is_known: Callable[[int], bool]) -> None:
        self.routes = routes
        self._is_known = is_known
        self._nodes: weakref.WeakKeyDictionary[ssl.SSLObject | ssl.SSLSocket, int] = weakref.WeakKeyDictionary()

    def server_name_received(self, ssl_object: ssl.SSLObject | ssl.SSLSocket, server_name: str | None,
                             _context: ssl.SSLContext) -> int | None:
        node = self.routes.route(server_name)
        if node is not None and (node < 0 or self._is_known(node)):
            self._nodes[ssl_object] = node
            return None
        handshake = _handshake.get()
        if handshake is not None:
            handshake.refused = True
        peer = handshake.peer if handshake is not None else "?"
        if server_name is None:
            log.warning("connection from %s refused: it sent no TLS server name (SNI); this listener routes by "
                        "name: connect to %s or a broker name it advertises", peer, self.routes.bootstrap_host)
        elif node is None:
            log.warning("connection from %s refused: TLS server name %r is neither the bootstrap name %s nor a "
                        "broker name of the pattern %s", peer, server_name, self.routes.bootstrap_host,
                        self.routes.broker_host_pattern)
        else:
            log.warning("connection from %s refused: TLS server name %r is for node %d, which the proxy does not "
                        "know (yet) in the cluster", peer, server_name, node)
        return ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME

    def node_of(self, ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> int | None:
        """The node (or bootstrap) the handshake's SNI name chose; None if it chose none."""
        return self._nodes.get(ssl_object) if ssl_object is not None else None


class ListenerTlsState:
    """What the proxy's listeners need for TLS: the current context and the principal rules."""

    def __init__(self, options: ListenerTlsSection, sni: SniSelector | None = None) -> None:
        self.options = options
        self.sni = sni
        self.rules = parse_principal_mapping_rules(options.principal_mapping_rules)
        self.reloading = ReloadingContext("client TLS", listener_files(options), lambda: listener_context(options, sni))

    def principal_of(self, ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> str | None:
        """The mapped principal of the peer's certificate, None when it sent none."""
        if ssl_object is None:
            return None
        der = ssl_object.getpeercert(binary_form=True)
        if not der:
            return None
        return map_principal(self.rules, subject_dn(der))
