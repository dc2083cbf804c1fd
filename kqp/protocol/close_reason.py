"""Why a proxied connection closed: one bounded vocabulary for the log, the hooks and the metric.

Each member's value is the `reason` label of `kqp_connections_closed_total` (docs/metrics.md),
so a label can never carry an address, a size or an exception's text: those go into the
detail string logged beside it. Where a reason existed before the enum, its value is the
label it had then (the text before the first ':' or '('), so dashboards, alerts
(config/prometheus/kqp-alerts.yml counts "no upstream broker reachable") and tests keep
working; the four labels that used to embed a configured number or an IP address now name
only the kind.
"""

from __future__ import annotations

import enum

__all__ = ["CloseReason"]


class CloseReason(enum.Enum):
    """Why a connection closed; `label` (the value) is the metric's `reason` label. Whether an
    ending is logged as a fault stays the caller's call, since it can depend on the moment:
    a broker closing an idle connection is routine, closing one with requests unanswered is not."""

    # The client ended it.
    CLIENT_DISCONNECTED = "client disconnected"
    CLIENT_CONNECTION_LOST = "client connection lost"
    # The client sent something that cannot be a request.
    BAD_FRAME_FROM_CLIENT = "bad frame from client"  # the size prefix itself is unacceptable
    BAD_REQUEST_FROM_CLIENT = "bad request from client"  # a whole frame, but not a request we can forward
    TRUNCATED_FRAME_FROM_CLIENT = "truncated frame from client"  # went away inside a frame
    FRAME_READ_TIMEOUT = "request frame not received whole in time"  # frame_read_timeout_seconds
    # The client stopped talking or listening (connections.max.idle.ms).
    IDLE = "idle"
    NOT_READING = "not reading its responses"
    # The broker side.
    BAD_RESPONSE_FROM_BROKER = "bad response from broker"
    BROKER_CLOSED = "broker closed the connection"
    BROKER_CONNECTION_LOST = "broker connection lost"
    NO_UPSTREAM_REACHABLE = "no upstream broker reachable"
    # Refused at the door.
    TLS_CERTIFICATE_REJECTED = "TLS client certificate rejected"
    SNI_NO_NODE = "TLS handshake chose no node by server name"
    TOO_MANY_CONNECTIONS = "too many connections"  # max_connections
    TOO_MANY_FROM_IP = "too many connections from one IP"  # max_connections_per_ip
    CONNECTION_RATE = "connection_creation_rate quota exceeded"  # KIP-612 hold, then close
    # The proxy is stopping.
    SHUTTING_DOWN = "proxy is shutting down"  # accepted while stopping
    SHUT_DOWN = "proxy shut down"  # still open when the grace period ended

    @property
    def label(self) -> str:
        """The `reason` label of kqp_connections_closed_total."""
        return self.value
