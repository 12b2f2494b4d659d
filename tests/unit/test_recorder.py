"""The recording writer: lines leave the event loop pickled, are rendered in a process of
their own and written by a thread; a disk that fails (or a renderer that dies) drops and
counts lines without raising, and a file past its bound is rotated into files that each
replay on their own."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.spec import Event, PodView
from crihook.proxy.config import RecordSettings
from crihook.proxy.cri.outcome import Outcome
from crihook.proxy.record.lines import call_line, encode_line
from crihook.proxy.record.recorder import RESUME_SECONDS, Recorder
from crihook.proxy.replay.file import read_recording
from tests.lab.crihook_proc import PATIENCE
from tests.unit.test_replay_file import header, sync


@contextlib.asynccontextmanager
async def no_calls() -> AsyncIterator[None]:
    yield


def recorder(path: Path, **settings: Any) -> Recorder:
    seqs = iter(range(1000, 100000))
    return Recorder(
        RecordSettings(file=path, **settings),
        header,
        lambda seq: {**sync(seq), "kind": "snapshot", "reason": "rotate"},
        no_calls,
        lambda: next(seqs),
    )


def outcome(seq: int, payload: bytes = b"") -> Outcome:
    request = api_pb2.StartContainerRequest(container_id=f"c{seq}" + payload.hex())
    result = Outcome(Event.START_CONTAINER, request.SerializeToString(), None)
    result.seq = seq
    result.pod = PodView(id="p", uid="u", name="web", namespace="default")
    result.forwarded = result.received
    result.response = b""
    return result


async def test_calls_become_lines_after_the_header(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl"
    rec = recorder(path)
    rec.start()
    rec.line(sync(1))
    for seq in (2, 3):
        rec.call(outcome(seq))
    await rec.close()

    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["kind"] for line in lines] == ["header", "sync", "call", "call"]
    assert [line["forwarded"] for line in lines[2:]] == ["unchanged", "unchanged"]
    assert lines[2]["pod"] == "default/web"
    assert rec.status()["lines"] == 4
    assert rec.status()["dropped"] == 0
    assert read_recording(path).calls == 2


async def test_a_disk_that_fails_drops_and_counts_never_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "rec.jsonl"
    rec = recorder(path)
    await _first_part(rec)
    os.rename(path, tmp_path / "first.jsonl")
    path.mkdir()  # a directory where the file is: every write fails (root too)
    for seq in (3, 4, 5):
        rec.call(outcome(seq))
    await _settled(rec, dropped=3)
    status = rec.status()
    assert status["write_failures"] >= 1
    assert "rec.jsonl" in status["last_error"]
    assert status["failing_since"] is not None

    # The disk is back: nothing more is written until the writer can resume whole, behind
    # a new header and a snapshot of what the hooks hold.
    path.rmdir()
    os.rename(tmp_path / "first.jsonl", path)
    await asyncio.sleep(RESUME_SECONDS)
    for seq in (6, 7):
        rec.call(outcome(seq))
        await _settled(rec)
    rec.call(outcome(8))
    await rec.close()

    kinds = [json.loads(line)["kind"] for line in path.read_text().splitlines()]
    assert kinds[:3] == ["header", "sync", "call"]
    gap_at = kinds.index("gap")
    assert kinds[gap_at : gap_at + 3] == ["gap", "header", "snapshot"]
    assert kinds[gap_at + 3 :] == ["call"] * (len(kinds) - gap_at - 3)
    gap = json.loads(path.read_text().splitlines()[gap_at])
    assert gap["dropped"] == rec.status()["dropped"] >= 3
    assert rec.status()["failing_since"] is None
    recording = read_recording(path)
    assert [s.line for s in recording.segments] == [1, gap_at + 2]
    # The renderer's log lines are crihook's own (its logger, its format), once each.
    logged = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    failing = [m for m in logged if "cannot write" in m[2]]
    assert len(failing) == 1 and failing[0][:2] == ("crihook.proxy.record", "ERROR")
    assert any("works again" in m[2] for m in logged)


async def _first_part(rec: Recorder) -> None:
    """Start `rec` and have its header, a sync line and a call written."""
    rec.start()
    rec.line(sync(1))
    rec.call(outcome(2))
    await _settled(rec, lines=3)


def _renderer_pid(rec: Recorder) -> int:
    worker = rec._worker
    assert worker is not None and worker.transport is not None
    pid: int = worker.transport.get_pid()
    return pid


async def _until(done: Callable[[], bool], what: str) -> None:
    """Until `done()`, or fail after PATIENCE (the renderer is a process of its own, which a
    loaded machine may start and run slowly)."""
    deadline = time.monotonic() + PATIENCE
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {PATIENCE}s waiting for {what}")
        await asyncio.sleep(0.01)


async def _settled(rec: Recorder, lines: int = 0, dropped: int = 0) -> None:
    """Until the writer took every queued line (it runs in its own thread)."""

    def taken() -> bool:
        status = rec.status()
        return rec.backlog() == 0 and status["lines"] >= lines and status["dropped"] >= dropped

    await _until(taken, f"the writer to take the lines ({lines} written, {dropped} dropped)")
    await asyncio.sleep(0.02)


def _kinds(path: Path) -> list[str]:
    return [json.loads(line)["kind"] for line in path.read_text().splitlines()]


async def test_past_its_bound_the_file_is_rotated_and_each_file_replays(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl"
    rec = recorder(path, max_bytes=4096, keep=2)
    rec.start()
    rec.line(sync(1))
    for seq in range(2, 80):
        rec.call(outcome(seq, payload=bytes(100)))
        await _settled(rec)
    await rec.close()

    assert rec.status()["rotations"] >= 2
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["rec.jsonl", "rec.jsonl.1", "rec.jsonl.2"]  # keep=2: no .3
    for name in files:
        recording = read_recording(tmp_path / name)
        first = recording.lines[0]
        assert first["kind"] == "header"
        if name != "rec.jsonl.2" or rec.status()["rotations"] > 2:
            # A rotated file starts from a snapshot of what the hooks hold.
            assert recording.lines[1]["kind"] == "snapshot"
        assert os.path.getsize(tmp_path / name) < 4096 + 2000  # the bound, plus one batch
    assert rec.status()["dropped"] == 0


@pytest.mark.parametrize("secrets", [False, True], ids=["redacted", "secrets-kept"])
async def test_a_call_line_is_redacted_unless_secrets_are_kept(
    tmp_path: Path, secrets: bool
) -> None:
    path = tmp_path / "rec.jsonl"
    rec = recorder(path, secrets=secrets)
    rec.start()
    request = api_pb2.UpdateContainerResourcesRequest(
        container_id="c1", annotations={"vault.example.com/token": "s3cr3t"}
    )
    call = Outcome(Event.UPDATE_CONTAINER_RESOURCES, request.SerializeToString(), None)
    call.forwarded = call.received
    rec.call(call)
    await rec.close()
    text = path.read_text()
    line = json.loads(text.splitlines()[-1])
    assert line["request"]["json"]["annotations"]["vault.example.com/token"] == (
        "s3cr3t" if secrets else "<redacted>"
    )
    assert ("s3cr3t" in _decoded(text)) is secrets


def _decoded(text: str) -> str:
    """The file with every base64 payload decoded: a secret must not hide in the bytes."""
    import base64

    out = [text]
    for line in text.splitlines():
        for doc in json.loads(line).values():
            if isinstance(doc, dict) and isinstance(doc.get("b64"), str):
                out.append(base64.b64decode(doc["b64"]).decode(errors="replace"))
    return "\n".join(out)


async def test_the_renderer_process_writes_the_line_the_loop_would_have(tmp_path: Path) -> None:
    """Outcomes cross to the renderer pickled, read-only views included: the line in the
    file is the one rendering in crihook's own process gives."""
    path = tmp_path / "rec.jsonl"
    rec = recorder(path)
    rec.start()
    call = outcome(2)
    call.pod = PodView(
        id="p",
        uid="u",
        name="web",
        namespace="default",
        labels=MappingProxyType({"app": "web"}),
        annotations=MappingProxyType({"vault.example.com/token": "s3cr3t"}),
    )
    rec.call(call)
    await rec.close()

    written = path.read_bytes().splitlines(keepends=True)[-1]
    assert written == encode_line(call_line(call, rec.redactor))
    assert rec.status()["encode_failures"] == 0


