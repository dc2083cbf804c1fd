"""What the proxy has learned about topics from the Metadata responses passing through.

Used to charge DeleteTopics and CreatePartitions by their partition counts (KIP-599) and to
resolve the topic ids of Produce v13 / Fetch v13+ into names for metrics and capture.

The proxy never asks the brokers itself: clients refresh Metadata before they produce,
fetch or alter topics (a client cannot address a partition it has not seen in Metadata),
so what passes through is as fresh as what the clients act on. What it does not know it
says so (None), and callers choose the conservative answer.
"""

from __future__ import annotations

import uuid
from typing import Any

# Uuid.ZERO_UUID: what Metadata versions before topic ids (KIP-516), and brokers without
# them, put in the TopicId field.
_NO_TOPIC_ID = uuid.UUID(int=0)


class TopicDirectory:
    """Partition counts by topic name and names by topic id, shared by every connection of
    a proxy. Entries are overwritten by each newer Metadata and never expire: a deleted
    topic costs one entry until a topic of the same name replaces it."""

    def __init__(self) -> None:
        self._partitions: dict[str, int] = {}
        self._names: dict[uuid.UUID, str] = {}

    def learn_metadata(self, message: Any) -> None:
        for topic in message.topics:
            # An errored entry (UNKNOWN_TOPIC_OR_PARTITION, LEADER_NOT_AVAILABLE while it is
            # being created) has no partition list to trust.
            if topic.error_code != 0 or topic.name is None:
                continue
            self._partitions[topic.name] = len(topic.partitions)
            topic_id = getattr(topic, "topic_id", None)
            if topic_id is not None and topic_id != _NO_TOPIC_ID:
                self._names[topic_id] = topic.name

    def partitions(self, name: str | None, topic_id: uuid.UUID | None) -> int | None:
        if name is None and topic_id is not None:
            name = self._names.get(topic_id)
        return None if name is None else self._partitions.get(name)

    def name_of(self, topic_id: uuid.UUID) -> str | None:
        return self._names.get(topic_id)
