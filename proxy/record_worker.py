"""The recording's renderer, in a process of its own: call outcomes in, JSON lines out.

Rendering a call as readable JSON (and redacting it) costs a few hundred microseconds of
Python for a large CreateContainer. Done on crihook's event loop it took that time from the
calls; done in a thread it fought the loop for the GIL. So the loop only pickles what a call
handed over (tens of microseconds) and this process, started by the `Recorder`, does the
rest:

    python -m crihook.proxy.record_worker      # stdin: frames in, stdout: frames out

A frame is a 4-byte big-endian length and a pickle. The first frame in is the redaction
settings; every later one is `(kind, payload)` as the Recorder queued it, answered, in order,
by `(kind, encoded)`: the line as bytes (a tuple of two for a new part), or None when it
could not be rendered (logged here, counted by the Recorder). EOF on stdin ends the process
once everything read is answered.
"""

from __future__ import annotations

import copyreg
import io
import logging
import pickle
import signal
import struct
import sys
import types
from typing import IO, Any

__all__ = ["dumps", "encode_item", "main", "read_frame", "write_frame"]

log = logging.getLogger("crihook.proxy.record_worker")

_LENGTH = struct.Struct(">I")


def _mapping_proxy(values: dict[Any, Any]) -> types.MappingProxyType[Any, Any]:
    return types.MappingProxyType(values)


class _Pickler(pickle.Pickler):
    # Views hand hooks read-only mappings; pickle them as the dicts they wrap.
    dispatch_table = copyreg.dispatch_table.copy()
    dispatch_table[types.MappingProxyType] = lambda m: (_mapping_proxy, (dict(m),))


def dumps(value: Any) -> bytes:
    """`value` pickled, read-only mappings included."""
    out = io.BytesIO()
    _Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return out.getvalue()


def write_frame(stream: IO[bytes], payload: bytes) -> None:
    stream.write(_LENGTH.pack(len(payload)))
    stream.write(payload)


def read_frame(stream: IO[bytes]) -> bytes | None:
    """The next frame's payload; None at EOF (a frame cut short counts as EOF)."""
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return None
    (size,) = _LENGTH.unpack(head)
    payload = stream.read(size)
    return payload if len(payload) == size else None


def encode_item(kind: str, payload: Any, redactor: Any) -> Any:
    """What the Recorder's writer takes for one queued item (None: it cannot be rendered)."""
    from crihook.proxy.record_format import call_line, encode_line, passthrough_line

    if kind == "lost":  # the Recorder could not pickle it (counted there)
        return None
    if kind == "part":
        header, snapshot = payload
        return encode_line(header), encode_line(snapshot)
    if kind == "call":
        return encode_line(call_line(payload, redactor))
    if kind == "passthrough":
        seq, path, request, response, status, started = payload
        return encode_line(
            passthrough_line(seq, path, request, response, status, started, redactor)
        )
    return encode_line(payload)  # "header", "line": built already


def main() -> int:
    from crihook.proxy.redact import Redactor

    logging.basicConfig(level=logging.WARNING, format="crihook record_worker: %(message)s")
    # crihook's stop signals reach this process too (same process group, same cgroup): it
    # ends when crihook closes its stdin, after answering what crihook sent, never earlier.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    first = read_frame(stdin)
    if first is None:
        return 0
    names, values, enabled = pickle.loads(first)
    redactor = Redactor(names, values, enabled=enabled)
    failures = 0
    while (frame := read_frame(stdin)) is not None:
        kind = "line"
        try:
            kind, payload = pickle.loads(frame)
            encoded = encode_item(kind, payload, redactor)
        except Exception:  # a bug: that call went through; its line is lost (and counted)
            failures += 1
            if failures == 1:
                log.exception("a %s line could not be rendered (counted from now on)", kind)
            encoded = None
        try:
            write_frame(stdout, pickle.dumps((kind, encoded), protocol=pickle.HIGHEST_PROTOCOL))
            stdout.flush()
        except BrokenPipeError:  # crihook is gone: nobody to answer
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
