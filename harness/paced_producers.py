"""Several librdkafka producers of one client-id, each pacing an offer, as a service scaled out.

Used by the integration test of a client-id spread over many connections and by
bench/scaled_out_client.py, so both measure the same way: what each producer had
acknowledged, second by second, counted from its delivery reports; what is still queued at
the end is purged, not counted. librdkafka's request time-outs (a request in flight longer
than `request.timeout.ms`, after which it tears the connection down and retries) do not
surface as delivery errors with its default retries, so they are read from its statistics
(`req_timeouts` of every broker handle), with its connects for the reconnects they cause.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field

from confluent_kafka import Producer

RECORD_SIZE = 1024
# Tens of MB, as an application keeps (librdkafka's default is 1 GB or 100 000 records):
# the offer waits when it is full, as an application's would, and is never dropped.
QUEUE_KBYTES = 64 * 1024


@dataclass
class ProducerTally:
    """What one producer got: acknowledged bytes by second since the common start, and what it
    offered: the bytes handed to produce() by second (`offered`, kept when the tally is made
    with one list per second: offer_from_clients), the load as the application meant it, before
    librdkafka queued and batched it."""

    per_second: list[int]
    request_timeouts: int = 0
    connects: int = 0
    delivery_errors: int = 0
    error_names: dict[str, int] = field(default_factory=dict)
    offered: list[int] = field(default_factory=list)

    def rate(self, first: int, last: int) -> float:
        """Bytes/s acknowledged in seconds [first, last)."""
        return sum(self.per_second[first:last]) / (last - first)


def _broker_counters(stats_json: str) -> tuple[int, int]:
    """(request time-outs, connects) summed over the producer's broker handles."""
    stats = json.loads(stats_json)
    timeouts = connects = 0
    for broker in stats.get("brokers", {}).values():
        timeouts += int(broker.get("req_timeouts", 0))
        connects += int(broker.get("connects", 0))
    return timeouts, connects


def _producer(bootstrap: str, client_id: str, tally: ProducerTally, config: dict[str, object]) -> Producer:
    lock = threading.Lock()

    def on_stats(stats_json: str) -> None:
        timeouts, connects = _broker_counters(stats_json)
        with lock:
            tally.request_timeouts, tally.connects = timeouts, connects

    return Producer({"bootstrap.servers": bootstrap, "client.id": client_id, "linger.ms": 5, "acks": "all",
                     "queue.buffering.max.kbytes": QUEUE_KBYTES, "statistics.interval.ms": 1000,
                     "stats_cb": on_stats, **config})


def _connect(producer: Producer, topic: str) -> None:
    """One record sent and acknowledged, not counted: the producer has its metadata and its
    connection to the partition's leader before the offer starts. A new librdkafka producer
    needs a second or two for that on a busy host (bootstrap, metadata, the leader's connection,
    each through the proxy), and queues what it is handed meanwhile: once connected it sends
    that backlog at once, so the broker's next quota window carries the offer of more seconds
    than it spans (a fresh clone's busy run: the guard measured 1.05x its limit from producers
    offering 0.97x of it, issue 41)."""
    producer.produce(topic, b"x" * RECORD_SIZE)
    if producer.flush(30) > 0:
        raise RuntimeError(f"a producer could not reach {topic} within 30 s")


def _produce_paced(bootstrap: str, topic: str, client_id: str, offered: float, seconds: float, start: float,
                   tally: ProducerTally, config: dict[str, object], producer: Producer | None = None) -> None:
    def on_delivery(error: object, _message: object) -> None:
        second = int(time.monotonic() - start)
        if error is not None:
            tally.delivery_errors += 1
            name = str(getattr(error, "name", lambda: error)())
            tally.error_names[name] = tally.error_names.get(name, 0) + 1
        elif second < len(tally.per_second):
            tally.per_second[second] += RECORD_SIZE

    if producer is None:
        producer = _producer(bootstrap, client_id, tally, config)
    payload = b"x" * RECORD_SIZE
    sent = 0
    began = time.monotonic()
    while (now := time.monotonic()) < start + seconds:
        due = int(offered * (now - began)) - sent
        while due >= RECORD_SIZE:
            try:
                producer.produce(topic, payload, on_delivery=on_delivery)
            except BufferError:
                break  # the queue is full: the offer waits, as an application's would
            sent += RECORD_SIZE
            due -= RECORD_SIZE
            second = int(now - start)
            if second < len(tally.offered):
                tally.offered[second] += RECORD_SIZE
        producer.poll(0.005)
    producer.poll(0)  # the last delivery reports of the measured seconds
    producer.purge()  # the backlog is not part of the measurement
    producer.flush(30)


def offer_from_many(bootstrap: str, topic: str, client_id: str, producers: int, offered_each: float,
                    seconds: float, config: dict[str, object] | None = None) -> list[ProducerTally]:
    """`producers` librdkafka producers with one client-id, each offering `offered_each`
    bytes/s for `seconds`, started together; one tally per producer."""
    start = time.monotonic()
    tallies = [ProducerTally([0] * int(seconds)) for _ in range(producers)]
    threads = [threading.Thread(target=_produce_paced, name=f"producer-{index}", daemon=True,
                                args=(bootstrap, topic, client_id, offered_each, seconds, start, tally,
                                      config or {}))
               for index, tally in enumerate(tallies)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 90)
    return tallies


def offer_from_clients(bootstrap: str, topic: str, offers: dict[str, float], seconds: float,
                       config: dict[str, object] | None = None,
                       connected_first: bool = False) -> dict[str, ProducerTally]:
    """One librdkafka producer per client-id, each offering its own bytes/s for `seconds`, started
    together; one tally per client-id. `connected_first`: each producer is made and has sent one
    record (not counted) before the common start, so that the offer reaches the broker as it is
    made from the first second (_connect); otherwise each is made at the start, as an
    application starts."""
    tallies = {client_id: ProducerTally([0] * int(seconds), offered=[0] * int(seconds)) for client_id in offers}
    producers: dict[str, Producer | None] = dict.fromkeys(offers)
    if connected_first:
        for client_id in offers:
            producer = producers[client_id] = _producer(bootstrap, client_id, tallies[client_id], config or {})
            _connect(producer, topic)
    start = time.monotonic()
    threads = [threading.Thread(target=_produce_paced, name=f"producer-{client_id}", daemon=True,
                                args=(bootstrap, topic, client_id, offered, seconds, start, tallies[client_id],
                                      config or {}, producers[client_id]))
               for client_id, offered in offers.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 90)
    return tallies
