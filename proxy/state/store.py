"""Pods and containers crihook has seen, each hook's private state, and the audit.

Keyed by sandbox id and container id; entries are deleted on Remove (not Stop: a stopped
container can be inspected and restarted by kubelet). Everything is persisted under the
state directory, off the event loop, as snapshots and the journals of what changed since
(below). At start the store is loaded from disk and reconciled with the runtime: what the
runtime no longer has is dropped, what it has that the disk lacks is rebuilt from its
verbose status.

Two ways to persist, one for each side of the runtime's action:

- `write_ahead(through)`, before a call is forwarded: what the call's hooks changed
  (tracked per call: `track_changes()`) must be on disk before the runtime acts on it. The
  changed keys (not whole states) are appended as one line to the hook journal
  (`hooks/journal-<n>.jsonl`), on the event loop: a few hundred bytes into the page cache,
  ~10 µs, where a thread hop and a rename-and-fsync of the state file cost ~0.7 ms. The line
  is not fsynced: it survives crihook's own crash at once, and the write-behind below makes
  it durable within WRITE_BEHIND_SECONDS. A node crash in between loses what it would lose
  anyway: the containers stop with the node, and whatever the runtime still has at the next
  start is learnt back from it (reconcile). If the state directory refuses the line the
  call is not forwarded (`StateWriteError`); nothing is lost from memory. A call that
  changed nothing never writes ahead, so another call's failed write cannot fail it.
- `write_behind()`, after the runtime acted: persisted soon (0.2 s, coalesced) by a
  background writer. The runtime already did it, so a failed write never fails a call: the
  writer keeps everything in memory, retries with backoff (0.2 s doubling to 5 s), marks the
  store degraded (logged once on entering, once on leaving) and recovers by itself when the
  disk does.

What a write costs does not grow with the node: the background writer appends what changed
and compacts in the background. Each write-behind
- appends the pod and container records that changed, whole (or null: removed), as one
  line of the records journal (`records-<n>.jsonl`, proxy/state/records_journal.py), and fsyncs
  it;
- journals the hook state changes not journaled yet and fsyncs the hook journal: the lines
  written ahead are durable from here on.
A compaction folds the journals into the snapshot files: store.json (every record, and the
number of the last records journal file it holds) and each changed hook state whole
(`hooks/<name>.json`), crash-safe and fsynced, then deletes the journal files they hold.
It runs when a journal has grown as large as its snapshot (so each byte journaled pays for
at most one byte rewritten), when a line is COMPACT_SECONDS old, on `flush()` and at
`close()`: a store.json of 1,000 containers is never rewritten per call, only once the
calls' lines add up to its size or have waited COMPACT_SECONDS; the snapshot is joined from
each record's JSON kept since it last changed, and written, in a worker thread.

What the store keeps per pod and container is bounded: labels and annotations together up
to validate.MAX_KEPT_BYTES (a request over it is refused before it reaches the runtime),
the audit by the fields hooks may set, and the newest MAX_UPDATE_ERRORS refused updates.

`load()` (and `crihook state`) read the snapshots and replay the journal files left over,
oldest first; a torn last line of a crash is skipped and named. Records journal files
numbered up to the one store.json names are skipped (store.json holds them). Each hook
journal line carries a key's value as it was when the line was written, and every change
reaches the hook journal before the compaction that covers it, so replaying a whole old hook
journal file over newer state files changes nothing. Only a reader that runs beside crihook
can see part of a file (lines appended after it read the file, then compacted into a state
file before it read that): `crihook state` reads again when the journal changed under it.
A store.json written before the
records journal existed (no `"journal"`) loads as the snapshot it is, and is rewritten in
the new layout at the first compaction.

Around the `Store`: its records (proxy/state/records.py), a hook's state
(proxy/state/hook_state.py), the files it writes (proxy/state/journal.py), and the
reconcile with the runtime (proxy/state/reconcile.py), which `Store.reconcile*` hand on to.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crihook.hooks.spec import ContainerState, ContainerView, PodView
from crihook.proxy.cri.runtime import Runtime
from crihook.proxy.errors import StateWriteError
from crihook.proxy.state import reconcile
from crihook.proxy.state.directory import HOOKS_DIR, STATE_DIR_MODE
from crihook.proxy.state.hook_state import HookStateStore, encode_key, encode_value
from crihook.proxy.state.journal import (
    JournalFile,
    describe,
    fsync_file,
    journal_files,
    journal_name,
    remove_files,
    remove_leftover_temp_files,
    write_atomic,
)
from crihook.proxy.state.records import ContainerRecord, PodRecord
from crihook.proxy.state.records_journal import (
    apply_records,
    read_records,
    records_files,
    records_name,
)
from crihook.proxy.state.unsettled import Unsettled

__all__ = ["Store", "apply_journal", "read_journal"]

log = logging.getLogger(__name__)

STORE_VERSION = 1
STORE_FILE = "store.json"
STATUS_FILE = "status.json"
WRITE_BEHIND_SECONDS = 0.2
COMPACT_SECONDS = 2.0
"""A journal line is folded into the snapshot files at most this long after it was written
(sooner when the journals have grown as large as the snapshots)."""
RETRY_FIRST_SECONDS = 0.2
"""After a failed write-behind, the first retry waits this long; each next one twice as long."""
RETRY_MAX_SECONDS = 5.0
"""The longest wait between two retries of a failed write-behind."""
MAX_UPDATE_ERRORS = 10
"""A container record keeps its newest refused updates, this many (the log has them all)."""


# Reading the hook journal back stays with load(): what it finds unreadable is the store's
# own log line (tests and operators read it under this module's logger).
def read_journal(hooks_dir: Path) -> list[tuple[Path, list[bytes]]]:
    """The lines of the hook journal files in `hooks_dir`, oldest file first. Read them
    before the state files when crihook may be running: a compaction between the two reads
    then leaves old lines over new files, never new files missing the lines; the caller reads
    again if the journal changed meanwhile (ops/state_cli.py)."""
    found = []
    for _, path in journal_files(hooks_dir):
        try:
            found.append((path, path.read_bytes().splitlines()))
        except FileNotFoundError:
            continue  # a compaction took it into the state files meanwhile
        except OSError as exc:
            log.error("cannot read the hook journal %s: %s", path, describe(exc))
    return found


def apply_journal(journal: list[tuple[Path, list[bytes]]], states: dict[str, Any]) -> set[str]:
    """Apply `read_journal`'s lines to `states` (hook → its state, changed in place), in
    order; returns the hooks they changed. A line that cannot be read (a crash tore it) is
    skipped with a warning."""
    replayed: set[str] = set()
    for path, lines in journal:
        for number, raw in enumerate(lines, 1):
            try:
                entry = json.loads(raw)
                changes = [
                    (name, dict(change.get("set", {})), list(change.get("delete", [])))
                    for name, change in entry.items()
                ]
            except (ValueError, TypeError, AttributeError) as exc:
                log.warning("%s line %d is unreadable (%s); skipped", path, number, exc)
                continue
            for name, values, gone in changes:
                state = states.get(name)
                if not isinstance(state, dict):
                    state = states[name] = {}
                state.update(values)
                for key in gone:
                    state.pop(key, None)
                replayed.add(name)
    return replayed


class CallChanges:
    """The hook state changes one call made (the number of its last one; 0: none)."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last = 0


