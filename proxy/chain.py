"""The ordered hook chain: subscriptions, per-hook timeout, failure policy, breaker, dry-run.

Hooks run in `NN-name` order; each sees the request as adjusted by the hooks before it (the
Merger changes it in place). Per hook:
- the call is bounded by the hook's timeout and by kubelet's remaining deadline;
- a failure (timeout, plugin down, exception) fails the CRI call when the hook's policy is
  `fail`, and is logged and counted and the call goes on without that hook when `ignore`;
- a Reject from the hook always fails the call (a decision, not a failure);
- after `breaker_threshold` consecutive failures the breaker opens: the hook is not called for
  `breaker_reset_seconds` (its policy decides what that means for the call: fail fast, or go
  on), then one probe call is let through; success closes it. Never dropped for good.
- dry-run (global or per hook): the adjustment is computed and logged, nothing is applied.

Stages besides pre and post: `hints` (NUMA hints of the resource hooks, asked before the pre
stage and merged by the pipeline under the topology policy) and `failed` (told to every hook
whose pre stage ran when the call failed, or whose adjustment was not applied; its answer is
ignored and its failures only logged and counted). Exempt pods skip the hooks that honour the
exemption; node-wide accounting hooks (cpuset, numa) see them too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import Message

from crihook.hooks.eager import first_step, resume
from crihook.hooks.spec import (
    Adjustment,
    ChainHook,
    ContainerView,
    Event,
    HookContext,
    HookState,
    InvalidRequest,
    PodView,
    Reject,
    ResourceHints,
    Stage,
    TopologyHint,
)
from crihook.proxy.config import ChainSettings, HookSettings
from crihook.proxy.errors import (
    HookError,
    HookInvalidAdjustment,
    HookInvalidRequest,
    HookRejected,
    HookTimeout,
    HookUnavailable,
)
from crihook.proxy.merge import Merger

__all__ = ["Breaker", "Chain", "ChainEntry", "is_exempt"]

log = logging.getLogger(__name__)

# Leave the runtime this much of kubelet's deadline after the hooks.
_RUNTIME_RESERVE = 0.05


@dataclass
class Breaker:
    """Consecutive-failure circuit breaker. Open: calls are not made. After the reset time
    exactly one probe call goes through (half-open); its outcome closes or reopens it."""

    threshold: int
    reset_seconds: float
    failures: int = 0
    open_until: float = 0.0
    probing: bool = False
    clock: Callable[[], float] = time.monotonic

    def allows(self) -> bool:
        if self.failures < self.threshold:
            return True
        if self.probing or self.clock() < self.open_until:
            return False
        self.probing = True
        return True

    def success(self) -> None:
        self.failures = 0
        self.open_until = 0.0
        self.probing = False

    def failure(self) -> None:
        self.failures += 1
        self.probing = False
        if self.failures >= self.threshold:
            self.open_until = self.clock() + self.reset_seconds

    def abandon(self) -> None:
        """The call ended without a verdict (cancelled): let another probe try."""
        self.probing = False

    @property
    def state(self) -> str:
        if self.failures < self.threshold:
            return "closed"
        return "half-open" if self.probing or self.clock() >= self.open_until else "open"


@dataclass
class ChainEntry:
    """One hook in the chain with its settings and running counters."""

    hook: ChainHook
    settings: HookSettings
    breaker: Breaker
    counters: Counter[str] = field(default_factory=Counter)
    # Read on every call: kept as plain attributes.
    name: str = field(init=False)
    base_name: str = field(init=False)
    timeout: float = field(init=False)
    """Seconds (timeout_ms)."""
    bounds_own_calls: bool = field(init=False)
    """The hook ends its own calls at ctx.timeout (a plugin does): no second timer."""
    honours_exemption: bool = field(init=False)

    def __post_init__(self) -> None:
        self.name = self.settings.name
        self.base_name = self.settings.base_name
        self.timeout = self.settings.timeout_ms / 1000
        self.bounds_own_calls = self.hook.bounds_own_calls
        self.honours_exemption = self.hook.honours_exemption

    def wants(self, event: Event, stage: Stage, exempt: bool = False) -> bool:
        if not self.settings.enabled or (exempt and self.honours_exemption):
            return False
        # Asked every time: a plugin's subscriptions change when it (re)connects.
        if (event, stage) in self.hook.subscriptions():
            return True
        # A plugin that is down is asked for its pre and post stages anyway (and fails):
        # its failure policy, not its absence, decides what happens to the call.
        return stage in (Stage.PRE, Stage.POST) and not self.hook.connected


def is_exempt(settings: ChainSettings, pod: PodView) -> bool:
    if pod.namespace in settings.exempt_namespaces:
        return True
    return any(pod.labels.get(k) == v for k, v in settings.exempt_labels.items())


def _order(entry: ChainEntry) -> tuple[int, str]:
    return (entry.settings.index, entry.settings.base_name)


class Chain:
    """Runs the hooks of one stage of one call. Holds no per-call state."""

    def __init__(
        self,
        settings: ChainSettings,
        state_for: Callable[[str], HookState],
    ) -> None:
        self.settings = settings
        self._state_for = state_for
        self._builtin: list[ChainEntry] = []
        self._plugins: list[ChainEntry] = []
        self.entries: list[ChainEntry] = []

    # --- membership --------------------------------------------------------------------------
    @staticmethod
    def entry(hook: ChainHook, settings: HookSettings) -> ChainEntry:
        return ChainEntry(
            hook, settings, Breaker(settings.breaker_threshold, settings.breaker_reset_seconds)
        )

    def set_builtin(self, entries: Sequence[ChainEntry]) -> None:
        self._builtin = list(entries)
        self._rebuild()

    def set_plugins(self, entries: Sequence[ChainEntry]) -> None:
        self._plugins = list(entries)
        self._rebuild()

    def _rebuild(self) -> None:
        merged = sorted(self._builtin + self._plugins, key=_order)
        names = [e.settings.base_name for e in merged]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            # Drop-ins are checked before they get here; this guards the invariant.
            raise ValueError(f"hook names used twice: {', '.join(sorted(dupes))}")
        self.entries = merged
        log.info("hook chain: %s", ", ".join(e.name for e in merged) or "(empty)")

    def wants(self, event: Event, stage: Stage, exempt: bool = False) -> bool:
        return any(e.wants(event, stage, exempt) for e in self.entries)

    def exempt(self, pod: PodView) -> bool:
        return is_exempt(self.settings, pod)

    # --- running a stage ---------------------------------------------------------------------
    async def run(
        self,
        event: Event,
        stage: Stage,
        pod: PodView,
        container: ContainerView | None,
        request: Message,
        response: Message | None,
        deadline: float | None,
        *,
        exempt: bool = False,
        affinity: TopologyHint | None = None,
        ran: list[str] | None = None,
    ) -> Merger:
        """Run every subscribed hook of a pre or post stage; returns the merge (request
        changed in place unless dry-run). Raises a HookError/HookConflict that must fail the
        call. `ran` collects the hooks called (for the failed stage), also when it raises."""
        merger = Merger(event, request, self.settings.conflict, self.settings.precedence)
        post = stage is Stage.POST
        for entry in self.entries:
            if not entry.wants(event, stage, exempt):
                continue
            ctx = self._context(entry, event, stage, pod, container, request, response, deadline)
            ctx.affinity = affinity
            if ran is not None:
                ran.append(entry.name)
            adjustment = await self._adjustment(entry, merger, post, ctx)
            if adjustment is None:
                continue
            if self.settings.dry_run or entry.settings.dry_run:
                log.info(
                    "dry-run: %s would apply %r",
                    entry.name,
                    adjustment,
                    extra={"hook": entry.name, "method": event.value, "pod": _pod_label(pod)},
                )
                entry.counters["dry_run"] += 1
                merger.unapplied[entry.name] = "dry-run: the adjustment was not applied"
                if entry.settings.dry_run and not self.settings.dry_run:
                    continue
                # Global dry-run: later hooks still see the adjusted request, so the log shows
                # what the whole chain would do; the pipeline forwards the original bytes.
            merger.add(entry.name, entry.base_name, adjustment)
        return merger

    async def run_hints(
        self,
        event: Event,
        pod: PodView,
        container: ContainerView | None,
        request: Message,
        deadline: float | None,
        *,
        exempt: bool = False,
    ) -> list[tuple[str, ResourceHints]]:
        """Every subscribed hook's NUMA hints, in chain order. A failing hook under
        `ignore` offers none; under `fail` the call fails."""
        offered: list[tuple[str, ResourceHints]] = []
        for entry in self.entries:
            if not entry.wants(event, Stage.HINTS, exempt):
                continue
            ctx = self._context(entry, event, Stage.HINTS, pod, container, request, None, deadline)
            try:
                answer = await self._invoke(entry, ctx)
                if answer is not None:
                    offered.append((entry.name, _check_hints(entry.name, answer)))
            except HookError as error:
                self._fail_or_ignore(entry, error, event, pod)
        return offered

    async def run_failed(
        self,
        event: Event,
        names: Sequence[str],
        pod: PodView,
        container: ContainerView | None,
        request: Message,
        failure: str,
    ) -> None:
        """Tell the named hooks (their pre stage ran) that the call failed or their
        adjustment was not applied. Never raises: a hook's failure here is logged and
        counted, and each hook has its own timeout (kubelet may already have gone)."""
        wanted = set(names)
        for entry in self.entries:
            if entry.name not in wanted or (event, Stage.FAILED) not in entry.hook.subscriptions():
                continue
            ctx = self._context(entry, event, Stage.FAILED, pod, container, request, None, None)
            ctx.failure = failure
            try:
                await self._invoke(entry, ctx)
            except HookError as error:
                entry.counters["failed_stage_errors"] += 1
                log.error(
                    "%s (failed stage: it may keep what it reserved until the next reconcile)",
                    error,
                    extra={"hook": entry.name, "method": event.value, "pod": _pod_label(pod)},
                )

    def _context(
        self,
        entry: ChainEntry,
        event: Event,
        stage: Stage,
        pod: PodView,
        container: ContainerView | None,
        request: Message,
        response: Message | None,
        deadline: float | None,
    ) -> HookContext:
        timeout = entry.timeout
        if deadline is not None:
            timeout = min(timeout, max(deadline - time.monotonic() - _RUNTIME_RESERVE, 0.001))
        state = self._state_for(entry.base_name)
        return HookContext(event, stage, pod, container, request, response, state, timeout)

    async def _adjustment(
        self, entry: ChainEntry, merger: Merger, post: bool, ctx: HookContext
    ) -> Adjustment | None:
        """A pre/post call: its valid, non-empty adjustment, or None (nothing to apply, or an
        ignored failure); raises for a Reject and for a failure under `fail`."""
        try:
            answer = await self._invoke(entry, ctx)
        except HookRejected:
            raise
        except HookError as error:
            self._fail_or_ignore(entry, error, ctx.event, ctx.pod)
            merger.unapplied[entry.name] = f"{error} (failure_policy=ignore)"
            return None
        if answer is None or (isinstance(answer, Adjustment) and not answer):
            return None  # an empty one has nothing to validate or apply
        try:
            if not isinstance(answer, Adjustment):
                raise HookInvalidAdjustment(
                    entry.name, f"returned {type(answer).__name__}, not an Adjustment"
                )
            merger.validate(entry.name, answer, post)
        except HookInvalidAdjustment as error:
            entry.breaker.failure()
            entry.counters["failures"] += 1
            self._fail_or_ignore(entry, error, ctx.event, ctx.pod)
            merger.unapplied[entry.name] = f"{error} (failure_policy=ignore)"
            return None
        return answer

    async def _invoke(self, entry: ChainEntry, ctx: HookContext) -> Any:
        """Call the hook within its budget, keeping its breaker and counters. Returns its
        answer; raises HookRejected/HookInvalidRequest for a refusal, another HookError for
        a failure (a skip by an open breaker included)."""
        event, stage = ctx.event, ctx.stage
        breaker = entry.breaker
        if breaker.failures >= breaker.threshold and not breaker.allows():
            entry.counters["skipped"] += 1
            raise HookUnavailable(
                entry.name,
                f"skipped: {entry.breaker.failures} consecutive failures, circuit open for "
                f"{entry.settings.breaker_reset_seconds:g}s",
            )
        entry.counters["calls"] += 1
        started = time.perf_counter()
        try:
            # bounded(), with its first step inline: most in-process hooks answer at once and
            # then cost no coroutine and no timer. Plugins end their own calls at ctx.timeout.
            coro = entry.hook.call(ctx)
            done, answer = first_step(coro)
            if not done:
                budget = None if entry.bounds_own_calls else ctx.timeout
                answer = await resume(coro, answer, budget, started)
        except InvalidRequest as exc:
            entry.breaker.success()  # it answered: a refusal is not a failure
            entry.counters["rejected"] += 1
            raise HookInvalidRequest(entry.name, f"{event.value}: {exc.reason}") from exc
        except Reject as exc:
            entry.breaker.success()
            entry.counters["rejected"] += 1
            raise HookRejected(entry.name, f"rejected {event.value}: {exc.reason}") from exc
        except TimeoutError as exc:
            error: HookError = HookTimeout(
                entry.name,
                f"no answer to {stage.value}-{event.value} within {ctx.timeout * 1000:.0f} ms",
            )
            error.__cause__ = exc
        except ConnectionError as exc:
            error = HookUnavailable(entry.name, f"unavailable: {exc}")
        except (ValueError, TypeError) as exc:
            error = HookInvalidAdjustment(entry.name, f"bad adjustment: {exc}")
        except asyncio.CancelledError:
            entry.breaker.abandon()  # kubelet went away: no verdict on the hook
            raise
        except Exception as exc:  # a hook's bug must not take the call down uncontrolled
            log.debug("hook %s raised", entry.name, exc_info=True)
            error = HookError(entry.name, f"failed: {type(exc).__name__}: {exc}")
        else:
            if breaker.failures or breaker.probing:
                breaker.success()
            if log.isEnabledFor(logging.DEBUG):
                elapsed = (time.perf_counter() - started) * 1000
                log.debug(
                    "%s %s-%s -> %r",
                    entry.name,
                    stage.value,
                    event.value,
                    answer,
                    extra={"elapsed_ms": round(elapsed, 3)},
                )
            return answer
        entry.breaker.failure()
        entry.counters["failures"] += 1
        raise error

    def _fail_or_ignore(
        self, entry: ChainEntry, error: HookError, event: Event, pod: PodView
    ) -> None:
        """Raise for `fail`; count and log for `ignore`."""
        if entry.settings.failure_policy == "fail":
            raise error
        entry.counters["ignored"] += 1
        log.warning(
            "%s; failure_policy=ignore, going on without it",
            error,
            extra={"hook": entry.name, "method": event.value, "pod": _pod_label(pod)},
        )

    def status(self) -> list[dict[str, Any]]:
        """Per hook: settings, breaker and counters (for `crihook state`)."""
        return [
            {
                "name": e.name,
                "kind": "plugin" if e.settings.endpoint else "in-process",
                "failure_policy": e.settings.failure_policy,
                "timeout_ms": e.settings.timeout_ms,
                "dry_run": e.settings.dry_run or self.settings.dry_run,
                "enabled": e.settings.enabled,
                "connected": e.hook.connected,
                "honours_exemption": e.honours_exemption,
                "subscriptions": sorted(
                    f"{s.value}-{ev.value}" for ev, s in e.hook.subscriptions()
                ),
                "breaker": e.breaker.state,
                "counters": dict(e.counters),
            }
            for e in self.entries
        ]

    async def close(self) -> None:
        for entry in self.entries:
            await entry.hook.close()


def _pod_label(pod: PodView) -> str:
    return f"{pod.namespace}/{pod.name}"


def _check_hints(hook: str, answer: object) -> ResourceHints:
    """A hints stage's answer: resource name → TopologyHints (or None: no preference)."""
    if not isinstance(answer, Mapping):
        raise HookInvalidAdjustment(
            hook, f"hints stage returned {type(answer).__name__}, not a mapping"
        )
    for resource, hints in answer.items():
        if not isinstance(resource, str):
            raise HookInvalidAdjustment(hook, f"hint resource {resource!r} is not a string")
        if hints is not None and not all(isinstance(h, TopologyHint) for h in hints):
            raise HookInvalidAdjustment(hook, f"hints for {resource!r} are not TopologyHints")
    return answer
