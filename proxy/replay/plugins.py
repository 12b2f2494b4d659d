"""Plugins in a replay: each plugin's place in the chain is held by a stand-in that answers
every call with what the plugin answered in the recording, so that the chain's own code (the
order, permissions, merge, failure policy, breaker) applies it again, as it did then.

Which hook runs were a plugin's: the recording notes the plugins in the chain (their
drop-ins' settings) in each header and in a `plugins` line each time the drop-in directory
changed them (`Segment.plugins_at`). In a recording made before crihook noted them, a hook
that ran but is not in the recorded configuration's chain is taken for a plugin with default
settings (a warning says so).

Which plugins a replay runs: the recorded ones; with `--config`, the drop-ins in that
configuration's `plugins_dir` when the directory is there (a plugin left out is not run, so
what it changed shows as differences; one moved runs at its new place, with its new failure
policy, timeout and grants). A drop-in the recording has no answers of is never called (a
warning says so).

A stand-in subscribes, in each call, to the stages its plugin ran in during the recorded
call, and answers each with the recorded run (by verdict):

    adjusted, dry-run     the recorded adjustment (`adjustment_of`), with its reason
    nothing, ok, told     nothing (the recorded reason, if any, on an empty adjustment)
    rejected              Reject, InvalidRequest or Forbidden, with the recorded reason
    failed, ignored       the adjustment the chain refused, when the recording has it; else
                          the failure raised again: TimeoutError (timed out), ConnectionError
                          (unavailable), RuntimeError/ValueError (the plugin failed)
    cancelled             CancelledError (kubelet gave up)

At a synchronize, a stand-in asks again for the repairs only its plugin asked for.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from crihook.hooks.spec import (
    Adjustment,
    ContainerUpdate,
    Event,
    Forbidden,
    HookContext,
    InvalidRequest,
    Reject,
    ResourceDelta,
    Stage,
    SyncContext,
)
from crihook.proxy.chain.chain import Chain, ChainEntry
from crihook.proxy.config import HookSettings, parse_hook_name
from crihook.proxy.errors import ConfigError
from crihook.proxy.record.lines import adjustment_of
from crihook.proxy.replay.file import CallEntry, Segment

__all__ = [
    "PluginAnswers",
    "RecordedPlugin",
    "StandIns",
    "base_name",
    "failure_of",
    "refusal_of",
]

_STAGES = {s.value: s for s in Stage}
_IGNORED = " (failure_policy=ignore)"
_REQUIRED = re.compile(r"hook '[^']*' is required by .*?, and did not run: (?P<error>.*)", re.S)
_HOOK = re.compile(r"hook '[^']*': (?P<message>.*)", re.S)


def base_name(name: object) -> str:
    """`50-annotate` → `annotate`."""
    text = str(name)
    return text[3:] if text[:2].isdigit() and text[2:3] == "-" else text


class PluginAnswers:
    """The recorded runs of the line being replayed, by hook (base name), for the stand-ins;
    what they could not answer as recorded, as notes."""

    def __init__(self) -> None:
        self._runs: dict[str, list[Mapping[str, Any]]] = {}
        self._subscriptions: dict[str, frozenset[tuple[Event, Stage]]] = {}
        self._updates: dict[str, list[ContainerUpdate]] = {}
        self.notes: list[str] = []

    def call(self, event: Event, runs: Sequence[Mapping[str, Any]]) -> None:
        """The hooks' runs of the call about to be replayed."""
        self._clear()
        for run in runs:
            stage = _STAGES.get(str(run.get("stage")))
            if stage is None:
                continue
            base = base_name(run.get("hook", ""))
            self._runs.setdefault(base, []).append(run)
            self._subscriptions[base] = self._subscriptions.get(base, frozenset()) | {
                (event, stage)
            }

    def sync(self, updates: Sequence[Mapping[str, Any]]) -> None:
        """The repairs sent at the synchronize about to be replayed."""
        self._clear()
        for doc in updates:
            hooks = [base_name(h) for h in doc.get("hooks", [])]
            changed = doc.get("changed", {})
            if len(hooks) != 1 or not isinstance(changed, Mapping) or not changed:
                if len(hooks) > 1:
                    self.notes.append(
                        f"the repair of {str(doc.get('container_id'))[:12]} came from "
                        f"{', '.join(hooks)} together: a plugin among them is not asked for it"
                    )
                continue
            update = ContainerUpdate(str(doc.get("container_id", "")), ResourceDelta(**changed))
            self._updates.setdefault(hooks[0], []).append(update)

    def _clear(self) -> None:
        self._runs, self._subscriptions, self._updates = {}, {}, {}
        self.notes = []

    def subscriptions(self, base: str) -> frozenset[tuple[Event, Stage]]:
        return self._subscriptions.get(base, frozenset())

    def take(self, base: str, stage: Stage) -> Mapping[str, Any] | None:
        """The plugin's recorded run of `stage` in this call (each is answered once)."""
        runs = self._runs.get(base, [])
        for index, run in enumerate(runs):
            if run.get("stage") == stage.value:
                return runs.pop(index)
        return None

    def updates(self, base: str) -> list[ContainerUpdate]:
        return list(self._updates.get(base, ()))


