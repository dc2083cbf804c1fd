"""Broken configurations are rejected with the file, the position, the field path and the reason."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from kqp.config import ConfigError, load_config

UPSTREAM = 'upstream: {bootstrap_servers: ["k:9092"]}\n'


@dataclass(frozen=True)
class Case:
    id: str
    text: str
    path: str  # the field path the error must name
    reason: str  # a fragment of the message
    line: int | None = None


CASES = [
    Case("unknown top-level key", "proxxy: {}\n", "proxxy", "unknown key 'proxxy'; did you mean 'proxy'?", 1),
    Case("unknown proxy key", "proxy:\n  bootstrap_prot: 1\n", "proxy.bootstrap_prot",
         "did you mean 'bootstrap_port'?", 2),
    Case("python-style entity key", "quotas:\n  entries:\n    - entity: {client_id: a}\n      producer_byte_rate: 1\n",
         "quotas.entries[0].entity.client_id", "expected one of: user, client-id", 3),
    Case("ip inside a user entity", "quotas:\n  entries:\n    - entity: {ip: 1.2.3.4}\n      producer_byte_rate: 1\n",
         "quotas.entries[0].entity.ip", "go in quotas.ip_entries", 3),
    Case("port as a string", 'proxy:\n  bootstrap_port: "9192"\n', "proxy.bootstrap_port", "valid integer", 2),
    Case("port out of range", "proxy:\n  bootstrap_port: 70000\n", "proxy.bootstrap_port",
         "less than or equal to 65535, got 70000", 2),
    Case("zero receive buffer", "proxy:\n  socket_receive_buffer_bytes: 0\n", "proxy.socket_receive_buffer_bytes",
         "expected a size in bytes >= 1, or -1 for the OS default, got 0", 2),
    Case("section is a list", "metrics: [1, 2]\n", "metrics", "expected a mapping, got a list", 1),
    Case("entries is a mapping", "quotas:\n  entries: {user: a}\n", "quotas.entries", "expected a list", 2),
    Case("negative byte rate",
         "quotas:\n  entries:\n    - entity: {user: a}\n    - entity: {user: b}\n    - entity: {user: c}\n"
         "      producer_byte_rate: -1048576\n",
         "quotas.entries[2].producer_byte_rate", "greater than 0, got -1048576", 6),
    Case("zero consumer rate", "quotas:\n  entries:\n    - entity: {user: a}\n      consumer_byte_rate: 0\n",
         "quotas.entries[0].consumer_byte_rate", "greater than 0", 4),
    Case("fractional byte rate (Kafka J6)",
         "quotas:\n  entries:\n    - entity: {user: a}\n      producer_byte_rate: 10000.5\n",
         "quotas.entries[0].producer_byte_rate", "cannot be a fractional value", 4),
    Case("byte rate above Long.MAX_VALUE",
         "quotas:\n  entries:\n    - entity: {user: a}\n      producer_byte_rate: 9223372036854775808\n",
         "quotas.entries[0].producer_byte_rate", "less than or equal to 9223372036854775807", 4),
    Case("zero request percentage",
         "quotas:\n  entries:\n    - entity: {user: a}\n      request_percentage: 0\n",
         "quotas.entries[0].request_percentage", "greater than 0", 4),
    Case("infinite mutation rate",
         "quotas:\n  entries:\n    - entity: {user: a}\n      controller_mutation_rate: .inf\n",
         "quotas.entries[0].controller_mutation_rate", "finite number", 4),
    Case("quota given as text", "quotas:\n  entries:\n    - entity: {user: a}\n      producer_byte_rate: 1MB\n",
         "quotas.entries[0].producer_byte_rate", "valid integer, got '1MB'", 4),
    Case("empty user name (Kafka J1)", 'quotas:\n  entries:\n    - entity: {user: ""}\n      request_percentage: 5\n',
         "quotas.entries[0].entity.user", "empty name is not supported", 3),
    Case("user name read as a boolean", "quotas:\n  entries:\n    - entity: {user: no}\n      request_percentage: 5\n",
         "quotas.entries[0].entity.user", "got False; put the text in quotes", 3),
    Case("null user", "quotas:\n  entries:\n    - entity: {user: null}\n      request_percentage: 5\n",
         "quotas.entries[0].entity.user", 'write "<default>"', 3),
    Case("empty entity (Kafka J4)", "quotas:\n  entries:\n    - entity: {}\n      request_percentage: 5\n",
         "quotas.entries[0].entity", "at least one of the keys user, client-id", 3),
    Case("entry without a quota", "quotas:\n  entries:\n    - entity: {user: a}\n      dry_run: true\n",
         "quotas.entries[0]", "sets no quota", 3),
    Case("unknown quota key (Kafka J5)", "quotas:\n  entries:\n    - entity: {user: a}\n      bad: 1.0\n",
         "quotas.entries[0].bad", "unknown key 'bad'", 4),
    Case("duplicate entity",
         "quotas:\n  entries:\n    - entity: {user: a, client-id: x}\n      request_percentage: 5\n"
         "    - entity: {user: b}\n      request_percentage: 5\n"
         "    - entity: {client-id: x, user: a}\n      request_percentage: 7\n",
         "quotas.entries[2].entity", "duplicate entity (user=a, client-id=x): already defined at quotas.entries[0]", 7),
    Case("duplicate ip, spelled differently",
         "quotas:\n  ip_entries:\n    - {ip: '::1', connection_creation_rate: 5}\n"
         "    - {ip: '0:0::1', connection_creation_rate: 6}\n",
         "quotas.ip_entries[1].ip", "already defined at quotas.ip_entries[0]", 4),
    Case("bad ip (Kafka J8)", "quotas:\n  ip_entries:\n    - {ip: RFC2606.invalid, connection_creation_rate: 5}\n",
         "quotas.ip_entries[0].ip", "expected an IP address", 3),
    Case("fractional connection rate", "quotas:\n  ip_entries:\n    - {ip: 1.2.3.4, connection_creation_rate: 2.5}\n",
         "quotas.ip_entries[0].connection_creation_rate", "fractional", 3),
    Case("bad scope", "quotas:\n  scope: global\n", "quotas.scope", "'broker' or 'cluster', got 'global'", 2),
    Case("zero windows", "quotas:\n  window_num: 0\n", "quotas.window_num", "greater than or equal to 1", 2),
    Case("bad callback class", "quotas:\n  callback: {class: my.module.Class}\n", "quotas.callback.class",
         'expected "package.module:ClassName"', 2),
    Case("upstream without port", "upstream:\n  bootstrap_servers: [kafka-1]\n", "upstream.bootstrap_servers[0]",
         'expected "host:port"', 2),
    Case("upstream bad port", "upstream:\n  bootstrap_servers: ['kafka-1:99999']\n",
         "upstream.bootstrap_servers[0]", "port between 1 and 65535", 2),
    Case("upstream empty list", "upstream:\n  bootstrap_servers: []\n", "upstream.bootstrap_servers",
         "expected at least one host:port", 2),
    Case("upstream missing list", "upstream: {}\n", "upstream.bootstrap_servers", "required key missing", 1),
    Case("node port clashes with bootstrap", "proxy:\n  bootstrap_port: 9300\n  node_ports: {3: 9300}\n",
         "proxy.node_ports[3]", "also the bootstrap_port", 3),
    Case("empty host", 'metrics:\n  host: ""\n', "metrics.host", "non-empty", 2),
    Case("zero sampling", "capture:\n  sample_one_in: 0\n", "capture.sample_one_in", "greater than or equal to 1", 2),
    Case("enforcement default partitions", "enforcement:\n  default_partitions: 0\n",
         "enforcement.default_partitions", "greater than or equal to 1", 2),
    Case("fleet fallback policy", "fleet:\n  enabled: true\n  on_unreachable: ignore\n",
         "fleet.on_unreachable", "'local' or 'share'", 3),
    Case("proxy protocol without trusted networks", "proxy:\n  proxy_protocol:\n    mode: v2\n",
         "proxy.proxy_protocol.trusted_networks", 'mode "v2" needs trusted_networks', 2),
    Case("proxy protocol unknown mode", "proxy:\n  proxy_protocol: {mode: v3, trusted_networks: [10.0.0.0/8]}\n",
         "proxy.proxy_protocol.mode", "'off', 'v1', 'v2' or 'auto'", 2),
    Case("proxy protocol network with host bits", "proxy:\n  proxy_protocol:\n    mode: auto\n"
         "    trusted_networks: [10.0.0.0/8, 10.1.2.3/8]\n",
         "proxy.proxy_protocol.trusted_networks[1]", "has host bits set", 4),
    Case("proxy protocol network not an address", "proxy:\n  proxy_protocol:\n    mode: auto\n"
         "    trusted_networks: [balancer.internal]\n",
         "proxy.proxy_protocol.trusted_networks[0]", "expected a network such as 10.0.0.0/8", 4),
    Case("sni routing without tls",
         "proxy:\n  sni_routing:\n    bootstrap_host: b.kafka.example\n"
         "    broker_host_pattern: broker-$(nodeId).kafka.example\n",
         "proxy.sni_routing", "it needs proxy.tls", 2),
    Case("sni routing with a per-broker port",
         "proxy:\n  tls: {cert_file: c.pem, key_file: k.pem}\n  node_port_base: 9300\n  sni_routing:\n"
         "    bootstrap_host: b.kafka.example\n    broker_host_pattern: broker-$(nodeId).kafka.example\n",
         "proxy.node_port_base", "node_port_base has no meaning with sni_routing", 3),
    Case("sni pattern without the node id",
         "proxy:\n  sni_routing:\n    bootstrap_host: b.kafka.example\n    broker_host_pattern: broker.kafka.example\n",
         "proxy.sni_routing.broker_host_pattern", "must contain $(nodeId) exactly once", 4),
    Case("sni bootstrap name without a dot",
         "proxy:\n  sni_routing:\n    bootstrap_host: kafka\n    broker_host_pattern: b$(nodeId).kafka.example\n",
         "proxy.sni_routing.bootstrap_host", "Java clients send no SNI name", 3),
    Case("sni bootstrap name that is a broker name",
         "proxy:\n  sni_routing:\n    bootstrap_host: b7.kafka.example\n"
         "    broker_host_pattern: b$(nodeId).kafka.example\n",
         "proxy.sni_routing.bootstrap_host", "is also a broker name of the pattern", 3),
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_validation_error_names_file_position_path_and_reason(case: Case, tmp_path: Path) -> None:
    path = tmp_path / "kqp.yaml"
    path.write_text(case.text)
    with pytest.raises(ConfigError) as raised:
        load_config([path])
    problems = [p for p in raised.value.problems if p.path == case.path]
    assert problems, f"no problem at {case.path}: {raised.value}"
    problem = problems[0]
    assert problem.files == (str(path),)
    assert case.reason in problem.message
    assert problem.line == case.line
    # The rendered message carries all of it, as the proxy logs it and check-config prints it.
    text = str(raised.value)
    assert f"{path}:{case.line}:" in text and case.path in text and case.reason in text


@pytest.mark.parametrize(
    ("text", "reason", "line"),
    [
        ("proxy:\n  bootstrap_port: [9192\n", "YAML syntax error", 3),
        ("proxy:\n\tbootstrap_port: 1\n", "YAML syntax error", 2),
        ("proxy: {}\nproxy: {}\n", "the key 'proxy' is given a second time (first on line 1)", 2),
        (
            "quotas:\n  entries:\n    - entity: {user: a}\n      producer_byte_rate: 1\n      producer_byte_rate: 2\n",
            "the key 'producer_byte_rate' is given a second time",
            5,
        ),
        ("", "the file is empty", None),
        ("# only a comment\n", "the file is empty", None),
        ("- proxy\n- quotas\n", "expected a mapping of sections", None),
        ("just text\n", "expected a mapping of sections", None),
    ],
    ids=[
        "unclosed-list", "tab", "duplicate-section", "duplicate-quota-key", "empty", "comments-only", "list", "scalar",
    ],
)
def test_file_level_errors(text: str, reason: str, line: int | None, tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as raised:
        load_config([path])
    [problem] = raised.value.problems
    assert problem.files == (str(path),)
    assert reason in problem.message
    assert problem.path == ""
    assert problem.line == line
    assert str(path) in str(raised.value)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.yaml"
    with pytest.raises(ConfigError, match=r"nowhere\.yaml: file not found"):
        load_config([path])


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory"):
        load_config([tmp_path])


def test_no_files() -> None:
    with pytest.raises(ConfigError, match="no configuration file given"):
        load_config([])


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    path = tmp_path / "kqp.yaml"
    path.write_text("proxy:\n  bootstrap_port: 0\nmetrics:\n  port: -1\ncapture:\n  colour: blue\n")
    with pytest.raises(ConfigError) as raised:
        load_config([path])
    assert [p.path for p in raised.value.problems] == ["proxy.bootstrap_port", "metrics.port", "capture.colour"]
    assert [p.line for p in raised.value.problems] == [2, 4, 6]


@pytest.mark.parametrize(
    ("first_text", "second_text", "blamed", "path", "line"),
    [
        # The bad value is in the second file.
        (UPSTREAM + "proxy:\n  bootstrap_port: 9192\n",
         "quotas:\n  entries:\n    - entity: {user: a}\n      producer_byte_rate: -5\n",
         ("second",), "quotas.entries[0].producer_byte_rate", 4),
        # The bad value is in the first file, in a section the second file also sets.
        ("proxy:\n  bootstrap_port: 9192\n  idle_timeout_seconds: -1\n", "proxy:\n  bootstrap_port: 9193\n",
         ("first",), "proxy.idle_timeout_seconds", 3),
        # A later list replaces an earlier one: its file is the one to blame.
        ("quotas:\n  entries:\n    - entity: {user: a}\n      producer_byte_rate: 1\n",
         "quotas:\n  entries:\n    - entity: {user: a}\n", ("second",), "quotas.entries[0]", 3),
        # A missing key inside a list: only the file whose list is in effect.
        ("quotas:\n  entries:\n    - producer_byte_rate: 1\n", "quotas:\n  entries:\n    - consumer_byte_rate: 1\n",
         ("second",), "quotas.entries[0].entity", 3),
        # A missing key: every file that has its section.
        ("upstream: {}\n", "upstream: {}\n", ("first", "second"), "upstream.bootstrap_servers", 1),
    ],
    ids=["second-file", "first-file", "replaced-list", "missing-in-replaced-list", "missing-key"],
)
def test_error_names_the_file_that_supplied_the_value(
    first_text: str, second_text: str, blamed: tuple[str, ...], path: str, line: int, tmp_path: Path
) -> None:
    files = {"first": tmp_path / "first.yaml", "second": tmp_path / "second.yaml"}
    files["first"].write_text(first_text)
    files["second"].write_text(second_text)
    with pytest.raises(ConfigError) as raised:
        load_config([files["first"], files["second"]])
    [problem] = raised.value.problems
    assert (problem.files, problem.path, problem.line) == (tuple(str(files[n]) for n in blamed), path, line)
