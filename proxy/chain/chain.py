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
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

from google.protobuf.message import Message

from crihook.hooks.eager import first_step, resume
from crihook.hooks.spec import (
    Adjustment,
    ChainHook,
    ContainerUpdate,
    Event,
    Forbidden,
    HookContext,
    HookState,
    InvalidRequest,
    PodView,
    Reject,
    ResourceHints,
    Stage,
    TopologyHint,
)
from crihook.hooks.spec.adjustment import describe_key
from crihook.proxy.chain.breaker import Breaker, BreakerRecord
from crihook.proxy.chain.call import ChainCall
from crihook.proxy.chain.local_hooks import LocalHook
from crihook.proxy.chain.merge import Merged, Merger
from crihook.proxy.chain.permissions import Permissions
from crihook.proxy.config import ChainSettings, HookSettings
from crihook.proxy.cri.events import EVENTS
from crihook.proxy.cri.outcome import HookRun
from crihook.proxy.cri.verdicts import Verdict
from crihook.proxy.errors import (
    HookConflict,
    HookError,
    HookForbidden,
    HookInvalidAdjustment,
    HookInvalidRequest,
    HookNotPermitted,
    HookRejected,
    HookRequired,
    HookTimeout,
    HookUnavailable,
)
from crihook.proxy.grants import DEFAULT_GRANTS, parse_grants

__all__ = [
    "REQUIRED_ANNOTATION",
    "Chain",
    "ChainEntry",
    "failures_of",
    "is_exempt",
    "required_hooks",
]

log = logging.getLogger(__name__)

# Leave the runtime this much of kubelet's deadline after the hooks.
_RUNTIME_RESERVE = 0.05


_CLOSED = BreakerRecord(0, None)


@dataclass
class ChainEntry:
    """One hook in the chain with its settings and running counters."""

    hook: ChainHook
    settings: HookSettings
    breaker: Breaker
    counters: Counter[str] = field(default_factory=Counter)
    tracebacks_logged: set[str] = field(default_factory=set)
    """Exception types whose traceback was logged at WARNING (once each)."""
    # Read on every call: kept as plain attributes.
    name: str = field(init=False)
    base_name: str = field(init=False)
    timeout: float = field(init=False)
    """Seconds (timeout_ms)."""
    bounds_own_calls: bool = field(init=False)
    """The hook ends its own calls at ctx.timeout (a plugin does): no second timer."""
    honours_exemption: bool = field(init=False)
    permissions: Permissions = field(init=False)
    """What it may set: what it declares (or the defaults), narrowed by `allow`."""

    def __post_init__(self) -> None:
        self.name = self.settings.name
        self.base_name = self.settings.base_name
        self.timeout = self.settings.timeout_ms / 1000
        self.bounds_own_calls = self.hook.bounds_own_calls
        self.honours_exemption = self.hook.honours_exemption
        self.permissions = _permissions(self.name, self.hook.sets, self.settings.allow)

    def wants(self, event: Event, stage: Stage, exempt: bool = False) -> bool:
        if not self.settings.enabled or (exempt and self.honours_exemption):
            return False
        # Asked every time: a plugin's subscriptions change when it (re)connects.
        if (event, stage) in self.hook.subscriptions():
            return True
        # A plugin that is down is asked for its pre and post stages anyway (and fails):
        # its failure policy, not its absence, decides what happens to the call.
        return stage in (Stage.PRE, Stage.POST) and not self.hook.connected


def _permissions(
    name: str, declared: tuple[str, ...] | None, allow: tuple[str, ...] | None
) -> Permissions:
    """A hook that declares what it sets (a built-in one) keeps that, narrowed by `allow`; one
    that declares nothing (a plugin) gets `allow`, or the defaults without it."""
    where = f"hook {name}"
    if declared is None:
        grants = DEFAULT_GRANTS if allow is None else parse_grants(allow, where)
        return Permissions((grants,))
    layers = [parse_grants(declared, where)]
    if allow is not None:
        layers.append(parse_grants(allow, where))
    return Permissions(tuple(layers))