class RecordedPlugin:
    """A `ChainHook` standing in for the plugin `name` (see the module docstring)."""

    connected = True
    bounds_own_calls = True  # it answers at once
    honours_exemption = True  # as every plugin
    sets = None  # as every plugin: the defaults, narrowed by its drop-in's allow

    def __init__(self, name: str, answers: PluginAnswers) -> None:
        self.name = name
        self.base_name = base_name(name)
        self._answers = answers

    def subscriptions(self) -> frozenset[tuple[Event, Stage]]:
        return self._answers.subscriptions(self.base_name)

    async def call(self, ctx: HookContext) -> Adjustment | None:
        run = self._answers.take(self.base_name, ctx.stage)
        if run is None:  # (it subscribes only to what it ran in)
            return None
        try:
            return _answer(run, ctx.event, ctx.stage)
        except _Unreadable as exc:
            self._answers.notes.append(
                f"plugin {self.name}'s {ctx.stage.value} answer cannot be replayed ({exc}): "
                "replayed as a failure"
            )
            raise RuntimeError(str(exc)) from None

    async def start(self) -> None:
        return None

    async def synchronize(self, sync: SyncContext) -> Sequence[ContainerUpdate]:
        return self._answers.updates(self.base_name)

    async def close(self) -> None:
        return None


class StandIns:
    """The plugins of one segment's chain in a replay: stand-ins for the recorded plugins (or
    for `dropins`, the plugins `--config` names), kept in step with the recording as the
    calls go by (`at`). `hooks`: the base names of the replayed chain's in-process hooks (a
    plugin may not take one); `recorded_hooks`: the recorded chain's (for a recording that
    does not note its plugins); `clock`: the breakers' (the recorded time of the line)."""

    def __init__(
        self,
        chain: Chain,
        segment: Segment,
        dropins: Sequence[HookSettings] | None,
        hooks: set[str],
        recorded_hooks: set[str],
        clock: Callable[[], float],
        warnings: list[str],
    ) -> None:
        self.answers = PluginAnswers()
        self._chain = chain
        self._segment = segment
        self._dropins = None if dropins is None else list(dropins)
        self._hooks = hooks
        self._clock = clock
        self._warnings = warnings
        self._warned: set[str] = set()
        self._entries: dict[str, ChainEntry] = {}
        self._current: list[HookSettings] | None = None
        self._inferred: list[HookSettings] = []
        if segment.plugins is None and not segment.plugin_changes:
            self._inferred = _inferred(segment, recorded_hooks)
            if self._inferred and dropins is None:
                names = ", ".join(p.name for p in self._inferred)
                warnings.append(
                    f"line {segment.line}: hook(s) {names} ran in the recording without being "
                    "in its configuration: replayed as plugins with default settings (this "
                    "recording does not note its plugins' settings)"
                )

    def at(self, seq: int) -> None:
        """The plugins in the chain when the line `seq` entered it."""
        if self._dropins is not None:
            wanted = self._dropins
        else:
            wanted = self._segment.plugins_at(seq) or self._inferred
        if wanted == self._current:
            return
        self._current = list(wanted)
        entries: dict[str, ChainEntry] = {}
        for settings in wanted:
            base = settings.base_name
            if base in self._hooks:
                if base not in self._warned:
                    self._warned.add(base)
                    self._warnings.append(
                        f"plugin {settings.name} is left out: {base} is an in-process hook "
                        "of the replayed chain"
                    )
                continue
            entry = self._entries.get(base)
            if entry is None or entry.settings != settings:  # (a reload: a new breaker)
                entry = Chain.entry(RecordedPlugin(settings.name, self.answers), settings)
                entry.breaker.clock = self._clock
            entries[base] = entry
        self._entries = entries
        self._chain.set_plugins(list(entries.values()))