_CALL: contextvars.ContextVar[CallChanges | None] = contextvars.ContextVar(
    "crihook_call_changes", default=None
)


class _WriteFailed(Exception):
    """A state file could not be written; `reason` names the file and the error."""

    def __init__(self, path: Path, error: OSError) -> None:
        self.path = path
        self.error = error
        self.reason = f"cannot write {path}: {describe(error)}"
        super().__init__(self.reason)


@dataclass
class _Plan:
    """What one write puts on disk, from a worker thread (Store._write)."""

    records_line: tuple[Path, bytes] | None = None
    """A line for the records journal file."""
    snapshot: tuple[list[str], list[str], int] | None = None
    """store.json anew: every pod's and container's JSON fragment, and the number of the
    last records journal file it holds."""
    snapshot_bytes: int = 0
    hooks: dict[str, bytes] = field(default_factory=dict)
    """Hook state files anew; then the hook journal files up to `hooks_covered` go."""
    hooks_covered: int = 0
    sync: Path | None = None
    """The hook journal file whose appended lines are fsynced."""

    @property
    def empty(self) -> bool:
        return (
            self.records_line is None
            and self.snapshot is None
            and not self.hooks
            and self.sync is None
        )


class Store:
    def __init__(
        self,
        state_dir: Path,
        journal_in_thread: bool = False,
        *,
        status_provider: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.pods: dict[str, PodRecord] = {}
        self.containers: dict[str, ContainerRecord] = {}
        self._hook_states: dict[str, HookStateStore] = {}
        self._changed_pods: set[str] = set()
        self._changed_containers: set[str] = set()
        """Records changed since the last records journal line (or snapshot)."""
        self._by_pod: dict[str, dict[str, None]] = {}
        """Sandbox id → the ids of its containers (in the order they were put)."""
        self._records_gen = 1
        """The records journal file lines go to; a compaction starts the next one."""
        self._records_file = JournalFile()
        self._records_bytes = 0
        """Bytes in the records journal files since the last snapshot (store.json)."""
        self._snapshot_bytes = 0
        """store.json's size when it was last written (or read)."""
        self._hook_journal_bytes = 0
        """Bytes in the hook journal files since the last compaction of the hook states."""
        self._hook_file_bytes: dict[str, int] = {}
        """Each hook's state file size when it was last written (or read)."""
        self._unsynced: Path | None = None
        """The hook journal file holds lines not fsynced yet (the write-behind does)."""
        self._uncompacted_since: float | None = None
        """When the first journal line the snapshots lack was written (monotonic)."""
        self._compact_timer: asyncio.TimerHandle | None = None
        self._compact_wanted = False
        self._appended = 0
        """Lines appended to the hook journal so far (tells whether one came after a sync)."""
        self._dirty_hooks: set[str] = set()
        """Hooks whose state file is behind: written at the next compaction."""
        self._unjournaled: dict[str, set[str]] = {}
        """Hook → keys changed since the last journal line."""
        self._journal_gen = 1
        """The journal file lines are appended to; a compaction starts the next one."""
        self._journal_at: tuple[int, Path] = (0, state_dir)
        self._journal_file = JournalFile()
        # Hook state changes are numbered; a call knows the number of its own last one, and
        # write_ahead() writes unless the disk (journal or state files) has everything up to
        # it already.
        self._hook_changes = 0
        self._journaled = 0
        self._write_lock = asyncio.Lock()
        self._journal_lock = asyncio.Lock()
        """Orders journal lines: each holds values newer than the line before it."""
        self.journal_in_thread = journal_in_thread
        """Journal lines are written from a worker thread: the state directory is on a file
        system that can block (network, FUSE), which the caller found out (app.py)."""
        self.status_provider = status_provider
        """What status.json says, rewritten every second while crihook runs (app's status)."""
        self._timer: asyncio.TimerHandle | None = None
        self._writer: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._closing = False
        # Each record's JSON, kept between writes so a journal line or a snapshot joins them
        # instead of re-encoding the store. None: changed, encoded at the next write (off
        # the call path, and once however often it changed in between).
        self._pod_json: dict[str, str | None] = {}
        self._container_json: dict[str, str | None] = {}
        self.degraded: str | None = None
        """Why the last write of the state failed, while it has not succeeded since."""
        self.degraded_since: float | None = None
        """When (epoch seconds) the store became degraded."""
        self.write_failures = 0
        """Failed writes of store.json or a hook state since start (retries included)."""
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        self.retry_seconds: float | None = None
        """While a failed write-behind waits to be retried: how long that wait is."""
        self.status_write_failures = 0
        self._status_error: str | None = None
        self.unsettled = Unsettled(state_dir)
        """Containers whose resources the runtime may have changed since their record was
        written (proxy/state/unsettled.py)."""
        self.in_doubt: set[str] = set()
        """Found at load(): the containers whose resources are taken from the runtime."""

    # --- records -------------------------------------------------------------------------------
    def pod(self, sandbox_id: str) -> PodRecord | None:
        return self.pods.get(sandbox_id)

    def container(self, container_id: str) -> ContainerRecord | None:
        return self.containers.get(container_id)

    def put_pod(self, record: PodRecord) -> None:
        """Add or replace a pod record; call again after changing a record in place."""
        if not record.view.id:
            raise ValueError("a pod record needs a sandbox id")
        self.pods[record.view.id] = record
        self._pod_json[record.view.id] = None
        self._changed_pods.add(record.view.id)

    def put_container(self, record: ContainerRecord) -> None:
        """Add or replace a container record; call again after changing it in place."""
        if not record.view.id:
            raise ValueError("a container record needs a container id")
        cid = record.view.id
        if len(record.update_errors) > MAX_UPDATE_ERRORS:
            del record.update_errors[:-MAX_UPDATE_ERRORS]
        old = self.containers.get(cid)
        if old is not None and old.view.pod_id != record.view.pod_id:
            self._unindex(cid, old.view.pod_id)
        self.containers[cid] = record
        self._by_pod.setdefault(record.view.pod_id, {})[cid] = None
        self._container_json[cid] = None
        self._changed_containers.add(cid)

    def remove_container(self, container_id: str) -> ContainerRecord | None:
        record = self.containers.pop(container_id, None)
        self._container_json.pop(container_id, None)
        if record is not None:
            self._unindex(container_id, record.view.pod_id)
            self._changed_containers.add(container_id)
        return record

    def remove_pod(self, sandbox_id: str) -> PodRecord | None:
        """Remove a pod and every container of it."""
        record = self.pods.pop(sandbox_id, None)
        self._pod_json.pop(sandbox_id, None)
        for cid in list(self._by_pod.get(sandbox_id, ())):
            self.remove_container(cid)
        if record is not None:
            self._changed_pods.add(sandbox_id)
        return record

    def _unindex(self, container_id: str, sandbox_id: str) -> None:
        ids = self._by_pod.get(sandbox_id)
        if ids is not None:
            ids.pop(container_id, None)
            if not ids:
                del self._by_pod[sandbox_id]

    def container_states(self) -> dict[str, ContainerState]:
        return {cid: r.state for cid, r in self.containers.items()}

    def set_state(self, container_id: str, state: ContainerState) -> None:
        record = self.containers.get(container_id)
        if record is not None and record.state is not state:
            record.state = state
            self.put_container(record)

    def containers_of(self, sandbox_id: str) -> list[ContainerView]:
        """The containers recorded for one sandbox."""
        return [self.containers[cid].view for cid in self._by_pod.get(sandbox_id, ())]

    def snapshot(self) -> tuple[list[PodView], list[ContainerView]]:
        return ([r.view for r in self.pods.values()], [r.view for r in self.containers.values()])

    def hook_state(self, name: str) -> HookStateStore:
        state = self._hook_states.get(name)
        if state is None:
            state = HookStateStore(name, {}, self._hook_touched)
            self._hook_states[name] = state
        return state

    def hook_states(self) -> dict[str, dict[str, Any]]:
        return {n: s.to_dict() for n, s in self._hook_states.items()}

    def _hook_touched(self, name: str, key: str) -> None:
        self._dirty_hooks.add(name)
        keys = self._unjournaled.get(name)
        if keys is None:
            self._unjournaled[name] = {key}
        else:
            keys.add(key)
        self._hook_changes += 1
        call = _CALL.get()
        if call is not None:
            call.last = self._hook_changes

    @property
    def hook_states_dirty(self) -> bool:
        """Hook state changes not durably on disk yet (not journaled, or not fsynced)."""
        return bool(self._unjournaled) or self._unsynced is not None

    @contextlib.contextmanager
    def track_changes(self) -> Iterator[CallChanges]:
        """Within it, the hook state changes made by the current task (one call's stages)
        are noted in the CallChanges it yields, for `write_ahead(changes.last)`."""
        changes = CallChanges()
        token = _CALL.set(changes)
        try:
            yield changes
        finally:
            _CALL.reset(token)

    @property
    def _dirty(self) -> bool:
        return (
            bool(self._changed_pods or self._changed_containers)
            or self.hook_states_dirty
            or self._compact_wanted
        )

    # --- loading -------------------------------------------------------------------------------
    def load(self) -> None:
        """Read what an earlier crihook persisted. A corrupt file is set aside, not fatal;
        temp files an interrupted write left behind are removed."""
        (self.state_dir / HOOKS_DIR).mkdir(mode=STATE_DIR_MODE, parents=True, exist_ok=True)
        for directory in (self.state_dir, self.state_dir / HOOKS_DIR):
            remove_leftover_temp_files(directory)
        self._load_records()
        self.in_doubt = self.unsettled.load(self.containers.keys())
        hooks_dir = self.state_dir / HOOKS_DIR
        journal = read_journal(hooks_dir)
        states: dict[str, dict[str, Any]] = {}
        for file in sorted(hooks_dir.glob("*.json")):
            data = _read_json(file)
            if data is not None:
                states[file.stem] = data
        replayed = apply_journal(journal, states)
        last = max((gen for gen, _ in journal_files(hooks_dir)), default=0)
        for name, data in states.items():
            self._hook_states[name] = HookStateStore(name, data, self._hook_touched)
            with contextlib.suppress(OSError):
                self._hook_file_bytes[name] = (hooks_dir / f"{name}.json").stat().st_size
        # What only the journal has goes into the state files at the first compaction,
        # which then deletes the journal files read here.
        self._dirty_hooks |= replayed
        self._hook_journal_bytes = sum(len(line) + 1 for _, lines in journal for line in lines)
        self._journal_gen = last + 1
        if replayed or self._records_bytes:
            self._compact_wanted = True

    def _load_records(self) -> None:
        """store.json (the snapshot; today's or an older crihook's, which has no journal)
        and the records journal lines written after it."""
        path = self.state_dir / STORE_FILE
        journal = read_records(self.state_dir)
        doc = _read_json(path)
        if doc is not None and doc.get("version") != STORE_VERSION:
            _set_aside(path, f"version {doc.get('version')!r}, expected {STORE_VERSION}")
            doc = None
        if doc is None:
            doc = {}
        else:
            with contextlib.suppress(OSError):
                self._snapshot_bytes = path.stat().st_size
        covered = doc.get("journal", 0)
        covered = covered if isinstance(covered, int) else 0
        apply_records(journal, doc)
        for doc_pod in doc.get("pods", {}).values():
            self.put_pod(PodRecord.from_dict(doc_pod))
        for doc_container in doc.get("containers", {}).values():
            self.put_container(ContainerRecord.from_dict(doc_container))
        self._changed_pods.clear()
        self._changed_containers.clear()
        last = max((gen for gen, _, _ in journal), default=0)
        self._records_gen = max(last, covered) + 1
        self._records_bytes = sum(
            len(line) + 1 for gen, _, lines in journal if gen > covered for line in lines
        )

    # --- persistence -------------------------------------------------------------------------
    async def write_ahead(self, through: int) -> None:
        """Journal every hook state change not journaled yet, unless the disk has every
        change up to `through` already (a call's own last change: `track_changes`); before
        the call that made them is forwarded. On the event loop when the state directory is
        on a local file system (a page-cache append), else from a worker thread.

        Raises StateWriteError (RESOURCE_EXHAUSTED when the disk or quota is full, UNAVAILABLE
        otherwise) when the write fails: the state stays in memory, still marked changed, and
        the background writer retries it. Only a call that changed hook state writes ahead,
        so one failed write fails no call that keeps nothing."""
        if self._journaled >= through:
            return  # an earlier line or compaction took this call's changes along
        async with self._journal_lock:
            if self._journaled >= through:
                return
            try:
                await self._append_journal()
            except _WriteFailed as exc:
                self._failed(exc)
                self.write_behind()
                raise StateWriteError(self.state_dir, exc.error) from exc.error
        self.write_behind()  # the fsync that makes the line durable
        self._wake.set()  # a write-behind waiting to retry: the disk works again

    def write_behind(self) -> None:
        """Persist soon (WRITE_BEHIND_SECONDS, coalesced), off the request path; never raises.
        For what the runtime already did: pod and container records (which can be rebuilt
        from the runtime) and hook state changed after the call was forwarded. A failed
        write is retried with backoff until it succeeds; meanwhile `degraded` says why."""
        if self._closing or self._timer is not None or self._writer is not None:
            return  # a write is coming, and it takes every change along
        if not self._dirty:
            return
        self._timer = asyncio.get_running_loop().call_later(
            WRITE_BEHIND_SECONDS, self._start_writer
        )

    async def flush(self, compact: bool = True) -> None:
        """Persist every change made so far; returns once it is on disk (`compact`: in the
        snapshot files, else as journal lines unless the journals are as large as their
        snapshots; a compaction wanted for its age then follows in the background, with the
        next write-behind). Raises the OSError
        when the state directory refuses the write (the changes stay in memory, still marked
        changed, and the store is degraded until a write succeeds)."""
        async with self._write_lock:
            try:
                await self._write_dirty(compact=compact)
            except _WriteFailed as exc:
                self._failed(exc)
                raise exc.error from None
            self._recovered()

    async def close(self) -> None:
        """Write everything still pending and the status; no background work is left behind.
        Never raises an OSError: a failed last write is logged (the records are rebuilt from
        the runtime at the next start)."""
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._compact_timer is not None:
            self._compact_timer.cancel()
            self._compact_timer = None
        if self._writer is not None:
            self._wake.set()  # a writer waiting to retry gives up; one writing finishes
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
        try:
            await self.flush()
        except OSError:
            log.error(
                "crihook stops with state not written to %s: %s; pods and containers are "
                "rebuilt from the runtime at the next start, hook state changes since the "
                "last successful write are lost",
                self.state_dir,
                self.last_error,
            )
        await self.write_status()
        async with self._journal_lock:
            self._journal_file.close()
        self._records_file.close()

    def status(self) -> dict[str, Any]:
        """The store's part of status.json: whether writes are failing, and since when."""
        return {
            "degraded": self.degraded,
            "degraded_since": self.degraded_since,
            "write_failures": self.write_failures,
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
            "retry_seconds": self.retry_seconds,
            "status_write_failures": self.status_write_failures,
        }

    async def write_status(self) -> None:
        """Rewrite status.json. Never raises an OSError: a failure is counted, and logged once
        when writing starts failing and once when it works again."""
        if self.status_provider is None:
            return
        status = json.dumps(self.status_provider(), sort_keys=True, default=str).encode()
        path = self.state_dir / STATUS_FILE
        try:
            await asyncio.to_thread(write_atomic, path, status, False)
        except OSError as exc:
            self.status_write_failures += 1
            if self._status_error is None:
                log.warning(
                    "cannot write %s: %s; `crihook state` shows the last status written "
                    "until it works again",
                    path,
                    describe(exc),
                )
            self._status_error = describe(exc)
            return
        if self._status_error is not None:
            log.info("%s written again (%d failed writes)", path, self.status_write_failures)
            self._status_error = None

    def _start_writer(self) -> None:
        self._timer = None
        self._writer = asyncio.get_running_loop().create_task(
            self._write_behind(), name="crihook-store-writer"
        )
        self._writer.add_done_callback(self._writer_done)

    async def _write_behind(self) -> None:
        delay = RETRY_FIRST_SECONDS
        while True:
            try:
                async with self._write_lock:
                    await self._write_dirty()
            except _WriteFailed as exc:
                self._failed(exc)
                if self._closing:
                    return  # close() makes the last attempt
                self._wake.clear()
                self.retry_seconds = delay
                try:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), delay)
                finally:
                    self.retry_seconds = None
                delay = min(delay * 2, RETRY_MAX_SECONDS)
                continue
            self._recovered()
            return

    def _writer_done(self, task: asyncio.Task[None]) -> None:
        self._writer = None
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:  # not an OSError: a bug
            log.error("the store writer failed", exc_info=error)
            return
        self.write_behind()  # what changed while it was writing

    async def _write_dirty(self, compact: bool | None = None) -> None:
        """Under the write lock: what changed, appended to the journals, or folded into the
        snapshot files when a compaction is due (`compact`: now; False: not for its age
        this time); the files are written off the event loop (module docstring). On any
        failure what was taken is marked changed again."""
        compact = self._compact_wanted if compact is None else compact
        plan = _Plan()
        planned = 0  # the snapshot's mark for the containers in doubt
        names = self._dirty_hooks
        hooks_due = compact or self._hook_journal_bytes >= sum(self._hook_file_bytes.values())
        seq = 0
        if names and hooks_due:
            async with self._journal_lock:  # no line may land in the file being retired
                await self._append_journal()  # raises before anything is taken
                plan.hooks_covered = self._journal_gen  # the state files now hold all it has
                self._journal_gen += 1
                self._journal_file.close()  # the file is removed once the states are written
                plan.hooks = {n: self._hook_states[n].encoded() for n in names}
                self._hook_journal_bytes = 0
                self._unsynced = None
            self._dirty_hooks = set()
        elif self._unjournaled or self._unsynced is not None:
            async with self._journal_lock:
                await self._append_journal()
            plan.sync = self._unsynced
            seq = self._appended
        # The records last: the hooks' part may raise before it took anything.
        pods, containers = self._changed_pods, self._changed_containers
        if pods or containers or (compact and self._records_bytes):
            line = None
            if not compact:
                line = _records_line(pods, containers, self._pod_json, self._container_json, self)
            if line is None or self._records_bytes + len(line) >= self._snapshot_bytes:
                planned = self.unsettled.planned()
                plan.snapshot = (
                    _fragments(self._pod_json, self.pods),
                    _fragments(self._container_json, self.containers),
                    self._records_gen,
                )
            else:
                plan.records_line = (self.state_dir / records_name(self._records_gen), line)
            self._changed_pods, self._changed_containers = set(), set()
        if plan.empty:
            return
        try:
            await asyncio.to_thread(self._write, plan)
        except BaseException:
            # Nothing is lost: what was taken is marked again and the next write retries it.
            self._changed_pods |= pods
            self._changed_containers |= containers
            self._dirty_hooks |= names if plan.hooks else set()
            if plan.hooks or plan.snapshot is not None:
                self._compact_wanted = True  # the retry compacts what this one took
            raise
        if plan.snapshot is not None:
            self._records_gen += 1
            self._records_bytes = 0
            self._snapshot_bytes = plan.snapshot_bytes
            self.unsettled.written(planned, self.containers.keys())
        elif plan.records_line is not None:
            self._records_bytes += len(plan.records_line[1])
            self._journaled_since_compaction()
        for name, data in plan.hooks.items():
            self._hook_file_bytes[name] = len(data)
        if plan.sync is not None and self._appended == seq:
            self._unsynced = None  # no line came after the one just made durable
        if not self._records_bytes and not self._hook_journal_bytes:
            self._compacted()

    def _write(self, plan: _Plan) -> None:
        """In a worker thread. Hook states first: they cannot be rebuilt, the records can.
        Then the hook journal files up to the one the states now hold; the hook journal's
        lines made durable; the records' line, or their snapshot and the records journal
        files it holds."""
        hooks_dir = self.state_dir / HOOKS_DIR
        for name, data in plan.hooks.items():
            path = hooks_dir / f"{name}.json"
            try:
                hooks_dir.mkdir(mode=STATE_DIR_MODE, parents=True, exist_ok=True)
                write_atomic(path, data)
            except OSError as exc:
                raise _WriteFailed(path, exc) from exc
        if plan.hooks:
            remove_files(journal_files(hooks_dir), plan.hooks_covered)
        if plan.sync is not None:
            try:
                fsync_file(plan.sync)
            except FileNotFoundError:
                pass  # a compaction took it into the state files meanwhile
            except OSError as exc:
                raise _WriteFailed(plan.sync, exc) from exc
        if plan.records_line is not None:
            path, line = plan.records_line
            try:
                self._records_file.append(path, line)
                self._records_file.sync()
            except OSError as exc:
                raise _WriteFailed(path, exc) from exc
            finally:
                self._records_file.close()
        if plan.snapshot is not None:
            pods, containers, covered = plan.snapshot
            data = (
                f'{{"containers": {{{", ".join(containers)}}}, "journal": {covered}, '
                f'"pods": {{{", ".join(pods)}}}, "version": {STORE_VERSION}}}'
            ).encode()
            path = self.state_dir / STORE_FILE
            try:
                write_atomic(path, data)
            except OSError as exc:
                raise _WriteFailed(path, exc) from exc
            plan.snapshot_bytes = len(data)
            remove_files(records_files(self.state_dir), covered)

    def _journaled_since_compaction(self) -> None:
        """A journal line the snapshot files lack: folded into them within COMPACT_SECONDS."""
        if self._uncompacted_since is not None or self._closing:
            return
        self._uncompacted_since = time.monotonic()
        self._compact_timer = asyncio.get_running_loop().call_later(
            COMPACT_SECONDS, self._compact_soon
        )

    def _compact_soon(self) -> None:
        self._compact_timer = None
        self._compact_wanted = True
        self.write_behind()

    def _compacted(self) -> None:
        self._uncompacted_since = None
        self._compact_wanted = False
        if self._compact_timer is not None:
            self._compact_timer.cancel()
            self._compact_timer = None

    def _journal_path(self) -> Path:
        """The current journal file's path (made once per generation: pathlib is slow)."""
        gen = self._journal_gen
        if self._journal_at[0] != gen:
            self._journal_at = (gen, self.state_dir / HOOKS_DIR / journal_name(gen))
        return self._journal_at[1]

    async def _append_journal(self) -> None:
        """Under the journal lock: every hook state change not journaled yet, as one line of
        the current journal file. Raises _WriteFailed (the changes stay unjournaled)."""
        through = self._hook_changes
        taken = self._unjournaled
        if taken:
            entries = ",".join(
                f"{encode_key(name)}:{self._hook_states[name].changes(keys)}"
                for name, keys in sorted(taken.items())
            )
            path = self._journal_path()
            data = f"{{{entries}}}\n".encode()
            self._unjournaled = {}
            try:
                if self.journal_in_thread:
                    await asyncio.to_thread(self._journal_file.append, path, data)
                else:
                    self._journal_file.append(path, data)  # a page-cache append: no thread hop
            except OSError as exc:
                for name, keys in taken.items():  # with whatever changed meanwhile
                    self._unjournaled.setdefault(name, set()).update(keys)
                raise _WriteFailed(path, exc) from exc
            self._hook_journal_bytes += len(data)
            self._unsynced = path
            self._appended += 1
            self._journaled_since_compaction()
        self._journaled = max(self._journaled, through)

    def _failed(self, exc: _WriteFailed) -> None:
        self.write_failures += 1
        self.last_error = exc.reason
        self.last_error_at = time.time()
        if self.degraded is None:
            self.degraded_since = self.last_error_at
            log.error(
                "%s; crihook keeps its state in memory and retries until a write succeeds",
                exc.reason,
            )
        self.degraded = exc.reason

    def _recovered(self) -> None:
        if self.degraded is None:
            return
        since = self.degraded_since or time.time()
        log.warning(
            "state written to %s again, after %.1f s of failed writes (%d so far)",
            self.state_dir,
            time.time() - since,
            self.write_failures,
        )
        self.degraded = None
        self.degraded_since = None

    # --- reconcile with the runtime (proxy/state/reconcile.py) ------------------------------------
    async def reconcile(self, runtime: Runtime) -> tuple[int, int, int]:
        """Drop what the runtime no longer has, rebuild what it has that the disk lacks.
        Returns (kept, rebuilt, dropped) counts over pods and containers."""
        return await reconcile.reconcile(self, runtime)

    async def missing_from(self, runtime: Runtime) -> tuple[list[str], list[str]]:
        """The sandbox and container ids recorded here that the runtime no longer lists
        (reconcile.missing_from)."""
        return await reconcile.missing_from(self, runtime)

    async def reconcile_pod(
        self, runtime: Runtime, pod_uid: str
    ) -> tuple[list[PodRecord], list[ContainerRecord]]:
        """Rebuild what the runtime has of one pod and the store lacks (reconcile.reconcile_pod)."""
        return await reconcile.reconcile_pod(self, runtime, pod_uid)

    async def reconcile_sandbox(
        self, runtime: Runtime, sandbox_id: str
    ) -> tuple[list[PodRecord], list[ContainerRecord]]:
        """As `reconcile_pod`, for one sandbox by id (a pod the runtime restored)."""
        return await reconcile.reconcile_sandbox(self, runtime, sandbox_id)


