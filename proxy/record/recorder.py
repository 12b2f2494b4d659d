"""Recording: every intercepted call appended to a file as one JSON line, off the request path.

A call only hands its outcome over (a few hundred nanoseconds) and is answered at once.
After it, the event loop cuts the outcome down to a `CallRecord` of plain values and pickles
it (about ten microseconds), one item per turn of the loop (between the calls, never inside
one), and writes it to the pipe of a renderer process (`record_worker`; a non-blocking write:
what the pipe does not take waits in the loop's transport buffer). The renderer renders,
redacts and writes the lines (`record_file`: batches, rotation, gaps) at the lowest CPU
priority, so that it takes only CPU that crihook and the runtime leave idle. Nothing is
fsynced on the way: a recording is a diagnostic, not state. crihook runs no thread for it.

The renderer answers each batch it wrote with its counters, and asks (through the same
answers) for a new part when the file is rotated or must resume after lost lines: the loop
then takes a snapshot of what the hooks hold while no call is in flight.

The backlog is bounded: when the renderer falls behind (a saturated node gives it no CPU, a
slow disk, a stopped process), past `MAX_PENDING` items not written yet, or `MAX_BUFFERED`
bytes waiting in crihook, lines are dropped and counted, and the renderer is told: the file
shows a `gap` line and goes on from a new header and snapshot once it has caught up. A
renderer that dies loses the lines it held in the same way (counted, followed by a gap), and
a new one is started. A failing disk is handled in the renderer the same way. None of it ever
fails a CRI call. See `record_format` for the lines.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import pickle
import sys
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, cast

from crihook.hooks.builtin import BUILTIN_HOOKS
from crihook.hooks.node import HostFiles
from crihook.proxy.config import RecordSettings, Settings
from crihook.proxy.core.observe import ObservedFiles, begin, end
from crihook.proxy.cri.outcome import Observation, Outcome, Status
from crihook.proxy.record.file import RESUME_SECONDS
from crihook.proxy.record.lines import call_record
from crihook.proxy.record.redact import Redactor
from crihook.proxy.record.worker import dumps, frame, split_frames

__all__ = ["MAX_BUFFERED", "MAX_PENDING", "RESUME_SECONDS", "Recorder", "device_pool_facts"]

# A pinned name, not the module path: the renderer's lines are logged again under it.
log = logging.getLogger("crihook.proxy.record")

MAX_PENDING = 10_000
"""Items handed over and not written yet; past this they are dropped and counted."""
MAX_BUFFERED = 16 << 20
"""Bytes waiting in crihook for the renderer's pipe; past this items are dropped and
counted, so crihook's memory stays bounded when the renderer gets no CPU."""
FLUSH_SECONDS = 0.01
"""Frames are written to the renderer's pipe together, this often: one write (and at most
one wake-up of the renderer) for the calls of 10 ms, not one per call."""
STOP_SECONDS = 60
"""At close, how long the renderer may take to write what it holds."""
Line = dict[str, Any]
_Weight = tuple[int, int]
"""What a frame stands for, were it lost: lines to count as dropped, and lines to tell the
next renderer of (for its gap line)."""
_ONE_LINE: _Weight = (1, 1)
_NO_LINE: _Weight = (0, 0)


def _told(count: int) -> _Weight:
    return (0, count)  # counted already


_ALWAYS = ("header", "part")
"""Items queued past the bound: without them the file cannot resume."""
_COUNTERS = ("lines", "bytes", "dropped", "write_failures", "rotations", "encode_failures")


