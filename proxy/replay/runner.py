"""`crihook replay FILE`: every recorded call run through the current chain, compared with
what the recording says.

    crihook replay FILE [--config F] [--hooks NAMES|none] [--update]

For each segment of the recording (a crihook process's part, see `replay_file`) the chain is
built from the segment's recorded configuration, or from `--config`/`--hooks`, on the
recorded node facts (no `--sysfs-root`: the topology, memory and device answers come from the
header and the lines). The recorded plugins (or, with `--config`, the drop-ins of its
`plugins_dir`) take their places in the chain as stand-ins answering with the recorded
answers (`replay_plugins`); breakers keep the recorded time. Synchronizes hand the hooks
the recorded pods, containers and states; calls go through the same pipeline core as
`crihook serve`, against a runtime that answers from the recording (`replay_seams`). Nothing
reaches a real runtime, a plugin or the host.

Compared per call: the status it ended with, what was forwarded (field by field, redacted as
the recording was), the updates issued to other containers, and what hooks did to the host;
per synchronize: the repairs sent. Exit status: 0 everything matches, 1 a difference, 2 the
file is missing, unreadable or corrupt (the line is named) or the configuration is bad.
`--update` rewrites the recording's expectations with what the replay did instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from google.protobuf.message import DecodeError

from crihook.hooks.spec.limits import node_hugepage_sizes
from crihook.proxy.chain.chain import Chain, ChainEntry
from crihook.proxy.chain.local_hooks import load_local_hook
from crihook.proxy.chain.plugins import load_dropins
from crihook.proxy.config import HookSettings, Settings, apply_flags, settings_from_toml
from crihook.proxy.core.observe import EFFECTS
from crihook.proxy.core.pipeline import Pipeline
from crihook.proxy.core.placement import Placement
from crihook.proxy.core.sync import Synchronizer, SyncReport
from crihook.proxy.core.updates import ContainerUpdater
from crihook.proxy.cri.events import INTERCEPTED
from crihook.proxy.cri.outcome import Outcome
from crihook.proxy.cri.readiness import Readiness
from crihook.proxy.errors import ConfigError
from crihook.proxy.record.lines import (
    UNCHANGED,
    forwarded_doc,
    hook_docs,
    status_doc,
    update_docs,
)
from crihook.proxy.record.redact import Redactor
from crihook.proxy.record.render import render
from crihook.proxy.replay.diff import ABSENT, Difference, field_diff
from crihook.proxy.replay.file import (
    CallEntry,
    Recording,
    Segment,
    SyncEntry,
)
from crihook.proxy.replay.plugins import StandIns, base_name
from crihook.proxy.replay.seams import RecordedNetlink, RecordedNode, RecordedRuntime
from crihook.proxy.state.records import ContainerRecord, PodRecord
from crihook.proxy.state.store import Store

__all__ = ["EntryResult", "ReplayReport", "replay", "settings_for"]

log = logging.getLogger(__name__)


@dataclass
class EntryResult:
    entry: CallEntry | SyncEntry
    differences: list[Difference] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    updated: dict[str, Any] | None = None
    """The line with the replay's expectations (for --update)."""