REQUIRED_ANNOTATION = "hooks.crihook.io/required"


def required_hooks(settings: ChainSettings, pod: PodView) -> tuple[frozenset[str], frozenset[str]]:
    """Base names of the hooks that must run successfully for this pod's calls: those the
    configuration requires, and those the pod's annotation adds."""
    raw = pod.annotations.get(REQUIRED_ANNOTATION, "")
    asked = {n.strip() for n in raw.split(",") if n.strip()}
    by_pod = frozenset(n[3:] if n[:2].isdigit() and n[2:3] == "-" else n for n in asked)
    return frozenset(settings.required_hooks), by_pod


def is_exempt(settings: ChainSettings, pod: PodView) -> bool:
    if pod.namespace in settings.exempt_namespaces:
        return True
    labels = settings.exempt_labels  # usually none: asked twice per call, no generator then
    return bool(labels) and any(pod.labels.get(k) == v for k, v in labels.items())


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

    @property
    def plugins(self) -> list[ChainEntry]:
        """The out-of-process entries (drop-ins), as last set."""
        return list(self._plugins)

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
        # Asked for several stages of every call: a loop costs a third of any(generator).
        for entry in self.entries:  # noqa: SIM110
            if entry.wants(event, stage, exempt):
                return True
        return False

    def breakers(self, now: float) -> dict[str, BreakerRecord]:
        """The breakers that have counted failures, by hook, for a recording's snapshot
        (`now`: the recording's clock); a replay starting there takes them up."""
        return {e.name: e.breaker.recorded(now) for e in self.entries if e.breaker.failures}

    def restore_breakers(self, records: Mapping[str, BreakerRecord]) -> None:
        """Every hook's breaker as `records` has it (closed when it is not there)."""
        for entry in self.entries:
            entry.breaker.restore(records.get(entry.name, _CLOSED))

    def permitted_updates(
        self, hook: str, updates: Sequence[ContainerUpdate]
    ) -> Sequence[ContainerUpdate]:
        """A hook's synchronize repairs, or none of them if any changes what the hook may not
        set (there is no call to fail: they are dropped, logged and counted)."""
        entry = next((e for e in self.entries if e.name == hook), None)
        if entry is None or not updates:
            return updates
        denied = list(entry.permissions.denied_updates(updates))
        if not denied:
            return updates
        entry.counters["not_permitted"] += 1
        log.error(
            "hook %s: synchronize repairs dropped: it may not set %s", hook, ", ".join(denied)
        )
        return ()

    def exempt(self, pod: PodView) -> bool:
        return is_exempt(self.settings, pod)

    def requires(self, event: Event, pod: PodView) -> bool:
        """Some hook must run successfully for this call (cheap: checked on every call).
        Where is the call's (`EventSpec.requires_hooks`)."""
        return EVENTS[event].requires_hooks and bool(
            self.settings.required_hooks or REQUIRED_ANNOTATION in pod.annotations
        )

    # --- running a stage ---------------------------------------------------------------------
    def pre(self, call: ChainCall) -> Coroutine[Any, Any, Merged]:
        """Run every subscribed hook of the pre stage on `call.request` (changed in place,
        unless dry-run); returns the merge. A required hook (config, or the pod's annotation)
        that does not run successfully fails the call whatever its failure policy."""
        return self._stage(call, Stage.PRE)  # not awaited here: no second frame per call

    def post(self, call: ChainCall, response: Message) -> Coroutine[Any, Any, Merged]:
        """Run every subscribed hook of the post stage, which sees the runtime's answer."""
        call.response = response
        return self._stage(call, Stage.POST)

    async def _stage(self, call: ChainCall, stage: Stage) -> Merger:
        """A pre or post stage. Raises a HookError/HookConflict/HookRequired that must fail
        the call. `call.ran` collects the hooks called (for the failed stage), also when it
        raises; `call.trace` each hook's verdict, adjustment and time."""
        event, pod, exempt, ran, trace = call.event, call.pod, call.exempt, call.ran, call.trace
        merger = Merger(event, call.request, self.settings.conflict, self.settings.precedence)
        post = stage is Stage.POST
        required = self._required(event, pod) if stage is Stage.PRE else _NOT_REQUIRED
        for entry in self.entries:
            must = required.get(entry.base_name)
            if not self._runs(entry, event, stage, exempt, must):
                continue
            ctx = self._context(entry, call, stage)
            if ran is not None:
                ran.append(entry.name)
            started = perf_counter()
            try:
                adjustment = await self._adjustment(entry, merger, post, ctx, must)
            except BaseException as exc:
                if trace is not None:
                    refused = merger.refused_answers.get(entry.name)
                    trace.append(_failed_run(entry.name, stage, exc, started, refused))
                raise
            if not adjustment:  # None, or empty (with at most a reason)
                if trace is not None:
                    why = merger.unapplied.get(entry.name, "")
                    verdict = Verdict.IGNORED if why else Verdict.NOTHING
                    why = why or (adjustment.reason if adjustment is not None else "")
                    refused = merger.refused_answers.get(entry.name)
                    elapsed = perf_counter() - started
                    trace.append(HookRun(entry.name, stage, verdict, why, refused, elapsed))
                continue
            dry = self.settings.dry_run or entry.settings.dry_run
            if trace is not None:
                verdict = Verdict.DRY_RUN if dry else Verdict.ADJUSTED
                why = adjustment.reason
                trace.append(
                    HookRun(entry.name, stage, verdict, why, adjustment, perf_counter() - started)
                )
            if dry:
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
            try:
                merger.add(entry.name, entry.base_name, adjustment)
            except HookConflict as exc:
                entry.counters["conflicts"] += 1
                if trace is not None:  # not applied after all: the run ended the call
                    trace[-1] = trace[-1]._replace(verdict=Verdict.FAILED, detail=str(exc))
                raise
        return merger

    async def validate(self, call: ChainCall, merged: Merged) -> None:
        """Every validator, on the final request (`call.request`) and who set what in it
        (`merged`): a Reject fails the call (HookRejected); a validator's failure follows its
        policy (required validators fail the call)."""
        event, pod, exempt, trace = call.event, call.pod, call.exempt, call.trace
        owners = {describe_key(key): hook for key, hook in merged.owned()[0].items()}
        required = self._required(event, pod)
        for entry in self.entries:
            must = required.get(entry.base_name)
            if not self._runs(entry, event, Stage.VALIDATE, exempt, must):
                continue
            ctx = self._context(entry, call, Stage.VALIDATE)
            ctx.owners = owners
            started = perf_counter()
            verdict, why = Verdict.OK, ""
            try:
                try:
                    answer = await self._invoke(entry, ctx)
                    if answer is not None:
                        raise HookInvalidAdjustment(
                            entry.name, f"a validator returned {type(answer).__name__}, not None"
                        )
                except HookRejected:
                    raise
                except HookError as error:
                    self._fail_or_ignore(entry, error, event, pod, must)
                    verdict, why = Verdict.IGNORED, f"{error} (failure_policy=ignore)"
            except BaseException as exc:
                if trace is not None:
                    trace.append(_failed_run(entry.name, Stage.VALIDATE, exc, started))
                raise
            if trace is not None:
                trace.append(_run(entry.name, Stage.VALIDATE, verdict, why, None, started))

    def _required(self, event: Event, pod: PodView) -> dict[str, str]:
        """Required hooks (base name → who requires it); HookRequired for one not there."""
        if not self.requires(event, pod):
            return _NOT_REQUIRED  # the common case, on every call: no sets built
        by_config, by_pod = required_hooks(self.settings, pod)
        if not by_config and not by_pod:
            return _NOT_REQUIRED
        present = {e.base_name for e in self.entries}
        missing = sorted((by_config | by_pod) - present)
        if missing:
            raise HookRequired(
                f"required hook(s) {', '.join(missing)} are not in the chain "
                f"(required by {_who_requires(missing[0], by_config)})"
            )
        required = dict.fromkeys(by_pod, f"the pod's {REQUIRED_ANNOTATION} annotation")
        required.update(dict.fromkeys(by_config, "the configuration ([hooks] required_hooks)"))
        return required

    def _runs(
        self, entry: ChainEntry, event: Event, stage: Stage, exempt: bool, must: str | None
    ) -> bool:
        """Whether the hook is called; HookRequired when a required one is not. A pod cannot
        exempt itself from a hook the configuration requires."""
        by_config = must is not None and must.startswith("the configuration")
        if entry.wants(event, stage, exempt and not by_config):
            return True
        if must is None or not _subscribes(entry, event, stage):
            return False
        why = "it is disabled" if not entry.settings.enabled else "the pod is exempt from it"
        raise HookRequired(f"hook {entry.name!r} is required by {must}, and {why}")

    async def hints(self, call: ChainCall) -> list[tuple[str, ResourceHints]]:
        """Every subscribed hook's NUMA hints, in chain order. A failing hook under
        `ignore` offers none; under `fail` the call fails."""
        event, pod, exempt, trace = call.event, call.pod, call.exempt, call.trace
        offered: list[tuple[str, ResourceHints]] = []
        for entry in self.entries:
            if not entry.wants(event, Stage.HINTS, exempt):
                continue
            ctx = self._context(entry, call, Stage.HINTS)
            started = perf_counter()
            verdict, why, hints = Verdict.NOTHING, "", None
            try:
                try:
                    answer = await self._invoke(entry, ctx)
                    if answer is not None:
                        hints = _check_hints(entry.name, answer)
                        offered.append((entry.name, hints))
                        verdict = Verdict.HINTS
                except HookError as error:
                    self._fail_or_ignore(entry, error, event, pod)
                    verdict, why = Verdict.IGNORED, f"{error} (failure_policy=ignore)"
            except BaseException as exc:
                if trace is not None:
                    trace.append(_failed_run(entry.name, Stage.HINTS, exc, started))
                raise
            if trace is not None:
                trace.append(_run(entry.name, Stage.HINTS, verdict, why, hints, started))
        return offered

    async def failed(self, call: ChainCall, failure: str) -> None:
        """Tell the hooks in `call.ran` (their pre stage ran) that the call failed or their
        adjustment was not applied. Never raises: a hook's failure here is logged and
        counted, and each hook has its own timeout (kubelet may already have gone)."""
        event, pod, trace = call.event, call.pod, call.trace
        wanted = set(call.ran or ())
        for entry in self.entries:
            if entry.name not in wanted or (event, Stage.FAILED) not in entry.hook.subscriptions():
                continue
            ctx = self._context(entry, call, Stage.FAILED)
            ctx.failure = failure
            started = perf_counter()
            verdict, why = Verdict.TOLD, failure
            try:
                await self._invoke(entry, ctx)
            except HookError as error:
                entry.counters["failed_stage_errors"] += 1
                verdict, why = Verdict.FAILED, str(error)
                log.error(
                    "%s (failed stage: it may keep what it reserved until the next reconcile)",
                    error,
                    extra={"hook": entry.name, "method": event.value, "pod": _pod_label(pod)},
                )
            if trace is not None:
                trace.append(_run(entry.name, Stage.FAILED, verdict, why, None, started))

    def _context(self, entry: ChainEntry, call: ChainCall, stage: Stage) -> HookContext:
        """The one place a hook's context is made from the call. Only the pre stage sees the
        placement, only the post stage the runtime's answer; the failed stage runs on its
        hooks' timeouts alone (kubelet may have gone) and is told the exemption as the
        configuration has it now."""
        deadline = call.deadline if stage is not Stage.FAILED else None
        timeout = entry.timeout
        if deadline is not None:
            timeout = min(timeout, max(deadline - time.monotonic() - _RUNTIME_RESERVE, 0.001))
        state = self._state_for(entry.base_name)
        response = call.response if stage is Stage.POST else None
        ctx = HookContext(
            call.event, stage, call.pod, call.container, call.request, response, state, timeout
        )
        # Set after: keyword arguments cost HookContext() half as much again, per hook.
        if stage is Stage.FAILED:
            ctx.exempt = self.exempt(call.pod)
        else:
            ctx.exempt = call.exempt
            if stage is Stage.PRE:
                ctx.affinity = call.affinity
        return ctx

    async def _adjustment(
        self,
        entry: ChainEntry,
        merger: Merger,
        post: bool,
        ctx: HookContext,
        must: str | None = None,
    ) -> Adjustment | None:
        """A pre/post call: its valid, permitted, non-empty adjustment, an empty one (nothing
        to apply, but a reason), or None (nothing, or an ignored failure); raises for a
        Reject, for a failure under `fail`, and for any failure of a required hook (`must`:
        who requires it)."""
        try:
            answer = await self._invoke(entry, ctx)
        except HookRejected:
            raise
        except HookError as error:
            self._fail_or_ignore(entry, error, ctx.event, ctx.pod, must)
            merger.unapplied[entry.name] = f"{error} (failure_policy=ignore)"
            return None
        if answer is None or (isinstance(answer, Adjustment) and not answer):
            return answer  # an empty one has nothing to validate or apply (but its reason)
        try:
            if not isinstance(answer, Adjustment):
                raise HookInvalidAdjustment(
                    entry.name, f"returned {type(answer).__name__}, not an Adjustment"
                )
            merger.validate(entry.name, answer, post)
            denied = entry.permissions.denied(answer)
            if denied:
                entry.counters["not_permitted"] += 1
                merger.refused.append({"hook": entry.name, "fields": denied})
                grants = (", ".join(g) or "nothing" for g in entry.permissions.describe())
                raise HookNotPermitted(
                    entry.name,
                    f"may not set {', '.join(denied)} (it may set: {' and '.join(grants)}; "
                    "see allow in its settings)",
                )
        except (HookInvalidAdjustment, HookNotPermitted) as error:
            if isinstance(answer, Adjustment):
                merger.refused_answers[entry.name] = answer
            entry.breaker.failure()
            entry.counters["failures"] += 1
            self._fail_or_ignore(entry, error, ctx.event, ctx.pod, must)
            merger.unapplied[entry.name] = f"{error} (failure_policy=ignore)"
            return None
        return answer

    async def _invoke(self, entry: ChainEntry, ctx: HookContext) -> Any:
        """Call the hook within its budget, keeping its breaker and counters. Returns its
        answer; raises HookRejected (HookInvalidRequest, HookForbidden) for a refusal, another
        HookError for a failure (a skip by an open breaker included)."""
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
        except Forbidden as exc:
            entry.breaker.success()
            entry.counters["rejected"] += 1
            raise HookForbidden(entry.name, f"{event.value} not allowed: {exc.reason}") from exc
        except Reject as exc:
            entry.breaker.success()
            entry.counters["rejected"] += 1
            raise HookRejected(entry.name, f"rejected {event.value}: {exc.reason}") from exc
        except TimeoutError as exc:
            entry.counters["timeouts"] += 1
            # Cut to what kubelet's deadline left (_context): then it is kubelet's that passed.
            kubelet_deadline = ctx.timeout < entry.timeout
            bound = "what was left of kubelet's deadline, " if kubelet_deadline else ""
            error: HookError = HookTimeout(
                entry.name,
                f"no answer to {stage.value}-{event.value} within {bound}"
                f"{ctx.timeout * 1000:.0f} ms",
                kubelet_deadline,
            )
            error.__cause__ = exc
        except ConnectionError as exc:
            error = HookUnavailable(entry.name, f"unavailable: {exc}")
        except asyncio.CancelledError:
            entry.breaker.abandon()  # kubelet went away: no verdict on the hook
            raise
        except Exception as exc:  # a hook's bug must not take the call down uncontrolled
            _log_hook_exception(entry, stage, event, exc)
            # ValueError/TypeError: also what Adjustment's setters raise for a bad value
            kind = HookInvalidAdjustment if isinstance(exc, ValueError | TypeError) else HookError
            error = kind(
                entry.name, f"{stage.value}_{event.snake} raised {type(exc).__name__}: {exc}"
            )
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
        self,
        entry: ChainEntry,
        error: HookError,
        event: Event,
        pod: PodView,
        must: str | None = None,
    ) -> None:
        """Raise for `fail` and for a required hook; count and log for `ignore`."""
        if must is not None:
            entry.counters["required_failures"] += 1
            raise HookRequired(
                f"hook {entry.name!r} is required by {must}, and did not run: {error}"
            ) from error
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
                "permissions": e.permissions.describe(),
                "subscriptions": sorted(
                    f"{s.value}-{ev.value}" for ev, s in e.hook.subscriptions()
                ),
                "breaker": e.breaker.state,
                "counters": dict(e.counters),
                "failures": failures_of(e.hook),
            }
            for e in self.entries
        ]

    async def close(self) -> None:
        for entry in self.entries:
            await entry.hook.close()


