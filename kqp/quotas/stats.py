"""Kafka's quota metric primitives: the windowed Rate, the KIP-599 token bucket, throttle formulas.

Everything here mirrors `org.apache.kafka.common.metrics` (Kafka >= 3.8) number for number:
times are integer milliseconds passed in by the caller, arithmetic is IEEE double as in Java,
and rounding is Java's `Math.round` (`floor(x + 0.5)`), never Python's banker's `round`.
"""

from __future__ import annotations

# Long.MAX_VALUE as a double: the bound Kafka gives a sensor whose tags have no quota.
LONG_MAX = 2**63 - 1
NO_QUOTA_BOUND = float(LONG_MAX)
INT_MAX = 2**31 - 1


def java_round(x: float) -> int:
    """Java's Math.round(double): the closest long, halves up (-0.5 -> 0, not Python's
    round-half-even); NaN -> 0; saturates at Long.MIN/MAX_VALUE (so +Infinity -> Long.MAX)."""
    if x != x:
        return 0
    if x >= NO_QUOTA_BOUND:
        return LONG_MAX
    if x <= -NO_QUOTA_BOUND:
        return -LONG_MAX - 1
    # math.floor, without the module attribute lookup and call it costs in the compiled build:
    # int() truncates toward zero, one less below zero.
    floor = int(x)
    if floor > x:
        floor -= 1
    # x - floor is exact, so 0.49999999999999994 rounds to 0 as in Java 7+ (floor(x + 0.5) gives 1).
    return floor + 1 if x - floor >= 0.5 else floor


def ordered_sum(values: list[float]) -> float:
    """The values added left to right in double precision, as Java's loop over the samples
    (WindowedSum.measure); `sum()` is the same on Python 3.11 but compensated from 3.12 on, and
    a builtin the compiled build looks up on every call."""
    total = 0.0
    for value in values:
        total += value
    return total


def java_long_div(a: int, b: int) -> int:
    """Java's long division: truncates toward zero, where Python's // floors."""
    quotient = abs(a) // abs(b)
    return quotient if (a >= 0) == (b > 0) else -quotient


def throttle_time(value: float, bound: float, window_size_ms: float) -> int:
    """QuotaUtils.throttleTime: the delay X that brings the rate back to the bound.

    With observed rate O over window W and quota T, O * W / (W + X) = T gives
    X = (O - T) / T * W. Negative when below quota (callers only throttle when > 0).
    """
    if bound == 0:
        # Java divides by 0.0: +/-Infinity (or NaN) saturate in Math.round.
        return LONG_MAX if value > 0 else (0 if value == 0 else -LONG_MAX - 1)
    return java_round((value - bound) / bound * window_size_ms)


def token_bucket_throttle_time(tokens: float, rate: float) -> int:
    """ControllerMutationQuotaManager.throttleTimeMs: time to refill a deficit back to zero."""
    return java_round(-tokens / rate * 1000)


def java_int(ms: int) -> int:
    """Java's (int) of a long, as Kafka 4.3 converts every throttle (`l2i`): it wraps.

    A throttle beyond Integer.MAX_VALUE ms (24.8 days, only with absurdly small quotas) thus
    comes out negative, which Kafka treats as no throttle; kqp does the same.
    """
    return ((ms + 2**31) % 2**32) - 2**31