async def test_a_renderer_that_dies_loses_what_it_held_counted_then_a_new_one_goes_on(
    tmp_path: Path,
) -> None:
    path = tmp_path / "rec.jsonl"
    rec = recorder(path)
    await _first_part(rec)
    pid = _renderer_pid(rec)
    worker = rec._worker
    assert worker is not None
    os.kill(pid, signal.SIGSTOP)  # it takes three calls and answers none
    for seq in (3, 4, 5):
        rec.call(outcome(seq))
    await _until(lambda: worker.unanswered_frames() == 3, "three calls sent to the renderer")
    assert worker.unanswered() == (3, 3)
    os.kill(pid, signal.SIGKILL)
    await _settled(rec, dropped=3)
    # The new renderer writes the gap, a header and a snapshot before it takes a call: the
    # next calls are written, not lost (however long the machine takes to start it).
    await _until(lambda: _kinds(path)[-1:] == ["snapshot"], "the new part after the gap")
    for seq in (6, 7):
        rec.call(outcome(seq))
        await _settled(rec)
    await rec.close()

    status = rec.status()
    assert status["dropped"] == 3
    assert status["renderer_restarts"] == 1
    kinds = [json.loads(line)["kind"] for line in path.read_text().splitlines()]
    assert kinds == ["header", "sync", "call", "gap", "header", "snapshot", "call", "call"]
    assert json.loads(path.read_text().splitlines()[3])["dropped"] == 3
    assert [s.line for s in read_recording(path).segments] == [1, 5]


