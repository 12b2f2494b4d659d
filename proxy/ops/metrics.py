"""Prometheus metrics: what crihook counts on the call path, and what it reads when scraped.

Two kinds of figures:

- **Counted per call**, in plain dicts owned by the event loop (no lock, a dict increment and
  a bisect per call): every intercepted call from its `Outcome` (method, status, duration,
  and each hook's run from the outcome's trace: verdict, duration, the fields it adjusted),
  every pass-through call from the data path through `observe_call`.
- **Read when scraped**, also on the loop: the chain's per-hook counters and breakers, the
  pools the built-in hooks keep (`Hook.usage`, see `hooks.spec.usage`) and their own
  failures (`Hook.failures`), each hook's timeout, the store's size and health, failed
  updates to other containers, readiness and the build.

`snapshot()` copies both on the loop (the state is the loop's; reading it from a thread
would race with the calls), in plain dicts and tuples: cheap. `Snapshot.families()` builds
the metric families from that copy, and `proxy.ops.metrics_http` renders them as text, both in a
worker thread.

Labels are bounded: CRI method names (a method crihook does not know is `other`), status
codes, hook names from the config, stages, verdicts, adjustment fields, pool names, NUMA
nodes and the kinds of work a hook names in `Hook.failures`. Never a pod or container name or id.

The data path reports a pass-through call with

    metrics.observe_call(method, PASSTHROUGH, code, origin, seconds)

`code` the gRPC status name (`OK`...), `origin` who ended a failed call (`crihook`,
`runtime`, `kubelet`), `seconds` None for a stream (counted, not timed).
"""

from __future__ import annotations

import platform
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, NamedTuple

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from crihook import __version__
from crihook.hooks.spec import Adjustment, PoolUsage
from crihook.proxy.chain.chain import Chain, failures_of
from crihook.proxy.chain.dropin_files import Distrust
from crihook.proxy.chain.local_hooks import LocalHook
from crihook.proxy.core.histogram import Histogram
from crihook.proxy.core.updates import WINDOW_BUCKETS
from crihook.proxy.cri.method_labels import INTERCEPTED, PASSTHROUGH, method_label
from crihook.proxy.cri.outcome import Outcome
from crihook.proxy.cri.readiness import Readiness
from crihook.proxy.state.store import Store

__all__ = [
    "CALL_BUCKETS",
    "HOOK_BUCKETS",
    "INTERCEPTED",
    "PASSTHROUGH",
    "Histogram",
    "Metrics",
    "Snapshot",
    "Sources",
    "method_label",
]

"""The `path` label: through the pipeline and its hooks, or relayed as bytes."""

CALL_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0, 120.0,
)  # fmt: skip
"""Seconds: a relayed ListContainers takes under a millisecond, a PullImage minutes."""
HOOK_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5,
)  # fmt: skip
"""Seconds: an in-process hook answers in microseconds, a plugin within its timeout."""

_USAGE_FAMILIES = {
    "cpu": ("crihook_pool_cpus", "CPUs by pool (exclusive, shared, reserved)", ("pool",)),
    "memory": (
        "crihook_pool_memory_bytes",
        "Memory per NUMA node and kind: allocatable, assigned to containers, free",
        ("numa_node", "resource", "state"),
    ),
    "device": ("crihook_pool_devices", "Devices per pool: held and free", ("pool", "state")),
}
_BREAKER_STATES = ("closed", "open", "half-open")
_HOOK_COUNTERS = (
    ("invocations", "calls", "Calls made to the hook (every stage)"),
    ("errors", "failures", "Hook failures: timeouts, unavailable, exceptions, bad adjustments"),
    ("timeouts", "timeouts", "Hook calls that did not answer within the hook's timeout"),
    ("conflicts", "conflicts", "Adjustments refused: a field another hook had set"),
    ("rejections", "rejected", "Calls the hook refused (a Reject: a decision, not a failure)"),
    ("skipped", "skipped", "Calls not made to the hook while its breaker was open"),
    ("ignored_failures", "ignored", "Failures under failure_policy=ignore: the call went on"),
    ("not_permitted", "not_permitted", "Adjustments with fields the hook may not set"),
)


