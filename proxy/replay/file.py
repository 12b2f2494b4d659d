"""Reading a recording for `crihook replay`: every line checked before anything runs.

A file is one or more segments, each opened by a header (a crihook process's part of the
file, or a rotated file); within a segment the calls and synchronizes are put back in the
order they entered the chain (`seq`), and the plugins in the chain are known from the header
and from each `plugins` line (`Segment.plugins_at`). Anything unreadable is a RecordingError
naming the line: a missing or unreadable file, a line that is not JSON (a truncated last
line included), a line of an unknown kind or missing what its kind needs, bytes that are not
base64, a format this crihook does not read.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from crihook.hooks.node import Topology, TopologyError
from crihook.hooks.spec import ContainerState, ContainerView, Event, PodView
from crihook.proxy.chain.breaker import BreakerRecord
from crihook.proxy.config import HookSettings
from crihook.proxy.config_doc import plugin_settings
from crihook.proxy.errors import ConfigError
from crihook.proxy.record.lines import FORMAT, UNCHANGED

__all__ = [
    "CallEntry",
    "Recording",
    "RecordingError",
    "Segment",
    "SyncEntry",
    "read_recording",
]

_EVENTS = {e.value: e for e in Event}
_CODES = {c.name: c for c in grpc.StatusCode}
_KINDS = frozenset({"header", "call", "sync", "snapshot", "passthrough", "gap", "plugins"})


class RecordingError(Exception):
    """The recording cannot be replayed; `line` is 1-based (0: the file itself)."""

    def __init__(self, path: Path, line: int, problem: str) -> None:
        where = f"{path}:{line}" if line else str(path)
        super().__init__(f"{where}: {problem}")
        self.line = line


@dataclass
class CallEntry:
    line: int
    doc: dict[str, Any]
    event: Event
    seq: int
    request: bytes
    forwarded: bytes | str | None
    """Bytes, UNCHANGED, or None (not forwarded)."""
    response: bytes | None
    status: dict[str, Any] | None

    @property
    def label(self) -> str:
        parts = [self.event.value]
        if self.doc.get("pod"):
            parts.append(f"pod {self.doc['pod']}")
        if self.doc.get("container"):
            parts.append(f"container {self.doc['container']}")
        return ", ".join(parts)


@dataclass
class SyncEntry:
    line: int
    doc: dict[str, Any]
    kind: str
    """`sync`, or `snapshot` (a rotated file's start)."""
    seq: int
    reason: str
    pods: list[PodView]
    containers: list[ContainerView]
    states: dict[str, ContainerState]
    hook_states: dict[str, dict[str, Any]]
    breakers: dict[str, BreakerRecord] | None = None
    """A snapshot's breakers that had counted failures, by hook; None: the line has none
    (a sync, or a recording older than them)."""


@dataclass
class Segment:
    line: int
    header: dict[str, Any]
    topology: Topology
    entries: list[CallEntry | SyncEntry] = field(default_factory=list)
    gaps: list[tuple[int, int]] = field(default_factory=list)
    """(line, lines lost) where the recording says lines are missing."""
    passthrough: int = 0
    plugins: list[HookSettings] | None = None
    """The plugins in the chain when the header was written; None: a recording made before
    crihook noted its plugins."""
    plugin_changes: list[tuple[int, list[HookSettings]]] = field(default_factory=list)
    """(seq, the plugins from then on), from `plugins` lines, in seq order."""

    def plugins_at(self, seq: int) -> list[HookSettings] | None:
        """The plugins in the chain when the call (or synchronize) `seq` entered it."""
        current = self.plugins
        for changed, plugins in self.plugin_changes:
            if changed > seq:
                break
            current = plugins
        return current


@dataclass
class Recording:
    path: Path
    segments: list[Segment]
    lines: list[dict[str, Any]]
    """Every line as read (what --update rewrites)."""

    @property
    def calls(self) -> int:
        return sum(isinstance(e, CallEntry) for s in self.segments for e in s.entries)


def read_recording(path: Path) -> Recording:
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise RecordingError(path, 0, "no such file") from None
    except OSError as exc:
        raise RecordingError(path, 0, f"cannot read it: {exc.strerror or exc}") from None
    raw_lines = text.split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()
    elif raw_lines:
        # The writer ends every line with a newline: without one the last line was cut.
        raise RecordingError(path, len(raw_lines), "truncated line (no newline at its end)")
    if not raw_lines:
        raise RecordingError(path, 0, "empty: not a crihook recording")
    segments: list[Segment] = []
    docs = []
    for number, raw in enumerate(raw_lines, 1):
        doc = _parse(path, number, raw)
        docs.append(doc)
        kind = doc["kind"]
        if kind == "header":
            segments.append(_segment(path, number, doc))
            continue
        if not segments:
            raise RecordingError(path, number, "not a crihook recording: no header line first")
        segment = segments[-1]
        if kind == "call":
            segment.entries.append(_call(path, number, doc))
        elif kind in ("sync", "snapshot"):
            segment.entries.append(_sync(path, number, doc))
        elif kind == "gap":
            segment.gaps.append((number, _int(path, number, doc, "dropped")))
        elif kind == "plugins":
            seq = _int(path, number, doc, "seq")
            segment.plugin_changes.append((seq, _plugins(path, number, doc.get("plugins"))))
        else:
            segment.passthrough += 1
    for segment in segments:
        segment.entries.sort(key=lambda e: e.seq)
        segment.plugin_changes.sort(key=lambda change: change[0])
    return Recording(path, segments, docs)


def _parse(path: Path, number: int, raw: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        problem = f"not a JSON line (corrupt or truncated): {exc}"
        raise RecordingError(path, number, problem) from None
    if not isinstance(doc, dict):
        raise RecordingError(path, number, "not a JSON object")
    if doc.get("kind") not in _KINDS:
        raise RecordingError(path, number, f"unknown line kind {doc.get('kind')!r}")
    return doc


def _segment(path: Path, number: int, doc: dict[str, Any]) -> Segment:
    if doc.get("format") != FORMAT:
        raise RecordingError(
            path, number, f"recording format {doc.get('format')!r}; this crihook reads {FORMAT}"
        )
    if not isinstance(doc.get("config"), dict):
        raise RecordingError(path, number, "header without its config")
    node = doc.get("node")
    try:
        if not isinstance(node, dict):
            raise TopologyError("no node facts")
        topology = Topology.from_dict(node["topology"])
    except (TopologyError, KeyError, TypeError) as exc:
        raise RecordingError(path, number, f"header without usable node facts: {exc}") from None
    plugins = _plugins(path, number, doc["plugins"]) if "plugins" in doc else None
    return Segment(number, doc, topology, plugins=plugins)


def _plugins(path: Path, number: int, docs: Any) -> list[HookSettings]:
    if not isinstance(docs, list) or not all(isinstance(d, Mapping) for d in docs):
        raise RecordingError(path, number, "plugins is not a list of objects")
    try:
        return plugin_settings(docs)
    except ConfigError as exc:
        raise RecordingError(path, number, f"unreadable plugin settings: {exc}") from None


def _call(path: Path, number: int, doc: dict[str, Any]) -> CallEntry:
    event = _EVENTS.get(doc.get("method"))  # type: ignore[arg-type]
    if event is None:
        raise RecordingError(path, number, f"call of unknown method {doc.get('method')!r}")
    forwarded_doc = doc.get("forwarded")
    if forwarded_doc is None or forwarded_doc == UNCHANGED:
        forwarded: bytes | str | None = forwarded_doc
    else:
        forwarded = _bytes(path, number, forwarded_doc, "forwarded")
    response_doc = doc.get("response")
    status = doc.get("status")
    if status is not None and (not isinstance(status, dict) or status.get("code") not in _CODES):
        raise RecordingError(path, number, f"status {status!r} is not a gRPC status")
    for key in ("hooks", "updates", "observed"):
        if not isinstance(doc.get(key, []), list):
            raise RecordingError(path, number, f"{key} is not a list")
    return CallEntry(
        line=number,
        doc=doc,
        event=event,
        seq=_int(path, number, doc, "seq"),
        request=_bytes(path, number, doc.get("request"), "request"),
        forwarded=forwarded,
        response=None if response_doc is None else _bytes(path, number, response_doc, "response"),
        status=status,
    )


def _sync(path: Path, number: int, doc: dict[str, Any]) -> SyncEntry:
    try:
        pods = [PodView.from_dict(p) for p in doc["pods"]]
        containers = [ContainerView.from_dict(c) for c in doc["containers"]]
        states = {str(k): ContainerState(v) for k, v in dict(doc["container_states"]).items()}
        hook_states = {str(k): dict(v) for k, v in dict(doc["hook_states"]).items()}
        if not isinstance(doc.get("updates", []), list):
            raise TypeError("updates is not a list")
    except (KeyError, TypeError, ValueError) as exc:
        raise RecordingError(path, number, f"unreadable {doc['kind']} line: {exc!r}") from None
    return SyncEntry(
        line=number,
        doc=doc,
        kind=doc["kind"],
        seq=_int(path, number, doc, "seq"),
        reason=str(doc.get("reason", "start")),
        pods=pods,
        containers=containers,
        states=states,
        hook_states=hook_states,
        breakers=_breakers(path, number, doc["breakers"]) if "breakers" in doc else None,
    )


def _breakers(path: Path, number: int, doc: Any) -> dict[str, BreakerRecord]:
    if not isinstance(doc, Mapping):
        raise RecordingError(path, number, f"breakers {doc!r} is not an object")
    out = {}
    for name, record in doc.items():
        if not isinstance(record, Mapping):
            raise RecordingError(path, number, f"breaker of {name} {record!r} is not an object")
        failures = _int(path, number, record, "failures")
        if failures < 0:
            raise RecordingError(path, number, f"breaker of {name}: {failures} failures")
        reopens = record.get("open_until")
        if reopens is not None and (
            isinstance(reopens, bool) or not isinstance(reopens, int | float)
        ):
            raise RecordingError(path, number, f"open_until {reopens!r} is not a time")
        out[str(name)] = BreakerRecord(failures, None if reopens is None else float(reopens))
    return out


def _bytes(path: Path, number: int, doc: Any, what: str) -> bytes:
    if not isinstance(doc, Mapping) or not isinstance(doc.get("b64"), str):
        raise RecordingError(path, number, f"{what} has no bytes (b64)")
    try:
        return base64.b64decode(doc["b64"], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise RecordingError(path, number, f"{what}: bytes are not base64: {exc}") from None


def _int(path: Path, number: int, doc: Mapping[str, Any], key: str) -> int:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RecordingError(path, number, f"{key} {value!r} is not a whole number")
    return value
