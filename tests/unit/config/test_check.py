"""`kqp check-config`: exit status, the problems on stderr, the effective quotas on stdout."""

from __future__ import annotations

from pathlib import Path

import pytest

from kqp.cli import main
from kqp.config.check import format_limit, precedence_level
from kqp.quotas.settings import QuotaEntity

REPO = Path(__file__).resolve().parents[3]
MINIMAL_ENTRY_LINE = next(number for number, line in enumerate((REPO / "config/minimal.yaml").read_text().splitlines())
                          if line.strip().startswith("- entity")) + 1


def test_summary_of_the_minimal_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(REPO / "config/minimal.yaml")]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "  bootstrap   127.0.0.1:9192, advertised as 127.0.0.1" in lines
    assert "  upstream    localhost:9092" in lines
    header = next(line for line in lines if line.strip().startswith("level"))
    assert header.split() == ["level", "entity", "quota", "limit", "dry-run", "scope", "from"]
    rows = [line.split() for line in lines[lines.index(header) + 1:] if line.strip()]
    where = f"{REPO / 'config/minimal.yaml'}:{MINIMAL_ENTRY_LINE}"
    assert rows == [
        ["8", "client-id=<default>", "producer_byte_rate", "1048576", "B/s", "(1", "MiB/s)", "no", "broker", where],
        ["8", "client-id=<default>", "consumer_byte_rate", "2097152", "B/s", "(2", "MiB/s)", "no", "broker", where],
    ]


def test_summary_shows_sni_routing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(REPO / "config/sni.yaml")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "  routing     by TLS server name (SNI), everything on 0.0.0.0:9192" in lines
    assert "  bootstrap   bootstrap.kafka.example.com:443" in lines
    assert "  brokers     node N as broker-N.kafka.example.com:443" in lines
    assert not any("node_port" in line or "port 9200" in line for line in lines)


def test_summary_says_where_client_addresses_come_from(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "pp.yaml"
    path.write_text("proxy:\n  proxy_protocol: {mode: v2, trusted_networks: [10.0.0.0/16, 10.9.0.7]}\n")
    assert main(["check-config", str(path)]) == 0
    assert "  client IPs  from PROXY protocol v2 headers of 10.0.0.0/16, 10.9.0.7" in capsys.readouterr().out
    assert main(["check-config", str(REPO / "config/minimal.yaml")]) == 0
    assert "  client IPs  the connections' own" in capsys.readouterr().out


def test_entries_are_listed_most_specific_first_with_effective_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "q.yaml"
    path.write_text("""
quotas:
  dry_run: false
  scope: cluster
  entries:
    - entity: {client-id: "<default>"}
      request_percentage: 40
    - entity: {user: bob, client-id: app}
      controller_mutation_rate: 2.5
      dry_run: true
      scope: broker
  ip_entries:
    - {ip: 10.1.2.3, connection_creation_rate: 7}
""")
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "upstream    not configured" in out
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("level")) + 1
    table = lines[start:lines.index("", start)]
    cells = [[cell.strip() for cell in row.split("  ") if cell.strip()] for row in table]
    assert cells == [
        ["1", "user=bob, client-id=app", "controller_mutation_rate", "2.5 partitions/s", "yes", "broker", f"{path}:8"],
        ["8", "client-id=<default>", "request_percentage", "40 % of a thread", "no", "cluster", f"{path}:6"],
    ]
    assert ["10.1.2.3", "7", "connections/s"] in [line.split() for line in lines]


def test_each_entry_shows_the_file_that_holds_it_and_who_wrote_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, override = tmp_path / "base.yaml", tmp_path / "override.yaml"
    base.write_text("quotas:\n  entries:\n    - entity: {user: old}\n      producer_byte_rate: 100\n")
    stamp = "AlterClientQuotas from User:ops through instance kqp-1 at 2026-11-24T01:00:00Z"
    override.write_text("proxy:\n  bootstrap_port: 9300\nquotas:\n  entries:\n    - entity: {user: a}\n"
                        "      producer_byte_rate: 100\n    - entity: {user: b}\n      producer_byte_rate: 200\n"
                        f"      origin: {stamp}\n")
    assert main(["check-config", str(base), str(override)]) == 0
    lines = capsys.readouterr().out.splitlines()
    # Lists replace when files merge: base.yaml's entry is not in force.
    assert not any("user=old" in line for line in lines)
    assert next(line for line in lines if "user=a" in line).endswith(f"{override}:5")
    assert next(line for line in lines if "user=b" in line).endswith(f"{override}:7, written by {stamp}")


def test_broken_file_exits_2_with_the_problem_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("quotas:\n  entries:\n    - entity: {user: a}\n      producer_byte_rate: -1\n")
    assert main(["check-config", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"{path}:4:7: quotas.entries[0].producer_byte_rate: expected a value greater than 0, got -1" in captured.err


def test_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(tmp_path / "absent.yaml")]) == 2
    assert "absent.yaml: file not found" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("user", "client_id", "level"),
    [
        ("u", "c", 1), ("u", "<default>", 2), ("u", None, 3), ("<default>", "c", 4),
        ("<default>", "<default>", 5), ("<default>", None, 6), (None, "c", 7), (None, "<default>", 8),
    ],
)
def test_precedence_levels_are_kafkas(user: str | None, client_id: str | None, level: int) -> None:
    assert precedence_level(QuotaEntity(user=user, client_id=client_id)) == level


def test_limit_units() -> None:
    assert format_limit("producer_byte_rate", 512.0) == "512 B/s"
    assert format_limit("consumer_byte_rate", 1536.0) == "1536 B/s (1.5 KiB/s)"
    assert format_limit("producer_byte_rate", 3 * 1024**3) == "3221225472 B/s (3 GiB/s)"
    assert format_limit("request_percentage", 12.5) == "12.5 % of a thread"


def _check(tmp_path: Path, capsys: pytest.CaptureFixture[str], proxy: str, entity: str) -> str:
    path = tmp_path / "kqp.yaml"
    path.write_text(f"{proxy}quotas:\n  entries:\n    - entity: {entity}\n      producer_byte_rate: 1048576\n")
    assert main(["check-config", str(path)]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("proxy", [
    "",  # mechanisms not stated: any may pass
    "proxy:\n  sasl:\n    mechanisms: [SCRAM-SHA-512, GSSAPI]\n",
    "proxy:\n  sasl:\n    mechanisms: [AWS_MSK_IAM]\n",
])
def test_user_quotas_on_a_listener_that_may_see_unreadable_logins_are_warned_about(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], proxy: str
) -> None:
    out = _check(tmp_path, capsys, proxy, "{user: alice, client-id: app}")
    warnings = [line for line in out.splitlines() if line.startswith("  WARNING:")]
    assert len(warnings) == 1, out
    assert "user-level quotas (alice)" in warnings[0] and "client-id" in warnings[0]
    if "GSSAPI" in proxy:
        assert "includes GSSAPI," in warnings[0]
    elif not proxy:
        assert "proxy.sasl.mechanisms is not set" in warnings[0]


@pytest.mark.parametrize(("proxy", "entity"), [
    ("proxy:\n  sasl:\n    mechanisms: [PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER]\n", "{user: alice}"),
    ("proxy:\n  sasl:\n    mechanisms: []\n", "{user: <default>}"),  # no SASL: mTLS or anonymous
    ("", "{client-id: app}"),  # no user-level quota
])
def test_no_warning_when_every_login_is_readable_or_no_quota_names_a_user(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], proxy: str, entity: str
) -> None:
    assert "WARNING" not in _check(tmp_path, capsys, proxy, entity)
