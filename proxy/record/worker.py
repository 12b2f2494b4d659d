"""The recording's renderer and writer, in a process of its own: call records in, the file out.

Rendering a call as readable JSON (and redacting it) costs a few hundred microseconds of
Python for a large CreateContainer. Done on crihook's event loop it took that time from the
calls; done in a thread it fought the loop for the GIL. So the loop only pickles a small
`CallRecord` of each call (about ten microseconds) and writes it to this process's stdin, and
this process, started by the `Recorder`, does the rest: it renders, redacts and writes the
lines (`record_file`), at the lowest CPU priority (SCHED_IDLE), so that on a busy node it
takes only CPU that crihook and the runtime leave idle:

    python -m crihook.proxy.record.worker      # stdin: frames in, stdout: frames out

A frame is a 4-byte big-endian length and a pickle. The first frame in is the settings
(redaction, file, bound, and whether the file is whole: a renderer started after one that
ended goes on in the same part when nothing was lost); every later one is `(kind,
payload)` as the Recorder queued it: `header`, `call` (a CallRecord, as a plain tuple),
`passthrough`, `line`, `part` (a header and a snapshot) or `lost` (how many lines crihook
lost). After each batch written, it answers one frame `(taken, stats, ask, logs)`: how many
frames it took, its counters (`RecordFile.stats`, and `encode_failures`), whether it wants a
new part, and what it logged (level, message), which crihook logs as its own (in its format,
to its destination). EOF on stdin ends the process once everything read is written (and
fsynced).
"""

from __future__ import annotations

import contextlib
import copyreg
import fcntl
import io
import logging
import os
import pickle
import select
import signal
import struct
import sys
import time
import types
from pathlib import Path
from typing import IO, Any

__all__ = ["GATHER_SECONDS", "dumps", "encode_item", "main", "read_frame", "write_frame"]

log = logging.getLogger("crihook.proxy.record.worker")

GATHER_SECONDS = 0.02
"""After the first frame of a batch, how long to let more arrive: one write (and one answer
to crihook) per batch rather than per call."""
_BATCH = 256
_CHUNK = 1 << 20
_PIPE_BYTES = 1 << 20
"""The pipe from crihook is grown to this (when the system allows): crihook's writes then
seldom wait in its own buffer."""
_LENGTH = struct.Struct(">I")


def _mapping_proxy(values: dict[Any, Any]) -> types.MappingProxyType[Any, Any]:
    return types.MappingProxyType(values)


class _Pickler(pickle.Pickler):
    # Views hand hooks read-only mappings; pickle them as the dicts they wrap.
    dispatch_table = copyreg.dispatch_table.copy()
    dispatch_table[types.MappingProxyType] = lambda m: (_mapping_proxy, (dict(m),))


def dumps(value: Any) -> bytes:
    """`value` pickled, read-only mappings included. (The plain pickler first: it is twice
    as fast, and most values hold no read-only mapping.)"""
    try:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except TypeError:
        out = io.BytesIO()
        _Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
        return out.getvalue()


def write_frame(stream: IO[bytes], payload: bytes) -> None:
    stream.write(_LENGTH.pack(len(payload)) + payload)


def frame(payload: bytes) -> bytes:
    """`payload` as one frame."""
    return _LENGTH.pack(len(payload)) + payload


def read_frame(stream: IO[bytes]) -> bytes | None:
    """The next frame's payload; None at EOF (a frame cut short counts as EOF)."""
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return None
    (size,) = _LENGTH.unpack(head)
    payload = stream.read(size)
    return payload if len(payload) == size else None


def split_frames(buffer: bytearray, limit: int) -> list[bytes]:
    """Up to `limit` whole frames' payloads taken from the front of `buffer`."""
    out: list[bytes] = []
    start = 0
    while len(out) < limit and len(buffer) - start >= _LENGTH.size:
        (size,) = _LENGTH.unpack_from(buffer, start)
        end = start + _LENGTH.size + size
        if end > len(buffer):
            break
        out.append(bytes(buffer[start + _LENGTH.size : end]))
        start = end
    del buffer[:start]
    return out


