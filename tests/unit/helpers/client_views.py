"""Hook-side views of a client for tests that call hooks directly, without a connection."""

from __future__ import annotations

from kqp.proxy.hooks import ClientView


class NoControl:
    """A connection control that must not be used: these tests hold no other connection."""

    def mute(self, throttle_ms: int, *, one_at_a_time: bool = True) -> None:
        raise AssertionError("no connection is muted in these tests")


def client_view(connection_id: int = 1, principal: str = "ANONYMOUS", broker: int | None = 1,
                listener: str = "bootstrap", peer: str = "127.0.0.1:40000") -> ClientView:
    return ClientView(connection_id, peer, listener, broker, principal, NoControl())
