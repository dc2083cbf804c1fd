"""Fixtures of the IO-layer tests. A module that needs a broker answering more than Heartbeat
defines its own `broker` fixture, which takes precedence over this one."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.unit.helpers.fake_broker import FakeBroker
from tests.unit.helpers.proxy import HEARTBEAT_KEY, answer_heartbeat


@pytest.fixture
async def broker() -> AsyncIterator[FakeBroker]:
    """A scripted broker that answers Heartbeat."""
    fake = FakeBroker(handlers={HEARTBEAT_KEY: answer_heartbeat})
    await fake.start()
    yield fake
    await fake.stop()