def encode_item(kind: str, payload: Any, redactor: Any) -> Any:
    """What the file takes for one queued item (None: it cannot be rendered)."""
    from crihook.proxy.record.lines import (
        CallRecord,
        call_line,
        encode_line,
        passthrough_line,
    )

    if kind == "lost":  # a count, not a line
        return payload
    if kind == "part":
        header, snapshot = payload
        return encode_line(header), encode_line(snapshot)
    if kind == "call":
        return encode_line(call_line(CallRecord._make(payload), redactor))
    if kind == "passthrough":
        seq, path, request, response, status, started = payload
        return encode_line(
            passthrough_line(seq, path, request, response, status, started, redactor)
        )
    return encode_line(payload)  # "header", "line": built already


def _lowest_priority() -> None:
    """Run only on CPU nobody else wants: crihook's calls come first."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        with contextlib.suppress(OSError):
            os.nice(19)


class _Input:
    """crihook's frames, read from a pipe in batches."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = bytearray()
        self.eof = False
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), _PIPE_BYTES)

    def batch(self) -> list[bytes]:
        """The next frames (waiting for the first; empty at EOF)."""
        while not (frames := split_frames(self.buffer, _BATCH)):
            if self.eof or not self._read():
                return []
            time.sleep(GATHER_SECONDS)  # let a batch gather
            while len(self.buffer) < _CHUNK and self._poll.poll(0) and self._read():
                pass
        return frames

    def _read(self) -> bool:
        data = os.read(self.fd, _CHUNK)
        if not data:
            self.eof = True
            return False
        self.buffer += data
        return True


def main() -> int:
    from crihook.proxy.record.file import RecordFile
    from crihook.proxy.record.redact import Redactor

    logs = _Collected()
    logging.getLogger().addHandler(logs)
    logging.getLogger().setLevel(logging.INFO)
    # crihook's stop signals reach this process too (same process group, same cgroup): it
    # ends when crihook closes its stdin, after writing what crihook sent, never earlier.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _lowest_priority()
    source = _Input(sys.stdin.fileno())
    stdout = sys.stdout.buffer
    first = split_frames(source.buffer, 1)
    while not first and not source.eof:
        source._read()
        first = split_frames(source.buffer, 1)
    if not first:
        return 0
    names, values, enabled, path, max_bytes, keep, whole = pickle.loads(first[0])
    redactor = Redactor(names, values, enabled=enabled)
    out = RecordFile(Path(path), max_bytes, keep, whole=whole)
    failures = 0
    while frames := source.batch():
        items: list[tuple[str, Any]] = []
        for payload in frames:
            kind = "line"
            try:
                kind, value = pickle.loads(payload)
                encoded = encode_item(kind, value, redactor)
            except Exception:  # a bug: that call went through; its line is lost (and counted)
                failures += 1
                if failures == 1:
                    log.exception("recording: a %s line could not be rendered (counted)", kind)
                encoded = None
            items.append((kind if kind in ("header", "part", "lost") else "line", encoded))
        out.take(items)
        if not _answer(stdout, len(frames), out, failures, logs):
            return 0  # crihook is gone: nobody to answer
    out.close()
    _answer(stdout, 0, out, failures, logs)
    return 0


class _Collected(logging.Handler):
    """What this process logs, for crihook to log with its next answer."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.levelno, self.format(record)))


def _answer(stdout: IO[bytes], taken: int, out: Any, failures: int, logs: _Collected) -> bool:
    stats = {**out.stats(), "encode_failures": failures}
    ask, out.asking = out.asking, False
    answer = (taken, stats, ask, logs.records)
    logs.records = []
    try:
        write_frame(stdout, pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL))
        stdout.flush()
    except BrokenPipeError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
