"""Recording: every intercepted call appended to a file as one JSON line, off the request path.

A call only hands its outcome over (a few hundred nanoseconds) and is answered at once.
After it, the event loop pickles what the call handed over, one item per turn of the loop
(between the calls, never inside one), and a sender thread passes it to a renderer process
(`record_worker`), which renders and redacts the line as JSON. Rendering costs a few hundred
microseconds for a large call: on the loop it took that time from the calls, and in a thread
it fought the loop for the GIL. A writer thread takes the rendered lines back and writes
them, in batches. Nothing is fsynced: a recording is a diagnostic, not state.

The file is bounded: past `max_bytes` it is rotated (FILE → FILE.1 → ... → FILE.<keep>), and
the new file starts with a header and a snapshot of what the hooks hold, taken on the loop
while no call is in flight, so every file replays on its own.

A disk that fails (full, gone, read-only) never fails a CRI call: lines are dropped and
counted (`crihook state`), the failure is logged when it starts and when it ends. A file
never goes on past a hole as if nothing were missing: once a line is lost, the writer drops
every line until it can write a `gap` line, a new header and a snapshot (asked for at most
once a second), from which a replay starts afresh. A renderer that dies loses the lines it
held in the same way (counted, followed by a gap); the next line starts a new one. See
`record_format` for the lines.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import pickle
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from crihook.hooks.node import HostFiles
from crihook.proxy.config import RecordSettings, Settings
from crihook.proxy.observe import Observation, ObservedFiles, begin, end
from crihook.proxy.outcome import Outcome, Status
from crihook.proxy.record_format import encode_line
from crihook.proxy.record_worker import dumps, read_frame, write_frame
from crihook.proxy.redact import Redactor

__all__ = ["MAX_PENDING", "Recorder", "device_pool_facts"]

log = logging.getLogger(__name__)

MAX_PENDING = 10_000
"""Lines waiting for the renderer; past this (a renderer or a disk far slower than the
calls) they are dropped and counted, so memory stays bounded."""
GATHER_SECONDS = 0.02
"""The writer waits this long after a line arrives, so lines are written in batches."""
RESUME_SECONDS = 1.0
"""After lost lines, how often the writer asks for a snapshot to resume from."""
STOP_SECONDS = 60
"""At close, how long the renderer may take to answer what it holds."""
_BATCH = 256
_STOP = object()
Line = dict[str, Any]


class Recorder:
    """Appends lines to `settings.file` from a writer thread.

    `header()` builds the header line (called at start and at each rotation, on the loop);
    `snapshot()` the snapshot line a rotated file starts with; `quiesced()` holds new calls
    back while it is taken; `next_seq()` numbers it among the calls."""

    def __init__(
        self,
        settings: RecordSettings,
        header: Callable[[], Line],
        snapshot: Callable[[int], Line],
        quiesced: Callable[[], AbstractAsyncContextManager[None]],
        next_seq: Callable[[], int],
    ) -> None:
        if settings.file is None:
            raise ValueError("a Recorder needs [record] file")
        self.settings = settings
        self.path: Path = settings.file
        self.redactor = Redactor(
            settings.redact_annotations, settings.redact_values, enabled=not settings.secrets
        )
        self._header = header
        self._snapshot = snapshot
        self._quiesced = quiesced
        self._next_seq = next_seq
        self._pending: collections.deque[Any] = collections.deque()
        """What calls handed over, not rendered yet (on the loop)."""
        self._encoding = False
        self._outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        """Pickled items, for the sender thread (to the renderer)."""
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        """Rendered lines, for the writer thread."""
        self._thread: threading.Thread | None = None
        self._sender: threading.Thread | None = None
        self._worker: _Worker | None = None
        self._redaction = dumps(
            (settings.redact_annotations, settings.redact_values, not settings.secrets)
        )
        self._fd: int | None = None
        self._size = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._rotation: asyncio.Task[None] | None = None
        self._part_asked = False
        """The writer asked the loop for a new part (a header and a snapshot)."""
        self.lines = 0
        self.bytes = 0
        self.dropped = 0
        self.write_failures = 0
        self.encode_failures = 0
        self.rotations = 0
        self.cpu_seconds = 0.0
        """Time the loop spent pickling items for the renderer."""
        self.renderer_restarts = 0
        self.last_error: str | None = None
        self.failing_since: float | None = None
        self._lost = 0
        """Lines dropped since the file was last whole: the gap line says how many."""
        self._resuming = True
        """Lines are dropped until a header and a snapshot are written (at start: the
        header comes first, and the first synchronize follows it)."""
        self._overflowed = False
        self._asked_at = -RESUME_SECONDS

    # --- the loop's side -------------------------------------------------------------------
    def start(self) -> None:
        """Open the writer and write the header; never raises for the disk (counted)."""
        self._loop = asyncio.get_running_loop()
        self._put(("header", self._header()))
        self._thread = threading.Thread(target=self._run, name="crihook-recorder", daemon=True)
        self._thread.start()
        self._sender = threading.Thread(
            target=self._send, name="crihook-recorder-send", daemon=True
        )
        self._sender.start()

    def call(self, outcome: Outcome) -> None:
        """One intercepted call's outcome (the pipeline's `on_outcome`)."""
        self._put(("call", outcome))

    def passthrough(
        self,
        path: str,
        request: bytes,
        response: bytes | None,
        status: Status | None,
        started: float,
    ) -> None:
        """A unary call forwarded as bytes (`--record-all`)."""
        self._put(("passthrough", (self._next_seq(), path, request, response, status, started)))

    def line(self, line: Line) -> None:
        """A line built elsewhere (sync, passthrough); values must not change afterwards."""
        self._put(("line", line))

    def _put(self, item: Any) -> None:
        if self.backlog() >= MAX_PENDING:
            self.dropped += 1
            self._overflowed = True  # the writer resumes from a snapshot
            return
        self._pending.append(item)
        if not self._encoding and self._loop is not None:
            self._encoding = True
            self._loop.call_soon(self._encode_next)

    def _encode_next(self) -> None:
        """Render one line and hand it to the writer; the next one at the loop's next turn."""
        self._encoding = False
        if self._pending:
            self._outbox.put(self._pickled(self._pending.popleft()))
        if self._pending and not self._encoding:
            self._encoding = True
            asyncio.get_running_loop().call_soon(self._encode_next)

    def _pickled(self, item: Any) -> bytes:
        """One item as the renderer takes it. (What cannot be pickled is a bug: the call
        went through, its line is lost and counted, in order with the others.)"""
        started = time.perf_counter()
        try:
            frame = dumps(item)
        except Exception:
            self.encode_failures += 1
            if self.encode_failures == 1:
                log.exception("recording: a %s line could not be encoded (counted)", item[0])
            frame = dumps(("lost", None))
        self.cpu_seconds += time.perf_counter() - started
        return frame

    def _start_part(self) -> None:
        """On the loop, when the writer asks: take a snapshot while no call is in flight."""
        if self._rotation is None and self._thread is not None:
            self._rotation = asyncio.get_running_loop().create_task(
                self._new_part_lines(), name="crihook-recorder-part"
            )

    async def _new_part_lines(self) -> None:
        try:
            async with self._quiesced():  # no call in flight: the snapshot is a resting state
                self._put(("part", (self._header(), self._snapshot(self._next_seq()))))
        finally:
            self._rotation = None

    async def close(self) -> None:
        """Write what is queued and stop the writer. (A new part asked for is still
        written: no call is in flight any more, the snapshot is taken at once.)"""
        if self._rotation is not None:
            await asyncio.gather(self._rotation, return_exceptions=True)
        if self._thread is None:
            return
        while self._pending:
            self._outbox.put(self._pickled(self._pending.popleft()))
        self._outbox.put(_STOP)
        if self._sender is not None:
            await asyncio.to_thread(self._sender.join)
            self._sender = None
        await asyncio.to_thread(self._thread.join)
        self._thread = None

    def backlog(self) -> int:
        """Items handed over and neither written nor dropped yet."""
        worker = self._worker
        in_worker = worker.sent - worker.answered if worker is not None else 0
        return len(self._pending) + self._outbox.qsize() + in_worker + self._queue.qsize()

    def status(self) -> dict[str, Any]:
        """For status.json and `crihook state`."""
        return {
            "file": str(self.path),
            "lines": self.lines,
            "bytes": self.bytes,
            "dropped": self.dropped,
            "write_failures": self.write_failures,
            "encode_failures": self.encode_failures,
            "rotations": self.rotations,
            "renderer_restarts": self.renderer_restarts,
            "encode_cpu_us_per_line": round(self.cpu_seconds / max(self.lines, 1) * 1e6, 1),
            "last_error": self.last_error,
            "failing_since": self.failing_since,
            "redacted": self.redactor.enabled,
        }

    # --- the sender thread and the renderer ------------------------------------------------
    def _send(self) -> None:
        """Pass the pickled items to the renderer, in order; start one when there is none."""
        while (frame := self._outbox.get()) is not _STOP:
            for _attempt in range(2):  # a renderer that died is replaced once per item
                worker = self._worker if self._worker is not None else self._start_worker()
                if worker is None:
                    break
                try:
                    assert worker.proc.stdin is not None
                    write_frame(worker.proc.stdin, frame)
                    worker.proc.stdin.flush()
                except OSError:
                    self._worker_gone(worker)
                    continue
                worker.sent += 1
                break
            else:
                worker = None
            if worker is None:  # not delivered
                self._queue.put(("lost", 1))
        if self._worker is None:
            self._queue.put(_STOP)
        else:
            self._stop_worker(self._worker)

    def _start_worker(self) -> _Worker | None:
        argv = [sys.executable, "-m", "crihook.proxy.record_worker"]
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            assert proc.stdin is not None
            write_frame(proc.stdin, self._redaction)
        except OSError as exc:
            log.error("recording: cannot start the renderer (%s); lines are dropped", exc)
            return None
        worker = _Worker(proc)
        worker.reader = threading.Thread(
            target=self._receive, args=(worker,), name="crihook-recorder-receive", daemon=True
        )
        worker.reader.start()
        self._worker = worker
        return worker

    def _worker_gone(self, worker: _Worker) -> None:
        """The renderer died: what it held is lost (its reader says how much)."""
        worker.reader.join()
        with contextlib.suppress(OSError):
            assert worker.proc.stdin is not None
            worker.proc.stdin.close()
        worker.proc.wait()
        self._worker = None
        self.renderer_restarts += 1

    def _stop_worker(self, worker: _Worker) -> None:
        worker.closing = True
        with contextlib.suppress(OSError):
            assert worker.proc.stdin is not None
            worker.proc.stdin.close()  # EOF: it answers what it read, then exits
        worker.reader.join(timeout=STOP_SECONDS)
        if worker.reader.is_alive():  # stuck: what it still holds is lost (and counted)
            log.error("recording: the renderer did not finish in %d s; killed", STOP_SECONDS)
            worker.proc.kill()
            worker.reader.join()
        worker.proc.wait()
        self._worker = None

    def _receive(self, worker: _Worker) -> None:
        """The renderer's answers, to the writer, in order; at its end, what it never
        answered is counted lost (and the writer is stopped, after the last one)."""
        assert worker.proc.stdout is not None
        while (frame := read_frame(worker.proc.stdout)) is not None:
            kind, encoded = pickle.loads(frame)
            worker.answered += 1
            if encoded is None and kind != "lost":  # ("lost": counted when it was pickled)
                self.encode_failures += 1
            self._queue.put((kind if kind in ("header", "part") else "line", encoded))
        worker.proc.stdout.close()
        lost = worker.sent - worker.answered
        worker.answered = worker.sent  # accounted for, below
        if not worker.closing:
            code = worker.proc.wait()
            log.error("recording: the renderer exited (status %s); %d line(s) lost", code, lost)
        if lost:
            self._queue.put(("lost", lost))
        if worker.closing:
            self._queue.put(_STOP)

    # --- the writer thread -----------------------------------------------------------------
    def _run(self) -> None:
        stop = False
        while not stop:
            batch = [self._queue.get()]
            # Let lines gather: one write (and one wake-up) per batch rather than per call.
            time.sleep(GATHER_SECONDS)
            while len(batch) < _BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if self._overflowed:
                self._overflowed = False
                self._lose(0)
            out: list[bytes] = []
            for item in batch:
                if item is _STOP:
                    stop = True
                    continue
                kind, encoded = item
                if kind == "lost":  # items the renderer did not answer (it died)
                    self._lose(encoded)
                elif kind == "header":  # the first line of this process's part
                    self._resuming = not self._write([encoded])
                elif kind == "part":
                    self._write(out)
                    out = []
                    self._new_part(*encoded)
                elif encoded is None or self._resuming:
                    self._lose(1)
                else:
                    out.append(encoded)
            self._write(out)
        self._close_file(sync=True)

    def _write(self, lines: list[bytes]) -> bool:
        if not lines:
            return True
        data = b"".join(lines)
        try:
            if self._fd is None:
                self._open()
            assert self._fd is not None
            _append(self._fd, data)
        except OSError as exc:
            self._failed(exc, len(lines))
            return False
        self.lines += len(lines)
        self.bytes += len(data)
        self._size += len(data)
        if self._size > self.settings.max_bytes:
            self._ask_for_part()
        return True

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        self._fd = os.open(self.path, flags, 0o640)
        self._size = os.fstat(self._fd).st_size

    def _failed(self, exc: OSError, count: int) -> None:
        self.write_failures += 1
        self.last_error = f"{self.path}: {exc.strerror or exc}"
        if self.failing_since is None:
            self.failing_since = time.time()
            log.error(
                "recording: cannot write %s; calls go on unrecorded (dropped lines are "
                "counted in `crihook state`)",
                self.last_error,
            )
        self._close_file(sync=False)
        self._lose(count)

    def _lose(self, count: int) -> None:
        """Lines that will not be in the file: drop everything until a snapshot is written."""
        self.dropped += count
        self._lost += count
        self._resuming = True
        now = time.monotonic()
        if now - self._asked_at >= RESUME_SECONDS:
            self._asked_at = now
            self._part_asked = False  # the last ask went unanswered (the disk still failed)
            self._ask_for_part()

    def _ask_for_part(self) -> None:
        """Ask the loop (once until it answers) for a header and a snapshot to start a new
        part from."""
        if self._part_asked or self._loop is None:
            return
        self._part_asked = True
        with contextlib.suppress(RuntimeError):  # the loop is closing: nothing to resume
            self._loop.call_soon_threadsafe(self._start_part)

    def _new_part(self, header: bytes, snapshot: bytes) -> None:
        """Start a new part of the recording: after lost lines, appended to the file behind
        a gap line; past max_bytes, in a new file once the old ones moved up."""
        self._part_asked = False
        lines = [header, snapshot]
        if self._resuming:
            try:
                if self._fd is None:
                    self._open()
            except OSError as exc:
                self._failed(exc, 0)
                return
            if self._lost and self._size:  # the end of the part the lines are missing from
                gap = {"kind": "gap", "time": time.time(), "dropped": self._lost}
                lines.insert(0, encode_line(gap))
        elif self._size > self.settings.max_bytes:
            self._rotate_files()
        else:
            return  # nothing to start anew
        if not self._write(lines):
            return
        if self._resuming and self.failing_since is not None:
            log.warning(
                "recording to %s works again after %.1f s (%d line(s) lost in all)",
                self.path,
                time.time() - self.failing_since,
                self.dropped,
            )
        self.failing_since = None
        self._resuming = False
        self._lost = 0

    def _rotate_files(self) -> None:
        self._close_file(sync=False)
        keep = self.settings.keep
        try:
            for index in range(keep - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{index}")
                if older.exists():
                    os.replace(older, self.path.with_name(f"{self.path.name}.{index + 1}"))
            if self.path.exists():
                os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        except OSError as exc:
            self.last_error = f"{self.path}: rotating: {exc.strerror or exc}"
            log.error("recording: %s; the file keeps growing", self.last_error)
            return
        self.rotations += 1

    def _close_file(self, sync: bool) -> None:
        if self._fd is None:
            return
        try:
            if sync:  # at shutdown only, never on the request path
                os.fsync(self._fd)
        except OSError as exc:
            self.last_error = f"{self.path}: {exc.strerror or exc}"
        finally:
            os.close(self._fd)
            self._fd = None


def _append(fd: int, data: bytes) -> None:
    """Write all of `data` at the end of the file, or none of it: after a failed or short
    write the file is cut back, so it stays readable to its last whole line."""
    start = os.lseek(fd, 0, os.SEEK_END)
    view = memoryview(data)
    try:
        while view:
            written = os.write(fd, view)
            view = view[written:]
    except OSError:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, start)
        raise


def device_pool_facts(
    settings: Settings, files: HostFiles
) -> tuple[list[dict[str, Any]], list[Observation]]:
    """The built-in devices hook's pools (from its settings) and what the host's files say
    of every path in them: node facts for a recording's header. ([], []) without it."""
    from crihook.hooks.devices.policy import parse_policy  # only when the hook is configured

    pools: list[dict[str, Any]] = []
    observed, token = begin()
    try:
        for hook in settings.chain.hooks:
            if hook.base_name != "devices" or hook.module is not None:
                continue
            policy = parse_policy(hook.options)
            seen = ObservedFiles(files)
            for pool in policy.pools.values():
                for device in pool.devices:
                    entry = {"pool": pool.name, "id": device.id, "numa": device.numa}
                    pools.append({**entry, "paths": list(device.paths)})
                    for path in device.paths:
                        with contextlib.suppress(OSError):
                            seen.device(seen.resolve(path))
    finally:
        end(token)
    return pools, observed


class _Worker:
    """A renderer process and how far it got."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.reader: threading.Thread
        self.sent = 0
        self.answered = 0
        self.closing = False
