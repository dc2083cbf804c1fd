"""Every dataclass of the compiled modules survives pickle, in the build that runs.

Spark ships the quota settings to its Python workers pickled (whatif's and advise's engine
factories close over them). On the compiled build, mypyc's default pickling of a frozen dataclass
failed in the worker (FrozenInstanceError); kqp.frozen_value pickles them through their
constructor instead. tests/unit/test_build.py runs this file on the pure build too.
"""

from __future__ import annotations

import dataclasses
import importlib
import pickle
import uuid
from collections.abc import Callable

import pytest

import kqp
from kqp.compiled_modules import COMPILED_MODULES
from kqp.frozen_value import FrozenValue
from kqp.protocol.fast_path import (
    FetchPartitionRequest,
    FetchRequestSummary,
    FetchSummary,
    PartitionSummary,
    ProduceSummary,
)
from kqp.protocol.gate import Actions
from kqp.proxy.connection import ConnectionServices
from kqp.proxy.exchange import CaptureFindings, FetchFindings, FleetCharge, MutationFindings, MutationNote
from kqp.proxy.hooks import ClientView, RequestVerdict, ResponseVerdict
from kqp.quotas.engine import MutationOutcome
from kqp.quotas.recording import QuotaClient, QuotaTrace, RequestCharges, RequestOutcome, ResponseCharges
from kqp.quotas.sensors import SensorSnapshot
from kqp.quotas.settings import DEFAULT_ENTITY, IpQuotaEntry, QuotaEntity, QuotaEntry, QuotaSettings

_ALICE = QuotaEntity(user="alice", client_id="app")
_PARTITION = PartitionSummary("orders", None, 3, 1_000, 10, 1, 0, 2)
_MUTATION = MutationOutcome([True, False], 120, [True, False], 120, False, 5_000)

# One instance of each, every field away from its default where it has one, so that a field the
# pickle dropped or swapped would show.
SAMPLES: tuple[object, ...] = (
    _ALICE,
    QuotaEntry(_ALICE, {"producer_byte_rate": 1_024.0, "request_percentage": 50.0}, True, "cluster"),
    IpQuotaEntry("10.0.0.7", 2.5),
    QuotaSettings(
        entries=(QuotaEntry(QuotaEntity(user=DEFAULT_ENTITY), {"consumer_byte_rate": 2_048.0}),),
        ip_entries=(IpQuotaEntry(DEFAULT_ENTITY, 10.0),),
        scope="cluster", dry_run=True, window_num=5, window_size_s=2, controller_window_num=3,
        controller_window_size_s=4, sensor_expiry_s=60.0, callback="pkg.module:Callback",
        callback_options={"k": "v"},
    ),
    Actions(forward=True, pause_reading=True, resume_reading=True, unmute_at=12.5, cancel_unmute=True,
            drained=True),
    SensorSnapshot("producer_byte_rate", "broker", "1", "alice", "app", {"user": "alice"}, 10.0, 20.0,
                   None, 2, 300, True),
    QuotaClient("1", "User:alice", "app"),
    RequestCharges(0, 9, 512, (("orders", 3),), True),
    RequestOutcome(40, 1_024, _MUTATION),
    ResponseCharges(1, 10, 2_000, 1.5),
    QuotaTrace("1", 1, 2.0, 3, 4.0, RequestCharges(1, 12, fetch=True), ResponseCharges(1, fetch_bytes=9)),
    _MUTATION,
    _PARTITION,
    PartitionSummary(None, uuid.UUID(int=7), 0, 10, 1, 1, 4, 2, 6, 99),
    ProduceSummary(-1, 30_000, True, [_PARTITION]),
    FetchSummary(5, 0, [_PARTITION], 1),
    FetchPartitionRequest(None, uuid.UUID(int=9), 1, 100, 1_048_576),
    FetchRequestSummary(500, 1, 52_428_800, 17, 1, [FetchPartitionRequest("t", None, 0, 0, 1)], 42, 3),
)


# Never pickled: what every connection of one proxy process shares (its event loop, callbacks),
# and what the hooks see of a connection, record on one exchange and decide, made and read
# within the proxy process.
NEVER_PICKLED: frozenset[type] = frozenset({
    ConnectionServices, CaptureFindings, FetchFindings, FleetCharge, MutationFindings, MutationNote,
    ClientView, RequestVerdict, ResponseVerdict,
})


def _dataclasses_of_the_compiled_modules() -> set[type]:
    found: set[type] = set()
    for name in COMPILED_MODULES:
        for value in vars(importlib.import_module(name)).values():
            if isinstance(value, type) and value.__module__ == name and dataclasses.is_dataclass(value):
                found.add(value)
    return found - NEVER_PICKLED


def test_every_dataclass_of_the_compiled_modules_has_a_sample() -> None:
    assert {type(sample) for sample in SAMPLES} == _dataclasses_of_the_compiled_modules()


def test_every_frozen_one_pickles_through_its_constructor() -> None:
    frozen = {cls for cls in _dataclasses_of_the_compiled_modules()
              if cls.__dataclass_params__.frozen}
    assert frozen
    assert {cls for cls in frozen if not issubclass(cls, FrozenValue)} == set()


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda sample: type(sample).__name__)
@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_a_pickled_instance_comes_back_equal(sample: object, protocol: int) -> None:
    copy = pickle.loads(pickle.dumps(sample, protocol))
    assert type(copy) is type(sample)
    assert copy == sample


def test_settings_reach_a_spark_worker_as_whatif_sends_them() -> None:
    """whatif's engine factory is a closure over the settings, pickled by Spark's cloudpickle
    on the driver and loaded with plain pickle in the worker."""
    cloudpickle = pytest.importorskip("pyspark.cloudpickle")
    settings = next(sample for sample in SAMPLES if isinstance(sample, QuotaSettings))

    def factory() -> QuotaSettings:
        return settings

    loaded: Callable[[], QuotaSettings] = pickle.loads(cloudpickle.dumps(factory))
    assert loaded() == settings, kqp.BUILD