def failures_of(hook: ChainHook) -> dict[str, int]:
    """An in-process hook's own failure counts (`Hook.failures`); a plugin reports none."""
    return hook.failures() if isinstance(hook, LocalHook) else {}


def _pod_label(pod: PodView) -> str:
    return f"{pod.namespace}/{pod.name}"


def _run(
    hook: str, stage: Stage, verdict: Verdict, why: str, answer: Any, started: float
) -> HookRun:
    """A hook's run, for the trace."""
    return HookRun(hook, stage, verdict, why, answer, perf_counter() - started)


def _failed_run(
    hook: str, stage: Stage, exc: BaseException, started: float, answer: Any = None
) -> HookRun:
    """A hook's run that ended the call: refused it, or failed under `fail` (`answer`: what
    it asked, when the chain refused that)."""
    if isinstance(exc, HookRejected):
        verdict = Verdict.REJECTED
    elif isinstance(exc, asyncio.CancelledError):
        verdict = Verdict.CANCELLED
    else:
        verdict = Verdict.FAILED
    return HookRun(hook, stage, verdict, str(exc), answer, perf_counter() - started)


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


_NOT_REQUIRED: dict[str, str] = {}


def _log_hook_exception(entry: ChainEntry, stage: Stage, event: Event, exc: Exception) -> None:
    """A hook raised what no hook should: its traceback at WARNING the first time for this
    hook and exception type (so a hook failing on every call does not flood the journal),
    at DEBUG after that. A plugin's traceback is in the plugin's own log."""
    kind = type(exc).__name__
    first = kind not in entry.tracebacks_logged
    entry.tracebacks_logged.add(kind)
    log.log(
        logging.WARNING if first else logging.DEBUG,
        "hook %s: %s_%s raised %s: %s%s",
        entry.name,
        stage.value,
        event.snake,
        kind,
        exc,
        "" if first else " (traceback logged once before)",
        exc_info=first and entry.settings.endpoint is None,  # crihook's frames say nothing
    )


def _subscribes(entry: ChainEntry, event: Event, stage: Stage) -> bool:
    """The hook handles this stage (a plugin that is down: its pre stage, as `wants`)."""
    subscribed = (event, stage) in entry.hook.subscriptions()
    return subscribed or (stage is Stage.PRE and not entry.hook.connected)


def _who_requires(name: str, by_config: frozenset[str]) -> str:
    if name in by_config:
        return "the configuration ([hooks] required_hooks)"
    return f"the pod's {REQUIRED_ANNOTATION} annotation"
