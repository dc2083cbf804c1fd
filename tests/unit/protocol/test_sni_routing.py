"""SNI routing: which node a TLS server name is for, and which names can be configured."""

from __future__ import annotations

import pytest

from kqp.protocol.sni_routing import BOOTSTRAP_ROUTE, SniNameError, SniRoutes, check_host_name

ROUTES = SniRoutes("bootstrap.kafka.example.com", "broker-$(nodeId).kafka.example.com", None)


@pytest.mark.parametrize(("name", "route"), [
    ("bootstrap.kafka.example.com", BOOTSTRAP_ROUTE),
    ("BOOTSTRAP.Kafka.Example.COM", BOOTSTRAP_ROUTE),  # DNS names are case-insensitive
    ("broker-0.kafka.example.com", 0),
    ("broker-1.kafka.example.com", 1),
    ("Broker-42.KAFKA.example.com", 42),
    ("broker-2147483647.kafka.example.com", 2147483647),
])
def test_names_route_to_the_bootstrap_or_their_node(name: str, route: int) -> None:
    assert ROUTES.route(name) == route


@pytest.mark.parametrize("name", [
    None,  # no SNI at all
    "",
    "kafka.example.com",
    "bootstrap.kafka.example.com.evil.org",
    "broker-.kafka.example.com",
    "broker-01.kafka.example.com",  # one name per node: no leading zeros
    "broker--1.kafka.example.com",
    "broker-1x.kafka.example.com",
    "broker-1.kafka.example.org",
    "xbroker-1.kafka.example.com",
    "broker-2147483648.kafka.example.com",  # beyond a Kafka node id
    "broker-1.kafka-example.com",  # the dots of the pattern are literal
])
def test_other_names_route_nowhere(name: str | None) -> None:
    assert ROUTES.route(name) is None


def test_advertised_names_follow_the_pattern_and_route_back() -> None:
    routes = SniRoutes("Boot.K.Example", "B$(nodeId)-k.Example", 443)
    assert routes.bootstrap_host == "boot.k.example"
    for node_id in (0, 7, 1001):
        assert routes.broker_host(node_id) == f"b{node_id}-k.example"
        assert routes.route(routes.broker_host(node_id)) == node_id


@pytest.mark.parametrize(("bootstrap", "pattern", "reason"), [
    ("localhost", "broker-$(nodeId).example.com", "has no dot"),
    ("127.0.0.1", "broker-$(nodeId).example.com", "IP address"),
    ("boot_strap.example.com", "broker-$(nodeId).example.com", "not a DNS label"),
    ("bootstrap.example.com", "broker.example.com", "exactly once"),
    ("bootstrap.example.com", "$(nodeId).$(nodeId).example.com", "exactly once"),
    ("bootstrap.example.com", "broker-$(nodeId)", "has no dot"),
    ("bootstrap.example.com", "broker-$(nodeId)-.example.com", "not a DNS label"),
    ("broker-3.example.com", "broker-$(nodeId).example.com", "also a broker name"),
])
def test_names_no_client_could_send_are_refused(bootstrap: str, pattern: str, reason: str) -> None:
    with pytest.raises(SniNameError, match=reason):
        SniRoutes(bootstrap, pattern, None)


def test_a_name_longer_than_dns_allows_is_refused() -> None:
    with pytest.raises(SniNameError, match="longer than 253"):
        check_host_name(".".join(["a" * 63] * 4))