async def test_a_renderer_that_falls_behind_bounds_the_backlog_then_marks_the_gap(
    tmp_path: Path,
) -> None:
    """A renderer that gets no CPU (here: stopped) never holds calls back: past the bound,
    lines are dropped and counted; once it catches up, the file shows the gap and goes on
    from a new header and snapshot."""
    path = tmp_path / "rec.jsonl"
    seqs = iter(range(1000, 100000))
    rec = Recorder(
        RecordSettings(file=path),
        header,
        lambda seq: {**sync(seq), "kind": "snapshot", "reason": "rotate"},
        no_calls,
        lambda: next(seqs),
        max_pending=4,
    )
    await _first_part(rec)
    pid = _renderer_pid(rec)
    os.kill(pid, signal.SIGSTOP)
    try:
        for seq in range(3, 13):  # 3 to 6 wait for it; 7 to 12 are dropped
            rec.call(outcome(seq))
            await asyncio.sleep(0.02)
        assert rec.backlog() == 4
        assert rec.status()["dropped"] == 6
        assert rec.status()["lines"] == 3
    finally:
        os.kill(pid, signal.SIGCONT)
    await _settled(rec, lines=7)
    # It asks for a new part; the loop takes the snapshot.
    await _until(lambda: rec.status()["lines"] >= 10, "the gap, a header and a snapshot")
    for seq in (13, 14):
        rec.call(outcome(seq))
        await _settled(rec)
    await rec.close()

    docs = [json.loads(line) for line in path.read_text().splitlines()]
    kinds = [d["kind"] for d in docs]
    assert kinds == ["header", "sync"] + ["call"] * 5 + ["gap", "header", "snapshot"] + ["call"] * 2
    assert [d["seq"] for d in docs if d["kind"] == "call"] == [2, 3, 4, 5, 6, 13, 14]
    assert docs[7]["dropped"] == 6
    assert rec.status()["dropped"] == 6
    assert rec.status()["renderer_restarts"] == 0
    assert [s.line for s in read_recording(path).segments] == [1, 9]


async def test_a_renderer_that_dies_holding_nothing_is_replaced_without_a_gap(
    tmp_path: Path,
) -> None:
    """Nothing was lost: the new renderer goes on in the same part of the file."""
    path = tmp_path / "rec.jsonl"
    rec = recorder(path)
    await _first_part(rec)
    os.kill(_renderer_pid(rec), signal.SIGKILL)
    await _until(lambda: rec._worker is None, "the renderer's death to be noticed")
    for seq in (3, 4):
        rec.call(outcome(seq))
        await _settled(rec)
    await rec.close()

    kinds = [json.loads(line)["kind"] for line in path.read_text().splitlines()]
    assert kinds == ["header", "sync", "call", "call", "call"]
    assert (rec.status()["dropped"], rec.status()["renderer_restarts"]) == (0, 1)