class WindowedRate:
    """A Rate over a WindowedSum, with Kafka's quota check (value <= bound passes).

    Samples live in three parallel lists that grow lazily up to `samples + 1` entries, like
    SampledStat's ArrayList (the extra slot keeps a sample that overlaps the window, Kafka 3.8).
    Two derived values are cached so that the common record costs no loop: the oldest sample
    start, and the earliest time at which any sample can become obsolete.
    """

    __slots__ = (
        "_current",
        "_expire_age_ms",
        "_last_events",
        "_min_full_windows",
        "_oldest_start",
        "_purge_at",
        "_ring",
        "_starts",
        "_values",
        "bound",
        "samples",
        "window_ms",
    )

    def __init__(self, samples: int, window_ms: int, bound: float = NO_QUOTA_BOUND) -> None:
        if samples < 1 or window_ms < 1:
            raise ValueError("samples and window must be >= 1")
        self.samples = samples
        self.window_ms = window_ms
        self.bound = bound
        self._ring = samples + 1
        self._expire_age_ms = samples * window_ms
        self._min_full_windows = samples - 1
        self._starts: list[int] = []
        self._last_events: list[int] = []
        self._values: list[float] = []
        self._current = 0
        self._oldest_start = 0
        self._purge_at = 0

    # -- SampledStat ---------------------------------------------------------------------------

    def record(self, value: float, now_ms: int) -> None:
        """SampledStat.record: roll to a new sample when the current one is complete, then add."""
        starts = self._starts
        if not starts:
            self._new_first_sample(now_ms)
            starts = self._starts
        current = self._current
        if now_ms - starts[current] >= self.window_ms:
            current = self._advance(now_ms)
        self._values[current] += value
        self._last_events[current] = now_ms

    def record_at(self, value: float, at_ms: int, now_ms: int) -> None:
        """Record at `now_ms` a value that was recorded elsewhere at `at_ms` (a fleet instance's
        usage, reported late: kqp.quotas.fleet). No Kafka counterpart: one broker records each
        value when it happens. The value goes to the sample that would have taken it then, as
        far as the samples since allow: the current one if it had started by `at_ms` (rolled
        first if `at_ms` is past its span, as `record` would have), the one before it if
        `at_ms` falls in that one's span, else the current one (a rate with no sample yet starts
        its first at `now_ms`, when it is created). Either way the sample's last event moves to
        `at_ms` at most, never to `now_ms`: purgeObsoleteSamples keeps a sample until samples x
        window after its last event, so a value dated at its arrival would stay in the window
        longer than it stays in the reporter's own by the report's delay."""
        starts = self._starts
        if at_ms >= now_ms or not starts:
            self.record(value, now_ms)
            return
        current = self._current
        target = current
        if at_ms >= starts[current]:
            if at_ms - starts[current] >= self.window_ms:
                target = self._advance(at_ms)
        else:
            # The slots fill in ring order, so the one before the current is the previous sample.
            previous = (current - 1) % self._ring
            if previous < len(starts) and previous != current and \
                    starts[previous] <= at_ms < starts[previous] + self.window_ms:
                target = previous
        self._values[target] += value
        if at_ms > self._last_events[target]:
            self._last_events[target] = at_ms
            self._refresh_cached_bounds()

    def _new_first_sample(self, now_ms: int) -> None:
        # Exact-size lists: most clients of a churny workload never get a second sample.
        self._starts = [now_ms]
        self._last_events = [now_ms]
        self._values = [0.0]
        self._current = 0
        self._oldest_start = now_ms
        self._purge_at = now_ms + self._expire_age_ms

    def _advance(self, now_ms: int) -> int:
        current = (self._current + 1) % self._ring
        self._current = current
        if current >= len(self._starts):
            self._starts.append(now_ms)
            self._last_events.append(now_ms)
            self._values.append(0.0)
        else:
            self._starts[current] = now_ms
            self._last_events[current] = now_ms
            self._values[current] = 0.0
        self._refresh_cached_bounds()
        return current

    def _refresh_cached_bounds(self) -> None:
        self._oldest_start = min(self._starts)
        self._purge_at = min(self._last_events) + self._expire_age_ms

    def purge(self, now_ms: int) -> None:
        """purgeObsoleteSamples: reset in place every sample with no event inside the window."""
        if now_ms < self._purge_at:
            return
        expire_age = self._expire_age_ms
        last_events = self._last_events
        for i in range(len(last_events)):
            if now_ms - last_events[i] >= expire_age:
                self._starts[i] = now_ms
                last_events[i] = now_ms
                self._values[i] = 0.0
        if last_events:
            self._refresh_cached_bounds()

    def _oldest(self, now_ms: int) -> int:
        if not self._starts:
            # SampledStat.oldest creates a sample when there is none.
            self._new_first_sample(now_ms)
        return self._oldest_start

    # -- Rate ----------------------------------------------------------------------------------

    def window_size(self, now_ms: int) -> int:
        """Rate.windowSize: elapsed time since the oldest sample, padded to samples - 1 full windows."""
        self.purge(now_ms)
        return self._padded_elapsed(now_ms - self._oldest(now_ms))

    def _padded_elapsed(self, elapsed: int) -> int:
        window = self.window_ms
        # (int) (elapsed / window) in Rate.windowSize: truncation, which differs from // when a
        # record is older than the oldest sample (elapsed < 0).
        full_windows = java_long_div(elapsed, window)
        if full_windows < self._min_full_windows:
            elapsed += (self._min_full_windows - full_windows) * window
        return elapsed if elapsed > 1 else 1

    def total(self, now_ms: int) -> float:
        """WindowedSum.measure: the sum over every sample, the overlapping one included."""
        self.purge(now_ms)
        return ordered_sum(self._values)

    def measure(self, now_ms: int) -> float:
        value = self.total(now_ms)
        return value / (self.window_size(now_ms) / 1000.0)

    # -- Sensor.record(value, now, checkQuotas=True) followed by the throttle formula -----------

    def record_and_throttle(self, value: float, now_ms: int) -> int:
        """Record, check the quota, and return QuotaUtils.throttleTime if violated (else 0).

        The value stays recorded whether or not the quota is violated (Sensor.record order).
        """
        # record(), inlined: this is the per-request hot path.
        starts = self._starts
        if not starts:
            self._new_first_sample(now_ms)
            starts = self._starts
        current = self._current
        if now_ms - starts[current] >= self.window_ms:
            current = self._advance(now_ms)
        values = self._values
        values[current] += value
        self._last_events[current] = now_ms
        if now_ms >= self._purge_at:
            self.purge(now_ms)
        # Rate.windowSize, inlined.
        elapsed = now_ms - self._oldest_start
        window = self.window_ms
        full_windows = elapsed // window if elapsed >= 0 else java_long_div(elapsed, window)
        if full_windows < self._min_full_windows:
            elapsed += (self._min_full_windows - full_windows) * window
        if elapsed < 1:
            elapsed = 1
        rate = ordered_sum(values) / (elapsed / 1000.0)
        if rate <= self.bound:
            return 0
        return self._throttle_time(rate, elapsed)

    def throttle_with(self, extra: float, now_ms: int) -> int:
        """The throttle `record_and_throttle` would give if `extra` more had been recorded."""
        elapsed = self.window_size(now_ms)
        rate = (self.total(now_ms) + extra) / (elapsed / 1000.0)
        if rate <= self.bound:
            return 0
        return self._throttle_time(rate, elapsed)

    def _throttle_time(self, rate: float, elapsed_ms: int) -> int:
        """QuotaUtils.throttleTime for a rate above the bound."""
        bound = self.bound
        if bound <= 0:
            return LONG_MAX  # Java: (O - 0) / 0.0 = Infinity, and Math.round(Infinity) = Long.MAX
        return java_round((rate - bound) / bound * elapsed_ms)

    def peek(self, now_ms: int) -> float:
        """The rate `measure(now_ms)` would report, without purging (observability must not
        change the arithmetic enforcement sees later)."""
        if not self._starts:
            return 0.0
        expire_age = self._expire_age_ms
        total = 0.0
        oldest = now_ms
        for start, last_event, value in zip(self._starts, self._last_events, self._values, strict=True):
            if now_ms - last_event >= expire_age:
                continue  # would be purged: value 0, start = now
            total += value
            if start < oldest:
                oldest = start
        return total / (self._padded_elapsed(now_ms - oldest) / 1000.0)

    def recent_total(self, now_ms: int, span_ms: int) -> float:
        """The bytes recorded over the last `span_ms`, without purging: each sample that started
        inside the span whole, the one that straddles its start prorated over its events' time
        (as if recorded evenly from its start to its last event; a sample of one event is at
        that event's time, inside or not)."""
        cut = now_ms - span_ms
        total = 0.0
        for start, last_event, value in zip(self._starts, self._last_events, self._values, strict=True):
            if start >= cut:
                total += value
            elif last_event > cut:
                total += value * (last_event - cut) / (last_event - start)
        return total

    @property
    def sample_count(self) -> int:
        """Samples allocated so far (at most samples + 1)."""
        return len(self._starts)


