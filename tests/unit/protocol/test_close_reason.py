"""Close reasons and the metric labels they become (kqp.protocol.close_reason)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kqp.protocol.close_reason import CloseReason

ROOT = Path(__file__).resolve().parents[3]

# The labels that existed as text before the enum, as `reason.split(":")[0].split("(")[0]`
# made them: dashboards, alerts and tests may rely on them, so they must not change.
LABELS_BEFORE_THE_ENUM = {
    CloseReason.CLIENT_DISCONNECTED: "client disconnected",
    CloseReason.CLIENT_CONNECTION_LOST: "client connection lost",
    CloseReason.BAD_FRAME_FROM_CLIENT: "bad frame from client",
    CloseReason.BAD_REQUEST_FROM_CLIENT: "bad request from client",
    CloseReason.TRUNCATED_FRAME_FROM_CLIENT: "truncated frame from client",
    CloseReason.BAD_RESPONSE_FROM_BROKER: "bad response from broker",
    CloseReason.BROKER_CLOSED: "broker closed the connection",
    CloseReason.BROKER_CONNECTION_LOST: "broker connection lost",
    CloseReason.NO_UPSTREAM_REACHABLE: "no upstream broker reachable",
    CloseReason.TLS_CERTIFICATE_REJECTED: "TLS client certificate rejected",
    CloseReason.SNI_NO_NODE: "TLS handshake chose no node by server name",
    CloseReason.TOO_MANY_CONNECTIONS: "too many connections",
    CloseReason.CONNECTION_RATE: "connection_creation_rate quota exceeded",
    CloseReason.SHUTTING_DOWN: "proxy is shutting down",
    CloseReason.SHUT_DOWN: "proxy shut down",
}


@pytest.mark.parametrize(("reason", "label"), LABELS_BEFORE_THE_ENUM.items(), ids=lambda v: str(v))
def test_labels_that_existed_keep_their_text(reason: CloseReason, label: str) -> None:
    assert reason.label == label


def test_labels_are_bounded_and_distinct() -> None:
    labels = [reason.label for reason in CloseReason]
    assert len(set(labels)) == len(labels)
    for label in labels:
        # Nothing a detail would bring: no digits (sizes, addresses, timeouts), no separators
        # the old text-splitting cut at, so a label never depends on configuration or peer.
        assert not re.search(r"[0-9:()]", label), label


def test_the_alert_rules_name_existing_labels() -> None:
    rules = (ROOT / "config/prometheus/kqp-alerts.yml").read_text()
    named = set(re.findall(r'kqp_connections_closed_total\{reason="([^"]+)"\}', rules))
    assert named <= {reason.label for reason in CloseReason}


def test_docs_list_every_label() -> None:
    metrics_doc = (ROOT / "docs/metrics.md").read_text()
    missing = [reason.label for reason in CloseReason if f"`{reason.label}`" not in metrics_doc]
    assert not missing, f"docs/metrics.md does not list {missing}"