@dataclass(frozen=True)
class Sources:
    """What metrics read when scraped (all owned by the event loop)."""

    chain: Chain
    store: Store
    readiness: Readiness
    update_failures: Callable[[], int]
    """Updates to other containers the runtime refused or did not answer."""
    synchronize_failures: Callable[[], int]
    refused_dropins: Callable[[], Mapping[str, int]] = dict
    """Plugin drop-ins (and directories) refused as untrusted, by reason (`Distrust`)."""
    changed_after: Callable[[], Mapping[str, int]] = dict
    """Fields hooks set that the runtime made otherwise (proxy.core.readback), by field."""
    update_window: Callable[[], Histogram | None] = lambda: None
    """Seconds from a container due new resources (another pod's call) until the runtime
    applied them (proxy.core.updates)."""


class Metrics:
    def __init__(self, sources: Sources) -> None:
        self.sources = sources
        self._calls: Counter[tuple[str, str]] = Counter()
        self._errors: Counter[tuple[str, str, str, str]] = Counter()
        self._latency: dict[tuple[str, str], Histogram] = {}
        self._hook_runs: Counter[tuple[str, str, str]] = Counter()
        self._hook_latency: dict[tuple[str, str], Histogram] = {}
        self._adjusted: Counter[tuple[str, str]] = Counter()

    # --- counted per call --------------------------------------------------------------------
    def observe_call(
        self, method: str, path: str, code: str, origin: str, seconds: float | None
    ) -> None:
        """One CRI call ended: `code` its status name, `origin` who ended it if it failed,
        `seconds` its duration (None for a stream: counted, not timed)."""
        key = (method, path)
        self._calls[key] += 1
        if code != "OK":
            self._errors[(method, path, code, origin)] += 1
        if seconds is not None:
            histogram = self._latency.get(key)
            if histogram is None:
                histogram = self._latency[key] = Histogram(CALL_BUCKETS)
            histogram.observe(seconds)

    def outcome(self, outcome: Outcome) -> None:
        """An intercepted call's outcome (the pipeline's `on_outcome`; its trace is kept)."""
        status = outcome.status
        if status is None:
            self.observe_call(outcome.event.value, INTERCEPTED, "OK", "", outcome.elapsed)
        else:
            self.observe_call(
                outcome.event.value,
                INTERCEPTED,
                status.code.name,
                outcome.status_origin,
                outcome.elapsed,
            )
        for hook, stage, verdict, _why, answer, seconds in outcome.trace or ():
            stage_name = stage.value
            self._hook_runs[(hook, stage_name, verdict)] += 1
            key = (hook, stage_name)
            histogram = self._hook_latency.get(key)
            if histogram is None:
                histogram = self._hook_latency[key] = Histogram(HOOK_BUCKETS)
            histogram.observe(seconds)
            if verdict == "adjusted" and isinstance(answer, Adjustment):
                for field in {key[0] for key, _ in answer.change_items()}:
                    self._adjusted[(hook, field.value)] += 1
                asked = len(answer.updates) + len(answer.groups)  # a group counts once
                if asked:
                    self._adjusted[(hook, "container_update")] += asked

    # --- read when scraped -------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """What is exported, copied now, on the loop (plain copies: cheap). The families are
        built from it afterwards, in any thread."""
        sources = self.sources
        hooks = [
            _HookFigures(
                entry.name,
                dict(entry.counters),
                entry.breaker.state,
                entry.hook.connected,
                failures_of(entry.hook),
                entry.settings.timeout_ms / 1000,
            )
            for entry in sources.chain.entries
        ]
        usage = [
            figure
            for entry in sources.chain.entries
            if isinstance(entry.hook, LocalHook)
            for figure in entry.hook.usage()
        ]
        return Snapshot(
            calls=dict(self._calls),
            errors=dict(self._errors),
            latency={k: (tuple(h.counts), h.total) for k, h in self._latency.items()},
            hook_runs=dict(self._hook_runs),
            hook_latency={k: (tuple(h.counts), h.total) for k, h in self._hook_latency.items()},
            adjusted=dict(self._adjusted),
            hooks=hooks,
            usage=usage,
            pods=len(sources.store.pods),
            containers=len(sources.store.containers),
            store_degraded=sources.store.degraded is not None,
            store_write_failures=sources.store.write_failures,
            update_failures=sources.update_failures(),
            synchronize_failures=sources.synchronize_failures(),
            refused_dropins=dict(sources.refused_dropins()),
            ready=sources.readiness.ready,
            changed_after=dict(sources.changed_after()),
            update_window=_counts(sources.update_window()),
        )

    def collect(self) -> list[Metric]:
        """Every family, now (a snapshot's families)."""
        return self.snapshot().families()


class _HookFigures(NamedTuple):
    name: str
    counters: dict[str, int]
    breaker: str
    connected: bool
    failures: dict[str, int]
    timeout: float
    """Seconds: the hook's `timeout_ms` (a call's deadline can make it shorter)."""


Counts = tuple[tuple[int, ...], float]
"""A histogram's bucket counts (the last is +Inf) and its sum."""


@dataclass(frozen=True)
class Snapshot:
    """The figures of one scrape, detached from the loop's state."""

    calls: dict[tuple[str, str], int]
    errors: dict[tuple[str, str, str, str], int]
    latency: dict[tuple[str, str], Counts]
    hook_runs: dict[tuple[str, str, str], int]
    hook_latency: dict[tuple[str, str], Counts]
    adjusted: dict[tuple[str, str], int]
    hooks: list[_HookFigures]
    usage: list[PoolUsage]
    pods: int
    containers: int
    store_degraded: bool
    store_write_failures: int
    update_failures: int
    synchronize_failures: int
    ready: bool
    refused_dropins: dict[str, int]
    changed_after: dict[str, int] = dataclass_field(default_factory=dict)
    update_window: Counts | None = None

    def families(self) -> list[Metric]:
        return [*self._call_families(), *self._hook_families(), *self._node_families()]

    def _call_families(self) -> Iterator[Metric]:
        calls = CounterMetricFamily(
            "crihook_cri_calls", "CRI calls kubelet made through crihook", labels=("method", "path")
        )
        for key, count in sorted(self.calls.items()):
            calls.add_metric(key, count)
        yield calls
        errors = CounterMetricFamily(
            "crihook_cri_errors",
            "CRI calls that ended with an error status, by code and by who ended them",
            labels=("method", "path", "code", "origin"),
        )
        for labels, count in sorted(self.errors.items()):
            errors.add_metric(labels, count)
        yield errors
        yield _histogram(
            "crihook_cri_call_duration_seconds",
            "How long unary CRI calls took in crihook, the runtime included",
            ("method", "path"),
            CALL_BUCKETS,
            self.latency,
        )

    def _hook_families(self) -> Iterator[Metric]:
        runs = CounterMetricFamily(
            "crihook_hook_runs",
            "A hook's part in the stages of intercepted calls, by verdict",
            labels=("hook", "stage", "verdict"),
        )
        for triple, count in sorted(self.hook_runs.items()):
            runs.add_metric(triple, count)
        yield runs
        yield _histogram(
            "crihook_hook_duration_seconds",
            "How long a hook took per stage of an intercepted call",
            ("hook", "stage"),
            HOOK_BUCKETS,
            self.hook_latency,
        )
        adjusted = CounterMetricFamily(
            "crihook_hook_adjustments",
            "Adjustments applied, by the field they set (container_update: updates to "
            "other containers)",
            labels=("hook", "field"),
        )
        for pair, count in sorted(self.adjusted.items()):
            adjusted.add_metric(pair, count)
        yield adjusted
        for suffix, counter, about in _HOOK_COUNTERS:
            family = CounterMetricFamily(f"crihook_hook_{suffix}", about, labels=("hook",))
            for hook in self.hooks:
                family.add_metric((hook.name,), hook.counters.get(counter, 0))
            yield family
        breaker = GaugeMetricFamily(
            "crihook_hook_breaker_state",
            "The hook's circuit breaker: 1 for its current state",
            labels=("hook", "state"),
        )
        connected = GaugeMetricFamily(
            "crihook_hook_connected",
            "1: the hook can be called (a plugin is connected)",
            labels=("hook",),
        )
        timeout = GaugeMetricFamily(
            "crihook_hook_timeout_seconds",
            "The hook's timeout per call (timeout_ms; kubelet's deadline can make it shorter)",
            labels=("hook",),
        )
        for hook in self.hooks:
            for state in _BREAKER_STATES:
                breaker.add_metric((hook.name, state), 1.0 if state == hook.breaker else 0.0)
            connected.add_metric((hook.name,), 1.0 if hook.connected else 0.0)
            timeout.add_metric((hook.name,), hook.timeout)
        yield breaker
        yield connected
        yield timeout
        failures = CounterMetricFamily(
            "crihook_hook_failures",
            "Work a hook does beside the calls that failed (it tries again later), by what",
            labels=("hook", "what"),
        )
        for hook in self.hooks:
            for what, count in sorted(hook.failures.items()):
                failures.add_metric((hook.name, what), count)
        yield failures

    def _node_families(self) -> Iterator[Metric]:
        families = {
            resource: GaugeMetricFamily(name, about, labels=labels)
            for resource, (name, about, labels) in _USAGE_FAMILIES.items()
        }
        for figure in self.usage:
            family = families.get(figure.resource)
            if family is None:
                continue  # a resource this crihook does not know: not exported
            if figure.resource == "cpu":
                family.add_metric((figure.pool,), figure.value)
            elif figure.resource == "memory":
                family.add_metric((figure.numa_node, figure.pool, figure.state), figure.value)
            else:
                family.add_metric((figure.pool, figure.state), figure.value)
        yield from families.values()
        store = GaugeMetricFamily(
            "crihook_store_objects", "Pods and containers in crihook's store", labels=("kind",)
        )
        store.add_metric(("pod",), self.pods)
        store.add_metric(("container",), self.containers)
        yield store
        yield GaugeMetricFamily(
            "crihook_store_degraded",
            "1 while writing the state dir fails (the state is kept in memory and retried)",
            value=1.0 if self.store_degraded else 0.0,
        )
        yield CounterMetricFamily(
            "crihook_store_write_failures",
            "Writes of the state dir (store, hook states, journal) that failed",
            value=self.store_write_failures,
        )
        yield CounterMetricFamily(
            "crihook_container_update_failures",
            "Updates to other containers (UpdateContainerResources for hooks) that failed",
            value=self.update_failures,
        )
        if self.update_window is not None:
            yield _histogram(
                "crihook_container_update_window_seconds",
                "From a container due new resources (a shared pool another pod's exclusive "
                "CPUs shrank) until the runtime applied them: how long it may still run on "
                "CPUs handed out",
                (),
                WINDOW_BUCKETS,
                {(): self.update_window},
            )
        changed = CounterMetricFamily(
            "crihook_fields_changed_after_crihook",
            "Fields a hook set on a new container that the runtime made otherwise (an NRI "
            "plugin or the runtime's own rules), by field; read back when read_back is on",
            labels=("field",),
        )
        for name, count in sorted(self.changed_after.items()):
            changed.add_metric((name,), count)
        yield changed
        yield CounterMetricFamily(
            "crihook_synchronize_failures",
            "Hook synchronizes (start, reconcile) that failed",
            value=self.synchronize_failures,
        )
        refused = CounterMetricFamily(
            "crihook_plugin_dropins_refused",
            "Plugin drop-ins not read because someone else than root could have written them "
            "(and plugins directories, reason directory), once per refusal",
            labels=("reason",),
        )
        for reason in Distrust:
            refused.add_metric((reason.value,), self.refused_dropins.get(reason.value, 0))
        yield refused
        yield GaugeMetricFamily(
            "crihook_ready",
            "1: crihook forwards calls (the runtime answered and the store is reconciled)",
            value=1.0 if self.ready else 0.0,
        )
        info = GaugeMetricFamily(
            "crihook_build_info",
            "crihook's version and Python (always 1)",
            labels=("version", "python_version", "python_implementation"),
        )
        info.add_metric((__version__, platform.python_version(), sys.implementation.name), 1.0)
        yield info


def _counts(histogram: Histogram | None) -> Counts | None:
    return None if histogram is None else (tuple(histogram.counts), histogram.total)


def _histogram(
    name: str,
    about: str,
    labels: tuple[str, ...],
    bounds: Sequence[float],
    histograms: dict[Any, Counts],
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, about, labels=labels)
    names = (*map(repr, bounds), "+Inf")
    for key, (counts, total) in sorted(histograms.items()):
        cumulative, running = [], 0
        for bound, count in zip(names, counts, strict=True):
            running += count
            cumulative.append((bound, float(running)))
        family.add_metric(key, cumulative, total)
    return family
