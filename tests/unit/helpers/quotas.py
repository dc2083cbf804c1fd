"""Building quota settings tersely in tests, and a fake clock that only moves when told."""

from __future__ import annotations

from collections.abc import Mapping

from kqp.quotas import DEFAULT_ENTITY, QuotaEntity, QuotaEntry, QuotaSettings, QuotaType

D = DEFAULT_ENTITY


class FakeClock:
    """Milliseconds that advance only through `sleep`, as Kafka's MockTime."""

    def __init__(self, start_ms: float = 0.0) -> None:
        self.now_ms = start_ms

    def sleep(self, ms: float) -> float:
        self.now_ms += ms
        return self.now_ms


def settings_for(
    quota_type: QuotaType, limits: Mapping[tuple[str | None, str | None], float], **options: object
) -> QuotaSettings:
    """One quota type over (user, client-id) entities; None = absent part, D = <default>."""
    entries = tuple(
        QuotaEntry(QuotaEntity(user, client), {quota_type: value}) for (user, client), value in limits.items()
    )
    return QuotaSettings(entries=entries, **options)  # type: ignore[arg-type]
