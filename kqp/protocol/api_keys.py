"""Kafka API keys the project refers to by name, in one place.

Kept free of imports so that every package (the pure quota engine, the Spark jobs on
executors) can use the names without loading the codec.
"""

from __future__ import annotations

from enum import IntEnum


class ApiKey(IntEnum):
    PRODUCE = 0
    FETCH = 1
    METADATA = 3
    FIND_COORDINATOR = 10
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DESCRIBE_CLIENT_QUOTAS = 48
    ALTER_CLIENT_QUOTAS = 49
    DESCRIBE_QUORUM = 55
    DESCRIBE_CLUSTER = 60
    SHARE_FETCH = 78
    SHARE_ACKNOWLEDGE = 79


# CreateTopics, DeleteTopics and CreatePartitions: charged to the controller-mutation quota (KIP-599).
MUTATION_API_KEYS: frozenset[int] = frozenset({ApiKey.CREATE_TOPICS, ApiKey.DELETE_TOPICS, ApiKey.CREATE_PARTITIONS})
