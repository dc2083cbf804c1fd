"""Which modules of kqp's per-request path are compiled with mypyc, listed once: setup.py builds
these and `kqp/__init__.py` loads them all compiled or all from source (docs/benchmarks.md,
"Compiled build"). Each stays an ordinary `.py` file, the one source of both builds.

mypyc compiles the modules of one build together: they call each other's functions and share
classes directly in C, so a build is loaded whole or not at all, never mixed with sources.
"""

from __future__ import annotations

# The top-level module, beside the kqp package, that holds the compiled code of all of them.
SHARED_LIBRARY = "kqp_compiled__mypyc"

COMPILED_MODULES: tuple[str, ...] = (
    # The protocol on each request and response: frames, headers, the flow-control gate, the
    # fast path's summaries, the throttle field's offset and the session that ties them
    # together (its events are plain generic classes: mypyc 2.4 builds no generic dataclass).
    # kqp.protocol.wire is not here: the generated codec's message classes subclass its
    # Message, and interpreted classes cannot subclass compiled ones (docs/benchmarks.md,
    # "Compiled build").
    "kqp.protocol.framing",
    "kqp.protocol.headers",
    "kqp.protocol.correlation",
    "kqp.protocol.throttle_field",
    "kqp.protocol.gate",
    "kqp.protocol.fast_path",
    "kqp.protocol.session",
    # The quota engine: each request's recording, its sensors' windows and the throttle time.
    "kqp.quotas.stats",
    "kqp.quotas.sensors",
    "kqp.quotas.settings",
    "kqp.quotas.managers",
    "kqp.quotas.engine",
    "kqp.quotas.quota_engine",
    "kqp.quotas.recording",
    # The guard's quota manager is a ClientQuotaManager: a compiled class has compiled subclasses only.
    "kqp.quotas.guard_limits",
    # The base of the frozen dataclasses above, which makes them picklable (Spark's workers).
    "kqp.frozen_value",
    # The proxy's per-request metric accumulators (each response's counts, bytes and histograms).
    "kqp.proxy.traffic_metrics",
    # The connection: each request's and response's way between the sockets, the session, the
    # gate and the hooks (strictly type-checked, as the modules above). Its two asyncio
    # protocol classes subclass asyncio.Protocol, so mypyc leaves them ordinary classes.
    "kqp.proxy.connection",
    # The whatif replay's per-request loop (kqp.spark_jobs.quota_replay hands it a group's
    # columns as lists): the replay's requests reach the compiled engine from compiled code.
    "kqp.spark_jobs.replay_loop",
)
