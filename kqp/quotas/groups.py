"""An example KIP-257 callback: quota groups pooling several client-ids into one sensor.

    quotas:
      callback: "kqp.quotas.groups:QuotaGroupsCallback"
      callback_options:
        groups: {ingest: [ingest-a, ingest-b, ingest-c]}
      entries:
        - entity: {client-id: ingest}        # the group's name, used as a client-id entity
          producer_byte_rate: 10485760       # shared by ingest-a, ingest-b and ingest-c

Clients of a group are metered under the tags (user "", client-id <group>), so they share one
rate and one limit: the limit configured for the client-id entity named after the group (or
the `<default>` client-id). Every other client gets Kafka's default eight-level precedence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kqp.quotas.callbacks import CLIENT_ID_TAG, USER_TAG, ClusterMetadata, DefaultQuotaCallback
from kqp.quotas.settings import DEFAULT_ENTITY, QuotaEntity, QuotaType


class QuotaGroupsCallback:
    """Pools the client-ids listed under each group name into one quota sensor."""

    def __init__(self, groups: Mapping[str, Sequence[str]]) -> None:
        self._group_of: dict[str, str] = {}
        for group, client_ids in groups.items():
            for client_id in client_ids:
                if self._group_of.setdefault(client_id, group) != group:
                    raise ValueError(f"client-id {client_id!r} is in two quota groups")
        self._groups = frozenset(groups)
        self._default = DefaultQuotaCallback()
        self._quotas: dict[QuotaType, dict[QuotaEntity, float]] = {}

    def quota_metric_tags(self, quota_type: QuotaType, user: str, client_id: str) -> Mapping[str, str]:
        group = self._group_of.get(client_id)
        if group is not None:
            return {USER_TAG: "", CLIENT_ID_TAG: group}
        return self._default.quota_metric_tags(quota_type, user, client_id)

    def quota_entity(self, quota_type: QuotaType, tags: Mapping[str, str]) -> QuotaEntity | None:
        group = tags.get(CLIENT_ID_TAG)
        if group in self._groups and not tags.get(USER_TAG):
            quotas = self._quotas.get(quota_type, {})
            for entity in (QuotaEntity(None, group), QuotaEntity(None, DEFAULT_ENTITY)):
                if entity in quotas:
                    return entity
            return None
        return self._default.quota_entity(quota_type, tags)

    def quota_limit(self, quota_type: QuotaType, tags: Mapping[str, str]) -> float | None:
        entity = self.quota_entity(quota_type, tags)
        return None if entity is None else self._quotas[quota_type][entity]

    def update_quota(self, quota_type: QuotaType, entity: QuotaEntity, value: float) -> None:
        self._quotas.setdefault(quota_type, {})[entity] = value
        self._default.update_quota(quota_type, entity, value)

    def remove_quota(self, quota_type: QuotaType, entity: QuotaEntity) -> None:
        self._quotas.get(quota_type, {}).pop(entity, None)
        self._default.remove_quota(quota_type, entity)

    def quota_reset_required(self, quota_type: QuotaType) -> bool:
        return False

    def update_cluster_metadata(self, metadata: ClusterMetadata) -> bool:
        return False

    def close(self) -> None:
        self._default.close()
