"""Capacity arithmetic: Cruise Control capacity files, headroom, broker loss and growth runway.

Pure Python, no Spark, no numpy: two callers share this one copy. The Spark jobs (analyze,
advise) aggregate traffic into per-second figures and this module turns them into verdicts;
the proxy's cluster guard (kqp.config's guard section, kqp.proxy.guard) reads the same capacity
file for its limits. It lives in kqp.quotas, below both, so that the configuration never
imports Spark-side code. It reads no file: kqp.config.capacity_file reads the capacity file
when a configuration is loaded or reloaded, and when a job starts, and hands its text here.

Capacity file: Cruise Control's `capacity.json` format, so operators reuse theirs:
``{"brokerCapacities": [{"brokerId": "-1", "capacity": {"DISK": "100000", "CPU": "100",
"NW_IN": "10000", "NW_OUT": "10000"}, "doc": "..."}]}``. Broker id -1 is the default for
every broker not listed. Units as in Cruise Control: DISK in MB, CPU in percent (or
``{"num.cores": "16"}``), NW_IN / NW_OUT in KB/s. JBOD files give DISK as a map of log dir
to MB; we sum it. Only the network resources can be judged from proxy traffic: CPU and
disk need broker-side measurements and retention, so they are parsed but not assessed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# The network resources of a broker, named as in Cruise Control's capacity file: the one copy
# of these names, which the fair-share model (and so the guard and advise) takes from here.
NW_IN = "NW_IN"
NW_OUT = "NW_OUT"
NETWORK_RESOURCES = (NW_IN, NW_OUT)
Resource = tuple[int, str]  # (broker, NW_IN | NW_OUT)

# Cruise Control turns the broker's byte-rate metrics into KB/s by dividing by 1024.
CC_KB_BYTES = 1024
DEFAULT_BROKER_ID = -1

# Cruise Control's default capacity thresholds (`network.inbound.capacity.threshold`,
# `network.outbound.capacity.threshold`): a broker is "full" at 80 % of its network.
DEFAULT_NETWORK_THRESHOLD = 0.8



class CapacityFileError(ValueError):
    """The capacity file is not in Cruise Control's format."""


@dataclass(frozen=True)
class BrokerCapacity:
    """One broker's declared capacity, network in bytes/s."""

    broker_id: int
    nw_in_bytes_per_s: float
    nw_out_bytes_per_s: float
    cpu: float | None = None
    disk_mb: float | None = None

    def network_bytes_per_s(self, resource: str) -> float:
        return self.nw_in_bytes_per_s if resource == NW_IN else self.nw_out_bytes_per_s


@dataclass(frozen=True)
class CapacityFile:
    """Parsed capacity file: explicit brokers plus the optional -1 default."""

    brokers: Mapping[int, BrokerCapacity]
    default: BrokerCapacity | None

    def for_broker(self, broker_id: int) -> BrokerCapacity:
        """The broker's capacity, falling back to the -1 default.

        Raises:
            CapacityFileError: neither the broker nor a default is in the file.
        """
        found = self.brokers.get(broker_id, self.default)
        if found is None:
            raise CapacityFileError(f"broker {broker_id} has no entry and the file has no default (-1) entry")
        return found


def _number(value: Any, what: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError) as error:
        raise CapacityFileError(f"{what}: {value!r} is not a number") from error


def parse_capacity(document: Mapping[str, Any]) -> CapacityFile:
    """Parse a Cruise Control capacity document (already decoded from JSON)."""
    entries = document.get("brokerCapacities")
    if not isinstance(entries, list) or not entries:
        raise CapacityFileError("expected a non-empty 'brokerCapacities' list")
    brokers: dict[int, BrokerCapacity] = {}
    default: BrokerCapacity | None = None
    for entry in entries:
        broker_id = int(_number(entry.get("brokerId"), "brokerId"))
        capacity = entry.get("capacity")
        if not isinstance(capacity, Mapping):
            raise CapacityFileError(f"broker {broker_id}: missing 'capacity' object")
        for resource in NETWORK_RESOURCES:
            if resource not in capacity:
                raise CapacityFileError(f"broker {broker_id}: missing {resource}")
        disk = capacity.get("DISK")
        if isinstance(disk, Mapping):  # JBOD: one size per log dir
            disk = sum(_number(size, f"broker {broker_id} DISK") for size in disk.values())
        cpu = capacity.get("CPU")
        if isinstance(cpu, Mapping):  # the cores variant
            cpu = cpu.get("num.cores")
        parsed = BrokerCapacity(
            broker_id=broker_id,
            nw_in_bytes_per_s=_number(capacity[NW_IN], f"broker {broker_id} NW_IN") * CC_KB_BYTES,
            nw_out_bytes_per_s=_number(capacity[NW_OUT], f"broker {broker_id} NW_OUT") * CC_KB_BYTES,
            cpu=None if cpu is None else _number(cpu, f"broker {broker_id} CPU"),
            disk_mb=None if disk is None else _number(disk, f"broker {broker_id} DISK"),
        )
        if broker_id == DEFAULT_BROKER_ID:
            default = parsed
        else:
            brokers[broker_id] = parsed
    return CapacityFile(brokers=brokers, default=default)