class Recorder:
    """Has `settings.file` written by a renderer process.

    At most `max_pending` items wait for it (`max_buffered` bytes of them in crihook);
    past that, lines are dropped and counted (a header or a new part never is).

    `header()` builds the header line (called at start and for each new part, on the loop);
    `snapshot()` the snapshot line a new part starts with; `quiesced()` holds new calls
    back while it is taken; `next_seq()` numbers it among the calls."""

    def __init__(
        self,
        settings: RecordSettings,
        header: Callable[[], Line],
        snapshot: Callable[[int], Line],
        quiesced: Callable[[], AbstractAsyncContextManager[None]],
        next_seq: Callable[[], int],
        max_pending: int = MAX_PENDING,
        max_buffered: int = MAX_BUFFERED,
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
        self._max_pending = max_pending
        self._max_buffered = max_buffered
        self._items: collections.deque[Any] = collections.deque()
        """What calls handed over, not encoded yet."""
        self._encoding = False
        self._waiting: collections.deque[tuple[bytes, _Weight]] = collections.deque()
        """Encoded frames (and what each stands for) while no renderer is running."""
        self._whole = False
        """The file is whole up to the last line the last renderer wrote: a new one goes on
        in the same part (at start, the header comes first)."""
        self._worker: _Worker | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._rotation: asyncio.Task[None] | None = None
        self._closing = False
        self._untold = 0
        """Lines lost here that the renderer has not been told of yet (for its gap line)."""
        self._dropped = 0
        """Lines lost here: past the bound, or held by a renderer that died."""
        self._done: dict[str, Any] = dict.fromkeys(_COUNTERS, 0)
        """The counters of renderers that ended."""
        self._stats: dict[str, Any] = {}
        """The running renderer's last counters."""
        self.encode_failures = 0
        self.cpu_seconds = 0.0
        """Time the loop spent encoding items for the renderer."""
        self.renderer_restarts = 0

    # --- the loop's side -------------------------------------------------------------------
    def start(self) -> None:
        """Queue the header and start the renderer; never raises for the disk (counted)."""
        self._loop = asyncio.get_running_loop()
        self._put(("header", self._header()))

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
        if item[0] not in _ALWAYS and self._behind():
            self._lost(1)
            return
        self._items.append(item)
        if not self._encoding and self._loop is not None:
            self._encoding = True
            self._loop.call_soon(self._encode_next)

    def _behind(self) -> bool:
        """The backlog is at its bound: the renderer fell behind."""
        worker = self._worker
        return self.backlog() >= self._max_pending or (
            worker is not None and worker.buffered() > self._max_buffered
        )

    def _lost(self, count: int) -> None:
        self._dropped += count
        self._untold += count

    def _encode_next(self) -> None:
        """Encode one item and send it; the next one at the loop's next turn."""
        self._encoding = False
        if self._items:
            self._send(*self._encoded(self._items.popleft()))
        if self._items and not self._encoding:
            self._encoding = True
            asyncio.get_running_loop().call_soon(self._encode_next)

    def _encoded(self, item: Any) -> tuple[bytes, _Weight]:
        """One item as the renderer takes it, and what it stands for. (What cannot be
        pickled is a bug: the call went through, its line is lost and counted, in order
        with the others.)"""
        started = time.perf_counter()
        kind, payload = item
        try:
            if kind == "call":
                payload = tuple(call_record(payload))
            encoded = frame(dumps((kind, payload)))
        except Exception:
            self.encode_failures += 1
            if self.encode_failures == 1:
                log.exception("recording: a %s line could not be encoded (counted)", kind)
            self._dropped += 1
            self.cpu_seconds += time.perf_counter() - started
            return frame(dumps(("lost", 1))), _told(1)
        self.cpu_seconds += time.perf_counter() - started
        return encoded, _NO_LINE if kind == "part" else _ONE_LINE

    def _send(self, encoded: bytes, weight: _Weight) -> None:
        worker = self._worker
        if worker is None or not worker.running():
            self._waiting.append((encoded, weight))
            if worker is None and not self._closing:
                self._start_worker()
            return
        self._tell(worker)
        worker.send(encoded, weight)

    def _tell(self, worker: _Worker) -> None:
        """The lines lost here since the renderer was last told (for its gap line)."""
        if self._untold:
            worker.send(frame(dumps(("lost", self._untold))), _told(self._untold))
            self._untold = 0

    def _start_worker(self) -> None:
        assert self._loop is not None
        worker = _Worker(self)
        self._worker = worker
        worker.task = self._loop.create_task(worker.start(), name="crihook-recorder-renderer")

    def _settings_frame(self) -> bytes:
        settings = self.settings
        return frame(
            dumps(
                (
                    settings.redact_annotations,
                    settings.redact_values,
                    not settings.secrets,
                    str(settings.file),
                    settings.max_bytes,
                    settings.keep,
                    self._whole,
                )
            )
        )

    def _started(self, worker: _Worker) -> None:
        """The renderer runs: what waited for it goes now."""
        while self._waiting and self._worker is worker:
            self._send(*self._waiting.popleft())
        if self._worker is worker and worker.running():
            self._tell(worker)

    def _not_started(self, worker: _Worker, exc: OSError) -> None:
        log.error("recording: cannot start the renderer (%s); lines are dropped", exc)
        self._worker = None
        for _, (lines, untold) in self._waiting:
            self._dropped += lines
            self._untold += untold
        self._waiting.clear()

    def _answered(self, worker: _Worker, taken: int, stats: dict[str, Any], ask: bool) -> None:
        """The renderer wrote a batch (and, with `ask`, wants a new part)."""
        worker.taken(taken)
        self._stats = stats
        if ask and not self._closing:
            self._start_part()
        if self._untold and worker.running():  # it caught up: it marks the gap and resumes
            self._tell(worker)

    def _gone(self, worker: _Worker) -> None:
        """The renderer ended: what it held unwritten is lost (when it was not asked to end,
        a new one is started for what comes next)."""
        lost, untold = worker.unanswered()
        self._whole = self._stats.get("resuming") is False
        for key in _COUNTERS:
            self._done[key] += self._stats.get(key, 0)
        self._done["last_error"] = self._stats.get("last_error", self._done.get("last_error"))
        self._stats = {}
        if self._worker is worker:
            self._worker = None
        if not worker.closing:
            log.error(
                "recording: the renderer exited (status %s); %d line(s) lost",
                worker.returncode,
                lost,
            )
            self.renderer_restarts += 1
        self._dropped += lost
        self._untold += untold
        if not self._closing and worker.answered_once and (self._untold or self._waiting):
            self._start_worker()  # (one that never answered is replaced at the next line)

    def _start_part(self) -> None:
        """On the loop, when the renderer asks: take a snapshot while no call is in flight."""
        if self._rotation is None and self._loop is not None:
            self._rotation = self._loop.create_task(
                self._new_part_lines(), name="crihook-recorder-part"
            )

    async def _new_part_lines(self) -> None:
        try:
            async with self._quiesced():  # no call in flight: the snapshot is a resting state
                self._put(("part", (self._header(), self._snapshot(self._next_seq()))))
        finally:
            self._rotation = None

    async def close(self) -> None:
        """Write what is queued and stop the renderer. (A new part asked for is still
        written: no call is in flight any more, the snapshot is taken at once.)"""
        if self._rotation is not None:
            await asyncio.gather(self._rotation, return_exceptions=True)
        if self._loop is None:
            return
        while self._items:
            self._send(*self._encoded(self._items.popleft()))
        worker = self._worker
        if worker is None and (self._waiting or self._untold):
            self._start_worker()
            worker = self._worker
        self._closing = True
        if worker is None:
            return
        assert worker.task is not None
        await worker.task
        if worker.running():
            self._tell(worker)
        await worker.stop()
        for _, (lines, _untold) in self._waiting:  # a renderer that died as crihook stopped
            self._dropped += lines
        self._waiting.clear()
        self._loop = None

    def backlog(self) -> int:
        """Items handed over and neither written nor dropped yet."""
        worker = self._worker
        unanswered = worker.unanswered_frames() if worker is not None else 0
        return len(self._items) + len(self._waiting) + unanswered

    def status(self) -> dict[str, Any]:
        """For status.json and `crihook state`."""
        counts = {key: self._done[key] + self._stats.get(key, 0) for key in _COUNTERS}
        lines = counts["lines"]
        return {
            "file": str(self.path),
            "lines": lines,
            "bytes": counts["bytes"],
            "dropped": counts["dropped"] + self._dropped,
            "write_failures": counts["write_failures"],
            "encode_failures": counts["encode_failures"] + self.encode_failures,
            "rotations": counts["rotations"],
            "renderer_restarts": self.renderer_restarts,
            "backlog": self.backlog(),
            "encode_cpu_us_per_line": round(self.cpu_seconds / max(lines, 1) * 1e6, 1),
            "last_error": self._stats.get("last_error", self._done.get("last_error")),
            "failing_since": self._stats.get("failing_since"),
            "redacted": self.redactor.enabled,
        }


def device_pool_facts(
    settings: Settings, files: HostFiles
) -> tuple[list[dict[str, Any]], list[Observation]]:
    """The device pools of the built-in hooks that have them (from their settings, through
    the registry's `facts` readers, in chain order) and what the host's files say of every
    path in them: node facts for a recording's header. ([], []) without such a hook."""
    pools: list[dict[str, Any]] = []
    observed, token = begin()
    try:
        for hook in settings.chain.hooks:
            builtin = BUILTIN_HOOKS.get(hook.base_name)
            if builtin is None or hook.module is not None:
                continue
            facts = builtin.header_facts()  # imported only when the hook is configured
            if facts is not None:
                pools.extend(facts(hook.options, ObservedFiles(files)))
    finally:
        end(token)
    return pools, observed


class _Worker(asyncio.SubprocessProtocol):
    """A renderer process, what was sent to it and what it answered."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.task: asyncio.Task[None] | None = None
        self.transport: asyncio.SubprocessTransport | None = None
        self.stdin: asyncio.WriteTransport | None = None
        self.returncode: int | None = None
        self.closing = False
        self.answered_once = False
        self._sent: collections.deque[_Weight] = collections.deque()
        """Per frame sent and not answered: what it stands for."""
        self._out: list[bytes] = []
        """Frames to write at the next flush."""
        self._out_bytes = 0
        self._flush: asyncio.TimerHandle | None = None
        self._input = bytearray()
        self._exited = False
        self._stdout_closed = False
        self._ended: asyncio.Future[None] | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._ended = loop.create_future()
        argv = [sys.executable, "-m", "crihook.proxy.record.worker"]
        try:
            transport, _ = await loop.subprocess_exec(
                lambda: self,
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=None,  # its log lines go where crihook's go
            )
        except OSError as exc:
            self._ended.set_result(None)
            self.recorder._not_started(self, exc)
            return
        # (uvloop's pipe transports do not derive from asyncio's classes)
        stdin = cast("asyncio.WriteTransport", transport.get_pipe_transport(0))
        stdin.write(self.recorder._settings_frame())
        self.transport, self.stdin = transport, stdin
        self.recorder._started(self)

    def running(self) -> bool:
        """Started and not ending: frames can be sent."""
        return self.stdin is not None and not self.stdin.is_closing()

    def send(self, encoded: bytes, weight: _Weight) -> None:
        self._out.append(encoded)
        self._out_bytes += len(encoded)
        self._sent.append(weight)
        if self._flush is None:
            loop = asyncio.get_running_loop()
            self._flush = loop.call_at(loop.time() + FLUSH_SECONDS, self.flush)

    def flush(self) -> None:
        """Write the frames sent since the last flush."""
        self._flush = None
        if self._out and self.stdin is not None and not self.stdin.is_closing():
            # Never blocks: what the pipe does not take waits in the transport's buffer.
            self.stdin.write(b"".join(self._out))
        self._out.clear()
        self._out_bytes = 0

    def buffered(self) -> int:
        """Bytes sent and not taken by the pipe yet."""
        if self.stdin is None:
            return self._out_bytes
        return self._out_bytes + self.stdin.get_write_buffer_size()

    def taken(self, count: int) -> None:
        self.answered_once = True
        for _ in range(min(count, len(self._sent))):
            self._sent.popleft()

    def unanswered(self) -> _Weight:
        """What the frames sent and not answered stand for."""
        return sum(w[0] for w in self._sent), sum(w[1] for w in self._sent)

    def unanswered_frames(self) -> int:
        return len(self._sent)

    async def stop(self) -> None:
        """EOF: it writes what it read, then exits (killed if it is stuck)."""
        self.closing = True
        assert self._ended is not None
        if self._flush is not None:
            self._flush.cancel()
        self.flush()
        if self.stdin is not None:
            with contextlib.suppress(OSError):
                self.stdin.close()  # after what is buffered
        try:
            await asyncio.wait_for(asyncio.shield(self._ended), STOP_SECONDS)
        except TimeoutError:  # stuck: what it still holds is lost (and counted)
            log.error("recording: the renderer did not finish in %d s; killed", STOP_SECONDS)
            assert self.transport is not None
            self.transport.kill()
            await self._ended

    # --- asyncio.SubprocessProtocol --------------------------------------------------------
    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        assert fd == 1 and isinstance(data, bytes)
        self._input += data
        for payload in split_frames(self._input, 1 << 30):
            taken, stats, ask, logs = pickle.loads(payload)
            for level, message in logs:  # the renderer's log lines, as crihook's own
                log.log(level, "%s", message)
            self.recorder._answered(self, taken, stats, ask)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd == 1:
            self._stdout_closed = True
            self._end()

    def process_exited(self) -> None:
        self._exited = True
        self._end()

    def _end(self) -> None:
        if not (self._exited and self._stdout_closed) or self._ended is None:
            return
        if self._ended.done():
            return
        assert self.transport is not None
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        self.returncode = self.transport.get_returncode()
        self.transport.close()
        self._ended.set_result(None)
        self.recorder._gone(self)
