"""CreateTopics requests and answers, and an enforcement hook with a controller-mutation quota."""

from __future__ import annotations

import asyncio
import uuid

from kqp.config.models import EnforcementSection
from kqp.protocol.apis import API_SPECS, CREATE_TOPICS_KEY
from kqp.protocol.codec import decode_body, encode_body
from kqp.protocol.headers import (
    RequestHeader,
    encode_request_header,
)
from kqp.proxy.policies.chain import EnforcementPolicies
from kqp.proxy.topics import TopicDirectory
from kqp.quotas import QuotaEngine
from kqp.quotas.settings import QuotaEntity, QuotaEntry, QuotaSettings


def create_topics(correlation_id: int, partitions: int, version: int = 7) -> bytes:
    request_class = API_SPECS[CREATE_TOPICS_KEY].request_class[version]
    topic = request_class.CreatableTopic(name=f"t-{uuid.uuid4().hex[:8]}", num_partitions=partitions,
                                         replication_factor=1, assignments=[], configs=[])
    request = request_class(topics=[topic], timeout_ms=30000, validate_only=False)
    return encode_request_header(CREATE_TOPICS_KEY, version, correlation_id, "creator") + encode_body(
        request, version)


def answer_create_topics(header: RequestHeader, body: bytes) -> bytes:
    request = decode_body(CREATE_TOPICS_KEY, header.api_version, body, is_request=True)
    response_class = API_SPECS[CREATE_TOPICS_KEY].response_class[header.api_version]
    result = response_class.CreatableTopicResult
    topics = [result(name=t.name, topic_id=uuid.uuid4(), error_code=0, error_message=None,
                     num_partitions=t.num_partitions, replication_factor=1, configs=None) for t in request.topics]
    return encode_body(response_class(throttle_time_ms=0, topics=topics), header.api_version)


def creator_enforcement() -> EnforcementPolicies:
    """Client "creator" at 1000 partitions/s over 11 one-second windows: a bucket of 11000
    partitions, on the running loop's clock."""
    loop = asyncio.get_running_loop()
    settings = QuotaSettings(entries=(
        QuotaEntry(QuotaEntity(client_id="creator"), {"controller_mutation_rate": 1000.0}),))
    return EnforcementPolicies(QuotaEngine(settings), EnforcementSection(), lambda: loop.time() * 1000.0,
                            TopicDirectory())
