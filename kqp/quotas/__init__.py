"""kqp.quotas: Apache Kafka's client quota model as a pure library (no IO, no clock).

See docs/quotas.md for the model, formulas and precedence.
"""

from kqp.quotas.callbacks import (
    ClientQuotaCallback,
    ClusterMetadata,
    DefaultQuotaCallback,
    EntityResolvingCallback,
    load_callback,
)
from kqp.quotas.engine import MutationOutcome, QuotaManagers, ThrottleObserver, UsageSharing
from kqp.quotas.managers import EXEMPT_REQUEST_API_KEYS, STRICT_MUTATION_SINCE
from kqp.quotas.quota_engine import QuotaEngine
from kqp.quotas.sensors import SensorSnapshot
from kqp.quotas.settings import (
    DEFAULT_ENTITY,
    QUOTA_TYPES,
    IpQuotaEntry,
    QuotaEntity,
    QuotaEntry,
    QuotaSettings,
    QuotaType,
    Scope,
)

__all__ = [
    "DEFAULT_ENTITY",
    "EXEMPT_REQUEST_API_KEYS",
    "QUOTA_TYPES",
    "STRICT_MUTATION_SINCE",
    "ClientQuotaCallback",
    "ClusterMetadata",
    "DefaultQuotaCallback",
    "EntityResolvingCallback",
    "IpQuotaEntry",
    "MutationOutcome",
    "QuotaEngine",
    "QuotaEntity",
    "QuotaEntry",
    "QuotaManagers",
    "QuotaSettings",
    "QuotaType",
    "Scope",
    "SensorSnapshot",
    "ThrottleObserver",
    "UsageSharing",
    "load_callback",
]