class TokenBucket:
    """KIP-599 TokenBucket: refills at `bound` tokens/s up to burst = samples x window_s x bound.

    Kafka's bucket starts empty at epoch 0 and its first refill (with wall-clock milliseconds)
    fills it; with caller-supplied times that may start near zero, the bucket starts full instead.
    """

    __slots__ = ("bound", "last_update_ms", "samples", "tokens", "window_ms")

    def __init__(self, samples: int, window_ms: int, bound: float, now_ms: int) -> None:
        self.samples = samples
        self.window_ms = window_ms
        self.bound = bound
        self.tokens = self.burst
        self.last_update_ms = now_ms

    @property
    def burst(self) -> float:
        return self.samples * (self.window_ms / 1000.0) * self.bound

    def _refill(self, now_ms: int) -> None:
        self.tokens = min(self.burst, self.tokens + self.bound * ((now_ms - self.last_update_ms) / 1000.0))
        self.last_update_ms = now_ms

    def measure(self, now_ms: int) -> float:
        self._refill(now_ms)
        return self.tokens

    def record(self, value: float, now_ms: int) -> None:
        self._refill(now_ms)
        self.tokens = min(self.burst, self.tokens - value)

    def peek(self, now_ms: int) -> float:
        """Tokens at now_ms without moving the bucket's clock."""
        return min(self.burst, self.tokens + self.bound * ((now_ms - self.last_update_ms) / 1000.0))