def parse_capacity_json(text: str, source: str) -> CapacityFile:
    """Parse a capacity file's text; `source` (its path) names it in the error. The file is
    read above this package (kqp.config.capacity_file), which stays free of IO."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise CapacityFileError(f"{source}: not JSON ({error})") from error
    return parse_capacity(document)


def runway_months(load: float, limit: float, monthly_growth: float) -> float | None:
    """Months until `load`, growing by `monthly_growth` per month, reaches `limit`.

    0 when already at or above the limit; None when it never gets there (no growth, or
    nothing to grow). Compound growth: load * g**m = limit, so m = ln(limit/load) / ln(g).
    """
    if load >= limit:
        return 0.0
    if load <= 0 or monthly_growth <= 1.0:
        return None
    return math.log(limit / load) / math.log(monthly_growth)


@dataclass(frozen=True)
class Headroom:
    """Load against one broker resource.

    `limit` is capacity x threshold; `utilisation` is load / capacity; `growth_to_limit` is how
    many times the load can grow before reaching the limit (inf when the load is zero).
    """

    broker: int
    resource: str
    load_bytes_per_s: float
    capacity_bytes_per_s: float
    threshold: float
    limit_bytes_per_s: float
    utilisation: float
    headroom_bytes_per_s: float
    growth_to_limit: float
    runway_months: float | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "broker": self.broker,
            "resource": self.resource,
            "load_bytes_per_s": self.load_bytes_per_s,
            "capacity_bytes_per_s": self.capacity_bytes_per_s,
            "threshold": self.threshold,
            "limit_bytes_per_s": self.limit_bytes_per_s,
            "utilisation": self.utilisation,
            "headroom_bytes_per_s": self.headroom_bytes_per_s,
            "growth_to_limit": None if math.isinf(self.growth_to_limit) else self.growth_to_limit,
            "runway_months": self.runway_months,
        }


def headroom(
    loads: Iterable[tuple[int, str, float]],
    capacity: CapacityFile,
    thresholds: Mapping[str, float],
    monthly_growth: float,
) -> list[Headroom]:
    """Judge (broker, resource, load bytes/s) triples against the capacity file.

    Args:
        loads: the load to judge per broker and network resource (e.g. its p99 per second).
        capacity: declared capacities.
        thresholds: fraction of capacity usable per resource (Cruise Control: 0.8 network).
        monthly_growth: growth factor per month for the runway (1.05 = 5 % a month).
    """
    results = []
    for broker, resource, load in loads:
        capacity_bytes = capacity.for_broker(broker).network_bytes_per_s(resource)
        threshold = thresholds[resource]
        limit = capacity_bytes * threshold
        results.append(
            Headroom(
                broker=broker,
                resource=resource,
                load_bytes_per_s=load,
                capacity_bytes_per_s=capacity_bytes,
                threshold=threshold,
                limit_bytes_per_s=limit,
                utilisation=load / capacity_bytes if capacity_bytes > 0 else math.inf,
                headroom_bytes_per_s=limit - load,
                growth_to_limit=limit / load if load > 0 else math.inf,
                runway_months=runway_months(load, limit, monthly_growth),
            )
        )
    return results


def binding_constraint(rows: Iterable[Headroom]) -> Headroom | None:
    """The broker resource that reaches its limit first as traffic grows uniformly."""
    return min(rows, key=lambda row: row.growth_to_limit, default=None)


def brokers_needed(
    cluster_load: Mapping[str, float],
    broker_capacity: Mapping[str, float],
    target_utilisation: float,
    minimum: int = 1,
) -> int:
    """Brokers needed so that each network resource carries the cluster's load at the target.

    Args:
        cluster_load: bytes/s per resource summed over brokers, replication included (the
            replication total, (RF-1) x produce, does not depend on the broker count).
        broker_capacity: one broker's capacity per resource, bytes/s.
        target_utilisation: the share of a broker's capacity to plan for (sizing guides use 0.5-0.6).
        minimum: the floor, e.g. the replication factor.
    """
    needed = minimum
    for resource, load in cluster_load.items():
        usable = broker_capacity[resource] * target_utilisation
        if usable > 0:
            needed = max(needed, math.ceil(load / usable))
    return needed
