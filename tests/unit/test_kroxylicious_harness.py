"""The pure parts of bench/proxy_throughput.py's Kroxylicious path: the configuration the
harness writes for Kroxylicious, and the two request counts the bench divides CPU by (the
client's, from the perf tools' --print-metrics, and Kroxylicious' own, from Prometheus text).
Nothing here starts Kroxylicious or fetches its jars."""

from __future__ import annotations

import json

import pytest

from harness.kroxylicious import config_yaml, proxy_config, requests_total
from harness.local_kafka import KafkaHarnessError
from harness.perf_tools import client_requests


def test_every_broker_gets_a_proxy_port_after_the_bootstrap_port() -> None:
    config = proxy_config("127.0.0.1:9092,127.0.0.1:9093", 30000, [2, 1, 3], 31000)

    (cluster,) = config["virtualClusters"]
    assert cluster["targetCluster"] == {"bootstrapServers": "127.0.0.1:9092,127.0.0.1:9093"}
    (gateway,) = cluster["gateways"]
    assert gateway["portIdentifiesNode"] == {
        "bootstrapAddress": "127.0.0.1:30000",
        "advertisedBrokerAddressPattern": "127.0.0.1",
        "nodeStartPort": 30001,
        "nodeIdRanges": [{"name": "brokers", "start": 1, "end": 3}],
    }


def test_no_filters_and_metrics_on_loopback() -> None:
    config = proxy_config("127.0.0.1:9092", 30000, [1], 31000)

    # The runtime's names for filters: the list of definitions, the chain, and the older list.
    assert not {"filterDefinitions", "defaultFilters", "filters"} & config.keys()
    assert config["management"] == {"bindAddress": "127.0.0.1", "port": 31000, "endpoints": {"prometheus": {}}}


def test_a_cluster_without_nodes_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one node"):
        proxy_config("127.0.0.1:9092", 30000, [], 31000)


def test_the_written_yaml_is_json_of_the_same_config() -> None:
    config = proxy_config("127.0.0.1:9092", 30000, [1], 31000)

    assert json.loads(config_yaml(config)) == config


def test_kroxylicious_request_count_sums_its_labelled_samples_only() -> None:
    text = "\n".join([
        "# HELP kroxylicious_inbound_downstream_messages_total  ",
        "# TYPE kroxylicious_inbound_downstream_messages_total counter",
        'kroxylicious_inbound_downstream_messages_total{flowing="downstream",virtualCluster="bench"} 142.0',
        'kroxylicious_inbound_downstream_messages_total{flowing="downstream",virtualCluster="other"} 8.0',
        'kroxylicious_inbound_downstream_decoded_messages_total{flowing="downstream",virtualCluster="bench"} 3.0',
        'kroxylicious_inbound_downstream_messages_total_created{virtualCluster="bench"} 1.7e9',
    ])

    assert requests_total(text) == 150


def test_client_request_count_is_the_clients_total_not_a_nodes() -> None:
    output = "\n".join([
        "20000 records sent, 653.2 records/sec (0.06 MB/sec)",
        "Metric Name                                                    Value",
        "producer-metrics:request-rate:{client-id=perf-producer-client}     : 4.600",
        "producer-metrics:request-total:{client-id=perf-producer-client}    : 141.000",
        "producer-node-metrics:request-total:{client-id=perf-producer-client, node-id=node-1}  : 138.000",
    ])

    assert client_requests(output) == 141
    consumer = "consumer-metrics:request-total:{client-id=perf-consumer-client}   : 17.000\n"
    assert client_requests(consumer) == 17


def test_output_without_metrics_is_an_error() -> None:
    with pytest.raises(KafkaHarnessError, match="request-total"):
        client_requests("20000 records sent\n")
