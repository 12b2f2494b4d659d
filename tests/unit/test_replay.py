"""The replay engine on small hand-made recordings: what it does when the recording and the
replayed chain disagree about whether a call reaches the runtime, and `--update`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from crihook.hooks.spec import Adjustment, Hook, HookContext, Reject
from crihook.proxy.config import settings_from_toml
from crihook.proxy.replay.cli import write_updated
from crihook.proxy.replay.file import read_recording
from crihook.proxy.replay.runner import replay
from tests.unit.test_replay_file import call, header, sync, write


def refused_by_a_plugin(seq: int) -> dict[str, Any]:
    """A StartContainer a plugin refused: never forwarded. (A recording made before crihook
    noted its plugins: the hook is not in the recorded configuration.)"""
    line = call(seq)
    line["forwarded"] = None
    line["response"] = None
    detail = "hook '50-gone': rejected StartContainer: no more starts"
    line["status"] = {
        "code": "FAILED_PRECONDITION",
        "message": f"crihook: {detail} (pod , container c1)",
        "origin": "crihook",
    }
    line["hooks"] = [{"hook": "50-gone", "stage": "pre", "verdict": "rejected", "detail": detail}]
    return line


async def test_a_plugin_the_recording_does_not_note_is_stood_in_for(tmp_path: Path) -> None:
    path = write(tmp_path / "r.jsonl", [header(), sync(1), refused_by_a_plugin(2), call(3)])

    report = await replay(read_recording(path))

    assert report.differing == []
    assert report.warnings == [
        "line 1: hook(s) 50-gone ran in the recording without being in its configuration: "
        "replayed as plugins with default settings (this recording does not note its plugins' "
        "settings)"
    ]


async def test_a_call_the_replayed_chain_lets_through_differs_and_can_become_the_expectation(
    tmp_path: Path,
) -> None:
    path = write(tmp_path / "r.jsonl", [header(), sync(1), refused_by_a_plugin(2), call(3)])
    (tmp_path / "hooks.d").mkdir()  # no drop-ins: the plugin is gone
    config = settings_from_toml({"plugins_dir": str(tmp_path / "hooks.d")})

    report = await replay(read_recording(path), config)

    (result,) = report.differing
    assert result.entry.line == 3
    assert [d.describe() for d in result.differences] == [
        "status: recorded \"FAILED_PRECONDITION: crihook: hook '50-gone': rejected "
        'StartContainer: no more starts (pod , container c1)", replayed "OK"',
        'forwarded: recorded "not forwarded", replayed "forwarded unchanged"',
    ]
    # The recording has no answer for it: a made-up success, said so.
    assert result.notes == [
        "the runtime was asked StartContainer, which the recording has no answer for (answered OK)"
    ]
    assert f"plugin gone of the recording is not in {tmp_path / 'hooks.d'}: it is not run" in (
        report.warnings
    )

    assert write_updated(report, config, None) == 2  # the call, and the header's config
    again = await replay(read_recording(path))
    assert again.differing == []
    line = json.loads(path.read_text().splitlines()[2])
    assert line["status"] is None and line["forwarded"] == "unchanged"


async def test_calls_refused_before_crihook_was_ready_replay_as_such(tmp_path: Path) -> None:
    early = call(1)
    early.update(
        ready=False,
        forwarded=None,
        response=None,
        status={
            "code": "UNAVAILABLE",
            "message": "crihook: waiting for the runtime at unix:///c.sock",
            "origin": "crihook",
        },
    )
    path = write(tmp_path / "r.jsonl", [header(), early, sync(2), call(3)])

    report = await replay(read_recording(path))

    assert report.differing == []
    assert report.warnings == []


async def test_the_runtime_refusing_a_call_is_replayed_from_the_recording(tmp_path: Path) -> None:
    failed = call(2)
    failed.update(
        response=None,
        status={"code": "NOT_FOUND", "message": "container c1 not found", "origin": "runtime"},
    )
    path = write(tmp_path / "r.jsonl", [header(), sync(1), failed])

    report = await replay(read_recording(path))

    assert report.differing == []
    assert "everything matches" in report.summary()


class RefuseStart(Hook):
    """A chain that now refuses what the runtime refused before."""

    async def pre_start_container(self, ctx: HookContext) -> Adjustment | None:
        raise Reject("no more starts")


REFUSING = settings_from_toml(
    {"hooks": {"order": ["10-refuse"], "refuse": {"module": f"{__name__}:RefuseStart"}}}
)


async def test_update_keeps_what_the_runtime_answered(tmp_path: Path) -> None:
    failed = call(2)
    failed.update(
        response=None,
        status={"code": "NOT_FOUND", "message": "container c1 not found", "origin": "runtime"},
    )
    path = write(tmp_path / "r.jsonl", [header(), sync(1), failed])
    report = await replay(read_recording(path), REFUSING)
    assert [d.what for d in report.differing[0].differences] == ["status", "forwarded"]

    path.chmod(0o644)
    write_updated(report, REFUSING, None)

    assert path.stat().st_mode & 0o777 == 0o600  # as private as crihook writes a recording
    assert (await replay(read_recording(path))).differing == []  # the header: the new chain
    without = await replay(read_recording(path), hooks="none")
    (difference, *_) = without.differing[0].differences
    assert difference.replayed == "NOT_FOUND: container c1 not found"  # the runtime's answer