@dataclass
class ReplayReport:
    recording: Recording
    results: list[EntryResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    dropins: list[HookSettings] | None = None
    """The plugins `--config`'s drop-ins configure, when the replay ran them instead of the
    recorded ones (--update writes them into the recording)."""

    @property
    def differing(self) -> list[EntryResult]:
        return [r for r in self.results if r.differences]

    def summary(self) -> str:
        calls = sum(isinstance(r.entry, CallEntry) for r in self.results)
        syncs = len(self.results) - calls
        segments = len(self.recording.segments)
        what = f"{calls} call(s) and {syncs} synchronize(s) in {segments} segment(s)"
        differing = self.differing
        if not differing:
            return f"replayed {what}: everything matches"
        return f"replayed {what}: {len(differing)} differ"


async def replay(
    recording: Recording, config: Settings | None = None, hooks: str | None = None
) -> ReplayReport:
    """Replay every segment; ConfigError when a configuration cannot be used."""
    report = ReplayReport(recording)
    if config is not None:
        _use_dropins(report, config)
    state_dir = Path(tempfile.mkdtemp(prefix="crihook-replay-"))
    store = Store(state_dir)
    try:
        store.load()
        node = RecordedNode(store)
        for segment in recording.segments:
            settings = settings_for(segment, config, hooks)
            runner = _SegmentReplay(segment, settings, store, node, report)
            await runner.run()
        await store.close()
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
    return report


def _use_dropins(report: ReplayReport, config: Settings) -> None:
    """--config's plugins: the drop-ins of its plugins_dir, when the directory is here."""
    directory = config.chain.plugins_dir
    found = load_dropins(directory)
    if found is None:
        report.warnings.append(
            f"--config's plugins_dir {directory} is not here: the recorded plugins are replayed"
        )
        return
    dropins, problems = found
    report.dropins = dropins
    report.warnings += [f"plugin drop-in left out: {problem}" for problem in problems]
    recorded = _recorded_plugins(report.recording)
    for plugin in dropins:
        if plugin.base_name not in recorded:
            report.warnings.append(
                f"plugin {plugin.name} ({directory}) has no answers in the recording: "
                "it is not called"
            )
    chosen = {p.base_name for p in dropins}
    for name in sorted(recorded - chosen):
        report.warnings.append(
            f"plugin {name} of the recording is not in {directory}: it is not run"
        )


def _recorded_plugins(recording: Recording) -> set[str]:
    """Base names of the plugins the recording notes (or, where it notes none, of the hooks
    that ran without being in its configuration)."""
    names: set[str] = set()
    for segment in recording.segments:
        noted = [segment.plugins or [], *(p for _, p in segment.plugin_changes)]
        names |= {p.base_name for plugins in noted for p in plugins}
        if segment.plugins is None and not segment.plugin_changes:
            configured = {base_name(n) for n in _recorded_order(segment)}
            names |= {
                base_name(run.get("hook", ""))
                for entry in segment.entries
                if isinstance(entry, CallEntry)
                for run in entry.doc.get("hooks", [])
            } - configured
    return names


def _recorded_order(segment: Segment) -> list[str]:
    order = segment.header["config"].get("hooks", {}).get("order", [])
    return [str(name) for name in order]


def settings_for(segment: Segment, config: Settings | None, hooks: str | None) -> Settings:
    """The settings a segment is replayed with: its recorded configuration (or `config`),
    with `hooks` (the --hooks flag) applied; ConfigError when they cannot be used."""
    settings = config
    if settings is None:
        try:
            settings = settings_from_toml(segment.header["config"])
        except ConfigError as exc:
            raise ConfigError(
                f"the configuration recorded at line {segment.line}", str(exc)
            ) from None
    if hooks is not None:
        # The recorded tables of hooks --hooks leaves out are not an error here.
        chosen = {re.sub(r"^[0-9]{2}-", "", name.strip()) for name in hooks.split(",")}
        tables = {k: v for k, v in settings.chain.hook_tables.items() if k in chosen}
        chain = replace(settings.chain, hook_tables=MappingProxyType(tables))
        settings = apply_flags(replace(settings, chain=chain), {"hooks": hooks})
    return settings


class _SegmentReplay:
    """One crihook process's part of a recording, replayed through a chain of its own."""

    def __init__(
        self,
        segment: Segment,
        settings: Settings,
        store: Store,
        node: RecordedNode,
        report: ReplayReport,
    ) -> None:
        self.segment = segment
        self.settings = settings
        self.store = store
        self.node = node
        self.report = report
        header_record = segment.header["config"].get("record", {})
        self.redactor = Redactor(
            header_record.get("redact_annotations", ()),
            header_record.get("redact_values", ()),
            enabled=bool(segment.header.get("redacted", True)),
        )
        self.recorded_hooks = {base_name(name) for name in _recorded_order(segment)}
        self.now = 0.0
        """The recorded time of the line being replayed: the breakers' clock."""
        self.runtime = RecordedRuntime()
        self.readiness = Readiness()
        self.chain = Chain(settings.chain, store.hook_state)
        topology = segment.topology
        placement = Placement(settings.node.topology_policy, topology.numa_nodes)
        self.pipeline = Pipeline(
            self.runtime,
            self.chain,
            store,
            self.readiness,
            placement,
            node_hugepage_sizes(topology),  # the recorded node's: the same door
            # Updates go out before the next call, answered as recorded, never retried:
            # what a call issued is compared whatever the recorded `updates` setting was.
            updates_after_answer=False,
            updater=ContainerUpdater(self.runtime, store, retry=False),
        )
        self.outcomes: list[Outcome] = []
        self.pipeline.on_outcome = self.outcomes.append
        self.sync = Synchronizer(
            self.chain,
            store,
            node,
            None,
            self.pipeline.updater,
            topology,
            node,
            settings.node.topology_policy,
            settings.node.topology_scope,
            files=node,
            cgroups=node,
            netlink=RecordedNetlink(node),
            staging=node,
        )
        self.reports: list[SyncReport] = []
        self.sync.on_sync = self.reports.append
        self.synchronized = False
        self.plugins = StandIns(
            self.chain,
            segment,
            report.dropins,
            {h.base_name for h in settings.chain.hooks},
            self.recorded_hooks,
            self._clock,
            report.warnings,
        )

    def _clock(self) -> float:
        return self.now

    async def run(self) -> None:
        self.node.learn(self.segment.header.get("node", {}).get("files", []))
        for number, lost in self.segment.gaps:
            self.report.warnings.append(
                f"line {number}: the recording lost {lost} line(s) here; what follows may differ"
            )
        await self._build_chain()
        try:
            for entry in self.segment.entries:
                self.now = float(entry.doc.get("time") or 0.0)
                self.plugins.at(entry.seq)
                if isinstance(entry, SyncEntry):
                    await self._sync(entry)
                else:
                    if not self.synchronized and entry.doc.get("ready", True):
                        self.report.warnings.append(
                            f"line {entry.line}: a call before any synchronize; the hooks "
                            "start from empty state"
                        )
                        self.synchronized = True
                    await self._call(entry)
        finally:
            await self.chain.close()

    async def _build_chain(self) -> None:
        entries: list[ChainEntry] = []
        for hook_settings in self.settings.chain.hooks:
            entry = Chain.entry(load_local_hook(hook_settings), hook_settings)
            entry.breaker.clock = self._clock
            entries.append(entry)
        self.chain.set_builtin(entries)
        for entry in self.chain.entries:
            await entry.hook.start()

    # --- synchronize -----------------------------------------------------------------------
    async def _sync(self, entry: SyncEntry) -> None:
        fresh = entry.kind == "snapshot" or entry.reason == "start"
        self._adopt(entry, fresh)
        if entry.breakers is not None:  # a rotated file: its breakers as they were then
            self.chain.restore_breakers(entry.breakers)
        self.node.states = entry.states
        self.node.begin(entry.doc.get("observed", []))
        self.plugins.answers.sync(entry.doc.get("updates", []))
        self.runtime.entry_for_sync()
        self.reports.clear()
        await self.sync.synchronize("start" if entry.kind == "snapshot" else entry.reason)
        self.node.end()
        self.synchronized = True
        result = EntryResult(entry)
        report = self.reports[-1] if self.reports else None
        replayed = update_docs(report.updates) if report else []
        if entry.kind == "sync":
            result.differences += _updates_diff(entry.doc.get("updates", []), replayed, self.store)
            result.differences += _effects_diff(entry.doc.get("observed", []), self.node.effects)
        result.notes += _missing(self.node.missing) + self.plugins.answers.notes
        if entry.kind == "sync":
            result.updated = {
                **entry.doc,
                "updates": replayed,
                "observed": _with_effects(entry.doc.get("observed", []), self.node.effects),
            }
        self.report.results.append(result)

    def _adopt(self, entry: SyncEntry, fresh: bool) -> None:
        """The pods and containers the runtime had (those it no longer had, removed without
        crihook, dropped), and (at a start) what the hooks of the recorded chain had on
        disk; hooks new in the replay keep their own state."""
        store = self.store
        if not fresh:
            containers = {c.id for c in entry.containers}
            for cid in [c for c in store.containers if c not in containers]:
                store.remove_container(cid)
            pods = {p.id for p in entry.pods}
            for sid in [s for s in store.pods if s not in pods]:
                store.remove_pod(sid)
        if fresh:
            for cid in list(store.containers):
                store.remove_container(cid)
            for sid in list(store.pods):
                store.remove_pod(sid)
            for name, recorded in entry.hook_states.items():
                if name not in self.recorded_hooks:
                    continue
                hook_state = store.hook_state(name)
                for key, _ in hook_state.items():
                    hook_state.delete(key)
                for key, value in recorded.items():
                    hook_state.set(key, value)
        for pod in entry.pods:
            if pod.id not in store.pods:
                store.put_pod(PodRecord(pod))
        for container in entry.containers:
            if container.id not in store.containers:
                record = ContainerRecord(container)
                record.state = entry.states.get(container.id, record.state)
                store.put_container(record)

    # --- calls -----------------------------------------------------------------------------
    async def _call(self, entry: CallEntry) -> None:
        doc = entry.doc
        self.node.begin(doc.get("observed", []))
        self.plugins.answers.call(entry.event, doc.get("hooks", []))
        self.runtime.call_entry = entry
        self.runtime.cancelled_by_kubelet = (entry.status or {}).get("origin") == "kubelet"
        ready = doc.get("ready", True) is not False
        reason = str((entry.status or {}).get("message", "")).removeprefix("crihook: ")
        self.readiness.set(ready, "" if ready else reason)
        timeout = doc.get("timeout")
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        metadata = tuple((str(k), v) for k, v in doc.get("metadata", []) if isinstance(v, str))
        self.outcomes.clear()
        self.runtime.unrecorded.clear()
        with contextlib.suppress(asyncio.CancelledError):
            await self.pipeline.handle(entry.event, entry.request, metadata or None, deadline)
        self.node.end()
        outcome = self.outcomes[-1]
        result = EntryResult(entry)
        result.differences = self._compare(entry, outcome)
        result.notes += _missing(self.node.missing) + self.plugins.answers.notes
        result.notes += [
            f"the runtime was asked {m}, which the recording has no answer for (answered OK)"
            for m in self.runtime.unrecorded
        ]
        result.updated = self._updated(entry, outcome)
        self.report.results.append(result)

    def _compare(self, entry: CallEntry, outcome: Outcome) -> list[Difference]:
        out: list[Difference] = []
        recorded_status = _status_text(entry.status)
        replayed_status = _status_text(status_doc(outcome.status, outcome.status_origin))
        if recorded_status != replayed_status:
            out.append(Difference("status", "", recorded_status, replayed_status))
        out += self._forwarded_diff(entry, outcome)
        replayed_updates = update_docs(outcome.updates)
        out += _updates_diff(entry.doc.get("updates", []), replayed_updates, self.store)
        out += _effects_diff(entry.doc.get("observed", []), self.node.effects)
        return out

    def _forwarded_diff(self, entry: CallEntry, outcome: Outcome) -> list[Difference]:
        recorded = entry.forwarded
        replayed: bytes | str | None
        if outcome.forwarded is None:
            replayed = None
        elif outcome.forwarded is outcome.received:
            replayed = UNCHANGED
        else:
            replayed = outcome.forwarded
        if recorded is None or replayed is None:
            if (recorded is None) != (replayed is None):
                return [
                    Difference("forwarded", "", _forward_text(recorded), _forward_text(replayed))
                ]
            return []
        recorded_bytes = entry.request if recorded == UNCHANGED else recorded
        replayed_bytes = entry.request if replayed == UNCHANGED else replayed
        if recorded_bytes == replayed_bytes:
            return []
        message_type = INTERCEPTED[entry.event].request
        try:
            recorded_json = render(message_type.FromString(recorded_bytes))  # type: ignore[arg-type]
            message = message_type.FromString(replayed_bytes)  # type: ignore[arg-type]
        except DecodeError as exc:
            return [Difference("forwarded", "", "undecodable", str(exc))]
        self.redactor.request(entry.event, message)
        return list(field_diff(recorded_json, render(message), "forwarded"))

    def _updated(self, entry: CallEntry, outcome: Outcome) -> dict[str, Any]:
        """The line with the replay's expectations; what the runtime answered is kept."""
        doc = dict(entry.doc)
        spec = INTERCEPTED[entry.event]
        if outcome.forwarded is None:
            doc["forwarded"] = None
        elif outcome.forwarded is outcome.received:
            doc["forwarded"] = UNCHANGED
        else:
            received = spec.request.FromString(entry.request)
            doc["forwarded"] = forwarded_doc(
                received, outcome.forwarded, spec.request, self.redactor, entry.event
            )
        if entry.status and entry.status.get("origin") == "runtime":
            doc.setdefault("runtime_status", entry.status)
        doc["status"] = status_doc(outcome.status, outcome.status_origin)
        doc["hooks"] = hook_docs(outcome.hooks, self.redactor)
        doc["updates"] = update_docs(outcome.updates)
        doc["observed"] = _with_effects(doc.get("observed", []), self.node.effects)
        return doc


# --- comparing -------------------------------------------------------------------------------


def _status_text(doc: dict[str, Any] | None) -> str:
    if not doc:
        return "OK"
    return f"{doc['code']}: {doc.get('message', '')}"


def _forward_text(value: bytes | str | None) -> str:
    if value is None:
        return "not forwarded"
    return "forwarded unchanged" if value == UNCHANGED else "forwarded adjusted"


def _updates_diff(
    recorded: Sequence[dict[str, Any]], replayed: Sequence[dict[str, Any]], store: Store
) -> list[Difference]:
    by_id_recorded = {u["container_id"]: u for u in recorded}
    by_id_replayed = {u["container_id"]: u for u in replayed}
    out: list[Difference] = []
    for cid in sorted(set(by_id_recorded) | set(by_id_replayed)):
        record = store.container(cid)
        label = f"{record.view.name} ({cid[:12]})" if record else cid[:12]
        mine = by_id_recorded.get(cid)
        theirs = by_id_replayed.get(cid)
        if mine is None or theirs is None:
            out.append(
                Difference(
                    "updates",
                    label,
                    mine["resources"] if mine else "not sent",
                    theirs["resources"] if theirs else "not sent",
                )
            )
            continue
        keep = ("resources", "status")
        out += field_diff(
            {k: mine.get(k) for k in keep}, {k: theirs.get(k) for k in keep}, "updates", label
        )
    return out


def _effects_diff(
    recorded_observed: Sequence[dict[str, Any]], replayed: Sequence[dict[str, Any]]
) -> list[Difference]:
    """What hooks did to the host, change by change (`host move_in(...): recorded "made",
    replayed (absent)`); the same changes in another order as one difference."""
    recorded = RecordedNode.recorded_effects(recorded_observed)
    mine = RecordedNode.recorded_effects(replayed)
    if recorded == mine:
        return []
    only_recorded = Counter(recorded) - Counter(mine)
    only_replayed = Counter(mine) - Counter(recorded)
    if not only_recorded and not only_replayed:
        return [Difference("host", "(order)", recorded, mine)]
    out = []
    for effect, count in only_recorded.items():
        out += [Difference("host", effect, "made", ABSENT)] * count
    for effect, count in only_replayed.items():
        out += [Difference("host", effect, ABSENT, "made")] * count
    return out


def _with_effects(
    observed: Sequence[dict[str, Any]], effects: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    return [d for d in observed if d.get("op") not in EFFECTS] + [dict(e) for e in effects]


def _missing(questions: Sequence[str]) -> list[str]:
    return [f"hooks asked {q}, which the recording has no answer for" for q in questions]