def _records_line(
    pods: set[str],
    containers: set[str],
    pod_json: dict[str, str | None],
    container_json: dict[str, str | None],
    store: Store,
) -> bytes:
    """A records journal line: the records in `pods` and `containers` whole, or null where
    removed (module docstring of records_journal)."""

    def part(ids: set[str], cache: dict[str, str | None], records: Mapping[str, Any]) -> str:
        out = []
        for key in sorted(ids):
            if key not in cache:
                out.append(f"{encode_key(key)}: null")
                continue
            fragment = cache[key]
            if fragment is None:
                fragment = cache[key] = _fragment(key, records[key].to_dict())
            out.append(fragment)
        return ", ".join(out)

    containers_part = part(containers, container_json, store.containers)
    pods_part = part(pods, pod_json, store.pods)
    return f'{{"containers": {{{containers_part}}}, "pods": {{{pods_part}}}}}\n'.encode()


def _fragments(
    cache: dict[str, str | None], records: Mapping[str, PodRecord] | Mapping[str, ContainerRecord]
) -> list[str]:
    """Every record's JSON fragment, encoding those changed since the last write."""
    out = []
    for key, fragment in cache.items():
        if fragment is None:
            fragment = cache[key] = _fragment(key, records[key].to_dict())
        out.append(fragment)
    return out


def _fragment(key: str, doc: dict[str, Any]) -> str:
    return f"{encode_key(key)}: {encode_value(doc)}"  # the kept C encoder: ~2x json.dumps


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        _set_aside(path, str(exc))
        return None
    if not isinstance(data, dict):
        _set_aside(path, "not a JSON object")
        return None
    return data


def _set_aside(path: Path, why: str) -> None:
    aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
    log.error(
        "state file %s is unusable (%s); moved to %s, rebuilding from the runtime", path, why, aside
    )
    os.replace(path, aside)
