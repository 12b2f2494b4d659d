"""Reading a recording: what cannot be replayed is refused before anything runs, naming the
line (exit 2 from `crihook replay`)."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import pytest

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.node import Topology
from crihook.hooks.node.topology import CPUInfo
from crihook.proxy.chain.breaker import BreakerRecord
from crihook.proxy.config import Settings
from crihook.proxy.config_doc import settings_doc
from crihook.proxy.record.lines import FORMAT
from crihook.proxy.replay.cli import replay_command
from crihook.proxy.replay.file import CallEntry, RecordingError, SyncEntry, read_recording

TOPOLOGY = Topology.build([CPUInfo(0, 0, 0, 0, 0, -1), CPUInfo(1, 0, 0, 1, 0, -1)])


def _b64(message: Any) -> dict[str, Any]:
    return {"b64": base64.b64encode(message.SerializeToString()).decode(), "json": {}}


def header() -> dict[str, Any]:
    node = {"topology": TOPOLOGY.to_dict(), "device_pools": [], "files": []}
    return {"kind": "header", "format": FORMAT, "config": settings_doc(Settings()), "node": node}


def sync(seq: int) -> dict[str, Any]:
    return {
        "kind": "sync",
        "seq": seq,
        "reason": "start",
        "pods": [],
        "containers": [],
        "container_states": {},
        "hook_states": {},
        "updates": [],
        "observed": [],
    }


def call(seq: int, container_id: str = "c1") -> dict[str, Any]:
    request = api_pb2.StartContainerRequest(container_id=container_id)
    return {
        "kind": "call",
        "seq": seq,
        "method": "StartContainer",
        "request": _b64(request),
        "forwarded": "unchanged",
        "response": _b64(api_pb2.StartContainerResponse()),
        "status": None,
        "hooks": [],
        "updates": [],
        "observed": [],
    }


def write(path: Path, lines: list[Any], tail: bytes = b"") -> Path:
    text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    path.write_bytes(text.encode() + tail)
    return path


def test_a_recording_is_read_in_the_order_calls_entered_the_chain(tmp_path: Path) -> None:
    # Lines are written as calls end; seq is the order they entered.
    path = write(tmp_path / "r", [header(), sync(1), call(3, "late"), call(2, "early")])
    recording = read_recording(path)
    (segment,) = recording.segments
    assert [type(e) for e in segment.entries] == [SyncEntry, CallEntry, CallEntry]
    assert [e.seq for e in segment.entries] == [1, 2, 3]
    assert [e.line for e in segment.entries] == [2, 4, 3]
    assert segment.topology == TOPOLOGY
    assert recording.calls == 2


def test_every_header_opens_a_segment(tmp_path: Path) -> None:
    path = write(tmp_path / "r", [header(), sync(1), call(2), header(), sync(1), call(2)])
    assert [s.line for s in read_recording(path).segments] == [1, 4]


def _bad_base64() -> dict[str, Any]:
    line = call(2)
    line["request"]["b64"] = "not base64!"
    return line


def _bad_status() -> dict[str, Any]:
    line = call(2)
    line["status"] = {"code": "NOT_A_CODE", "message": ""}
    return line


def _old_format() -> dict[str, Any]:
    line = header()
    line["format"] = 99
    return line


CUT = b'{"kind": "call", "seq": 2, "met'


def _snapshot(breakers: Any) -> dict[str, Any]:
    return {**sync(1), "kind": "snapshot", "reason": "rotate", "breakers": breakers}


CORRUPT: dict[str, tuple[list[Any], bytes, int, str]] = {
    "truncated-last-line": ([header(), sync(1)], CUT, 3, "truncated"),
    "garbage-in-the-middle": ([header(), "{not json", call(2)], b"", 2, "not a JSON line"),
    "not-an-object": ([header(), "[1, 2]"], b"", 2, "not a JSON object"),
    "unknown-kind": ([header(), {"kind": "nope"}], b"", 2, "unknown line kind"),
    "no-header": ([call(2)], b"", 1, "no header"),
    "bad-base64": ([header(), sync(1), _bad_base64()], b"", 3, "not base64"),
    "unknown-method": ([header(), {**call(2), "method": "Frobnicate"}], b"", 2, "unknown method"),
    "bad-status": ([header(), _bad_status()], b"", 2, "not a gRPC status"),
    "no-seq": ([header(), {**call(2), "seq": "x"}], b"", 2, "seq"),
    "other-format": ([_old_format()], b"", 1, "format 99"),
    "broken-sync": ([header(), {**sync(1), "pods": [{"id": "x"}]}], b"", 2, "unreadable sync"),
    "bad-plugin": (
        [header(), {"kind": "plugins", "seq": 2, "plugins": [{"name": "p", "endpoint": "x"}]}],
        b"",
        2,
        "unreadable plugin settings",
    ),
    "plugins-not-a-list": ([{**header(), "plugins": {}}], b"", 1, "plugins is not a list"),
    "breakers-not-an-object": ([header(), _snapshot([])], b"", 2, "breakers [] is not an object"),
    "breaker-not-an-object": ([header(), _snapshot({"p": 2})], b"", 2, "breaker of p 2"),
    "breaker-failures": (
        [header(), _snapshot({"p": {"failures": "2"}})], b"", 2, "failures '2' is not a whole"
    ),
    "breaker-negative": (
        [header(), _snapshot({"p": {"failures": -1}})], b"", 2, "breaker of p: -1 failures"
    ),
    "breaker-open-until": (
        [header(), _snapshot({"p": {"failures": 2, "open_until": True}})], b"", 2,
        "open_until True is not a time",
    ),
}  # fmt: skip


def test_a_snapshot_carries_the_breakers_that_counted_failures(tmp_path: Path) -> None:
    breakers = {"60-b": {"failures": 3, "open_until": 1700000030.5}, "70-c": {"failures": 1}}
    lines = [header(), _snapshot(breakers), sync(2)]
    (segment,) = read_recording(write(tmp_path / "r", lines)).segments
    snapshot, later = segment.entries
    assert isinstance(snapshot, SyncEntry) and isinstance(later, SyncEntry)
    assert snapshot.breakers == {
        "60-b": BreakerRecord(3, 1700000030.5),
        "70-c": BreakerRecord(1, None),
    }
    assert later.breakers is None  # a sync line has none


def test_the_plugins_in_the_chain_are_known_at_every_seq(tmp_path: Path) -> None:
    first = {"name": "50-a", "endpoint": "unix:///a.sock", "failure_policy": "ignore"}
    second = {"name": "60-b", "endpoint": "unix:///b.sock"}
    lines = [
        {**header(), "plugins": [first]},
        sync(1),
        {"kind": "plugins", "seq": 3, "plugins": [first, second]},
        call(2),
        call(4),
    ]
    (segment,) = read_recording(write(tmp_path / "r", lines)).segments

    names = {seq: [p.name for p in segment.plugins_at(seq) or []] for seq in (1, 2, 4)}

    assert names == {1: ["50-a"], 2: ["50-a"], 4: ["50-a", "60-b"]}
    assert segment.plugins is not None and segment.plugins[0].failure_policy == "ignore"
    assert read_recording(write(tmp_path / "old", [header()])).segments[0].plugins is None


@pytest.mark.parametrize("case", list(CORRUPT), ids=list(CORRUPT))
def test_corrupt_lines_are_named(tmp_path: Path, case: str) -> None:
    lines, tail, line, words = CORRUPT[case]
    path = write(tmp_path / "r", lines, tail)

    with pytest.raises(RecordingError) as caught:
        read_recording(path)

    assert caught.value.line == line
    assert f"{path}:{line}: " in str(caught.value)
    assert words in str(caught.value)


@pytest.mark.parametrize("case", ["missing", "empty", "directory"])
def test_a_file_that_is_not_there_or_empty(tmp_path: Path, case: str) -> None:
    path = tmp_path / "r"
    if case == "empty":
        path.write_bytes(b"")
    elif case == "directory":
        path.mkdir()
    with pytest.raises(RecordingError) as caught:
        read_recording(path)
    assert caught.value.line == 0


def test_replay_command_exits_2_naming_the_line(tmp_path: Path) -> None:
    path = write(tmp_path / "r", [header(), sync(1)], b'{"kind": "ca')
    out = io.StringIO()
    assert replay_command(path, None, None, False, out) == 2
    assert out.getvalue() == f"crihook replay: {path}:3: truncated line (no newline at its end)\n"
