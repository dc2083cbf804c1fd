"""CreateTopics, CreatePartitions and DeleteTopics as the controller-mutation quota sees them.

KIP-599 charges these requests by partitions: the partitions a new topic gets, the
partitions added, the partitions of a deleted topic. In strict versions (CreateTopics v6+,
CreatePartitions v3+, DeleteTopics v5+) the broker rejects individual topics with
THROTTLING_QUOTA_EXCEEDED and lets the others through; the proxy does the same by removing
rejected topics before forwarding and adding their error entries to the broker's answer.

The charge is the number of partitions created or deleted, as Kafka's
ControllerMutationQuotaManager records it (one "mutation" per partition). Older, permissive
versions are never rejected: the broker accepts them and throttles the connection
afterwards, which the enforcement hook does through ThrottleTimeMs and a KIP-219 mute.

The bodies are decoded with the full codec (unlike Produce and Fetch on the fast path):
these are rare admin requests, and rejecting a topic means re-encoding the request and the
response anyway.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kqp.protocol.apis import CREATE_PARTITIONS_KEY, CREATE_TOPICS_KEY, DELETE_TOPICS_KEY
from kqp.protocol.codec import build_response, decode_body, encode_body

# Kafka's Errors.THROTTLING_QUOTA_EXCEEDED (added by KIP-599).
THROTTLING_QUOTA_EXCEEDED = 89
MUTATION_APIS = frozenset({CREATE_TOPICS_KEY, CREATE_PARTITIONS_KEY, DELETE_TOPICS_KEY})
# Uuid.ZERO_UUID: "no topic id" in the versions that have the field (KIP-516).
_NO_TOPIC_ID = uuid.UUID(int=0)

# (topic name or None, topic id or None) -> current partition count, if known
PartitionCount = Callable[[str | None, uuid.UUID | None], int | None]


@dataclass(frozen=True, slots=True)
class TopicMutation:
    """One topic of a mutation request and the partitions it would create or delete.
    DeleteTopics v6+ may name a topic by id only, hence the two optional identities."""

    name: str | None
    topic_id: uuid.UUID | None
    partitions: int

    @property
    def label(self) -> str:
        return self.name if self.name is not None else str(self.topic_id)


@dataclass(slots=True)
class MutationRequest:
    """A decoded mutation request: `message` is kept so that rejected topics can be removed
    and the rest re-encoded (`request_without`), `topics` is what the quota charges."""

    api_key: int
    api_version: int
    message: Any
    topics: list[TopicMutation]
    validate_only: bool


def read_mutation_request(
    api_key: int,
    api_version: int,
    body: bytes | memoryview,
    current_partitions: PartitionCount,
    default_partitions: int,
) -> MutationRequest:
    """Read what a mutation request would charge.

    `current_partitions` answers from the topics the proxy learned from Metadata; when it
    does not know a topic, the charge is the least the request can cost (1 partition), so
    the proxy never throttles harder than the broker would. `default_partitions` is the
    brokers' num.partitions, for CreateTopics entries that leave the count to the broker.
    """
    message = decode_body(api_key, api_version, body, is_request=True)
    topics: list[TopicMutation] = []
    if api_key == CREATE_TOPICS_KEY:
        for topic in message.topics:
            if topic.num_partitions > 0:
                count = topic.num_partitions
            elif topic.assignments:
                # Manual assignment: one entry per partition, NumPartitions is then -1.
                count = len(topic.assignments)
            else:
                # -1 (KIP-464) asks for the broker's num.partitions, which the proxy is told
                # in config.
                count = default_partitions
            topics.append(TopicMutation(topic.name, None, count))
        validate_only = bool(message.validate_only)
    elif api_key == CREATE_PARTITIONS_KEY:
        for topic in message.topics:
            current = current_partitions(topic.name, None)
            # Unknown current size: charge the least a valid request can add.
            added = topic.count - current if current is not None else 1
            topics.append(TopicMutation(topic.name, None, max(added, 0)))
        validate_only = bool(message.validate_only)
    elif api_key == DELETE_TOPICS_KEY:
        if api_version >= 6:
            # v6 (KIP-516) lists topics as (name, id) pairs where either may be unset.
            entries = [(t.name, None if t.topic_id == _NO_TOPIC_ID else t.topic_id) for t in message.topics]
        else:
            entries = [(name, None) for name in message.topic_names]
        for name, topic_id in entries:
            current = current_partitions(name, topic_id)
            topics.append(TopicMutation(name, topic_id, current if current is not None else 1))
        validate_only = False
    else:
        raise ValueError(f"API key {api_key} is not a controller mutation")
    return MutationRequest(api_key, api_version, message, topics, validate_only)


def _same_topic(entry: Any, mutation: TopicMutation) -> bool:
    """Whether a request or response entry is `mutation`'s topic: DeleteTopics before v6
    lists bare names, every other shape has a name, a topic id or both."""
    if isinstance(entry, str):
        return entry == mutation.name
    if mutation.name is not None and getattr(entry, "name", None) == mutation.name:
        return True
    return mutation.topic_id is not None and getattr(entry, "topic_id", None) == mutation.topic_id


def request_without(request: MutationRequest, rejected: Iterable[TopicMutation]) -> bytes:
    """The request body with the rejected topics removed."""
    rejected = list(rejected)
    message = request.message
    if request.api_key == DELETE_TOPICS_KEY and request.api_version < 6:
        message.topic_names = [n for n in message.topic_names if not any(_same_topic(n, r) for r in rejected)]
    else:
        message.topics = [t for t in message.topics if not any(_same_topic(t, r) for r in rejected)]
    return encode_body(message, request.api_version)


def _rejection_entry(api_key: int, api_version: int, response: Any, mutation: TopicMutation) -> Any:
    # ErrorMessage is null: the broker drops a message equal to the error's default text.
    if api_key == CREATE_TOPICS_KEY:
        return response.CreatableTopicResult(
            name=mutation.name, topic_id=_NO_TOPIC_ID, error_code=THROTTLING_QUOTA_EXCEEDED, error_message=None,
            topic_config_error_code=0, num_partitions=-1, replication_factor=-1, configs=None,
        )
    if api_key == CREATE_PARTITIONS_KEY:
        return response.CreatePartitionsTopicResult(
            name=mutation.name, error_code=THROTTLING_QUOTA_EXCEEDED, error_message=None
        )
    return response.DeletableTopicResult(
        name=mutation.name, topic_id=mutation.topic_id or _NO_TOPIC_ID,
        error_code=THROTTLING_QUOTA_EXCEEDED, error_message=None,
    )


# The three responses name their per-topic results differently (Topics, Results,
# Responses in Kafka's JSON schemas); these two keep that difference in one place.


def _results(api_key: int, response: Any) -> list[Any]:
    if api_key == CREATE_TOPICS_KEY:
        return list(response.topics)
    if api_key == CREATE_PARTITIONS_KEY:
        return list(response.results)
    return list(response.responses)


def _set_results(api_key: int, response: Any, results: list[Any]) -> None:
    if api_key == CREATE_TOPICS_KEY:
        response.topics = results
    elif api_key == CREATE_PARTITIONS_KEY:
        response.results = results
    else:
        response.responses = results


def throttled_response(request: MutationRequest, rejected: list[TopicMutation], throttle_ms: int) -> bytes:
    """The whole answer when every topic of a strict request is rejected."""
    cls = build_response(request.api_key, request.api_version, throttle_time_ms=throttle_ms)
    entries = [_rejection_entry(request.api_key, request.api_version, cls, m) for m in rejected]
    _set_results(request.api_key, cls, entries)
    return encode_body(cls, request.api_version)


def merge_rejections(
    request: MutationRequest, response_body: bytes | memoryview, rejected: list[TopicMutation], throttle_ms: int
) -> bytes:
    """Add the proxy's rejections to the broker's answer, in the order the client asked."""
    response = decode_body(request.api_key, request.api_version, response_body, is_request=False)
    results = _results(request.api_key, response)
    results += [_rejection_entry(request.api_key, request.api_version, response, m) for m in rejected]
    # A broker answers in the order the topics were asked; the merged answer keeps that order
    # so that it reads as if one broker had answered it all.
    order = {m.label: index for index, m in enumerate(request.topics)}
    results.sort(key=lambda entry: order.get(entry.name if entry.name is not None else str(entry.topic_id), 0))
    _set_results(request.api_key, response, results)
    # The client backs off for the larger of the broker's throttle and the proxy's.
    response.throttle_time_ms = max(response.throttle_time_ms, throttle_ms)
    return encode_body(response, request.api_version)