def _inferred(segment: Segment, recorded_hooks: set[str]) -> list[HookSettings]:
    """Hooks that ran in a segment's calls without being in its recorded chain."""
    names: dict[str, str] = {}
    for entry in segment.entries:
        if not isinstance(entry, CallEntry):
            continue
        for run in entry.doc.get("hooks", []):
            name = str(run.get("hook", ""))
            if base_name(name) not in recorded_hooks:
                names.setdefault(base_name(name), name)
    out = []
    for name in names.values():
        try:
            out.append(HookSettings(name=parse_hook_name("hook", name)))
        except ConfigError:
            continue  # not NN-name: no hook crihook could have run
    return out


class _Unreadable(Exception):
    """A recorded run a stand-in cannot answer the same way."""


def _answer(run: Mapping[str, Any], event: Event, stage: Stage) -> Adjustment | None:
    verdict = str(run.get("verdict", ""))
    detail = str(run.get("detail", ""))
    answer = run.get("answer")
    if verdict in ("adjusted", "dry-run") or (verdict in ("failed", "ignored") and answer):
        if not isinstance(answer, Mapping):
            raise _Unreadable(f"{verdict} without an adjustment")
        try:
            adjustment = adjustment_of(answer)
        except (TypeError, ValueError) as exc:
            raise _Unreadable(f"its adjustment: {exc}") from None
        return adjustment.because(detail) if verdict in ("adjusted", "dry-run") else adjustment
    if verdict == "rejected":
        raise refusal_of(detail, event)
    if verdict in ("failed", "ignored"):
        failure = failure_of(detail, event, stage)
        if failure is None:
            raise _Unreadable(detail)
        raise failure
    if verdict == "cancelled":
        raise asyncio.CancelledError
    if verdict == "nothing" and detail and stage in (Stage.PRE, Stage.POST):
        return Adjustment().because(detail)
    return None


def refusal_of(detail: str, event: Event) -> Reject:
    """The refusal a recorded `rejected` run's detail stands for (the chain words the three
    kinds differently: see `Chain._invoke`)."""
    message = _without_hook(detail)
    for prefix, kind in (
        (f"rejected {event.value}: ", Reject),
        (f"{event.value} not allowed: ", Forbidden),
        (f"{event.value}: ", InvalidRequest),
    ):
        if message.startswith(prefix):
            return kind(message.removeprefix(prefix))
    return Reject(message)


def failure_of(detail: str, event: Event, stage: Stage) -> BaseException | None:
    """The exception a plugin raised (as `RemoteHook` raises them) for the recorded failure
    `detail`; None when the detail is none of those."""
    text = detail.removesuffix(_IGNORED)
    required = _REQUIRED.fullmatch(text)
    if required is not None:
        text = required["error"]
    message = _without_hook(text)
    if message.startswith(f"no answer to {stage.value}-{event.value} within "):
        return TimeoutError(message)
    for prefix in ("unavailable: ", "skipped: "):  # (a breaker the replay left closed)
        if message.startswith(prefix):
            return ConnectionError(message.removeprefix("unavailable: "))
    raised = re.fullmatch(rf"{stage.value}_{event.snake} raised (\w+): (.*)", message, re.S)
    if raised is not None:
        kind = {"ValueError": ValueError, "TypeError": TypeError}.get(raised[1], RuntimeError)
        return kind(raised[2])
    return None


def _without_hook(text: str) -> str:
    found = _HOOK.fullmatch(text)
    return found["message"] if found is not None else text
