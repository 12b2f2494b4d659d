"""`crihook state` never presents a status file crihook stopped writing as a running crihook."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from crihook.proxy.cli import main
from crihook.proxy.errors import StateDirInUseError
from crihook.proxy.ops.state_cli import STALE_SECONDS, liveness, process_of, render_state
from crihook.proxy.state.directory import LOCK_FILE, hold_state_dir, state_dir_holder

NOW = 1_800_000_000.0
HOOK = {
    "name": "20-cpuset",
    "kind": "in-process",
    "failure_policy": "fail",
    "breaker": "closed",
    "connected": True,
    "counters": {},
}


def status(**kw: object) -> dict[str, object]:
    return {
        "version": "0.1.0",
        "ready": True,
        "runtime": "unix:///c.sock",
        "dry_run": False,
        "hooks": [HOOK],
        "updated_at": NOW - 1,
        "running": True,
        "stopped_at": None,
        **kw,
    }


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (status(), None),
        (status(running=False, stopped_at=NOW - 60), "crihook is not running: it stopped at"),
        (status(updated_at=NOW - STALE_SECONDS - 1), "its status was last written at"),
        (status(updated_at=NOW - STALE_SECONDS + 1), None),
    ],
    ids=["running", "stopped-cleanly", "stale-crashed", "recent"],
)
def test_liveness(doc: dict[str, object], expected: str | None) -> None:
    said = liveness(doc, now=NOW)
    assert said is None if expected is None else expected in (said or "")


def test_a_stopped_crihook_is_not_shown_ready_or_connected() -> None:
    doc = {
        "status": status(running=False, stopped_at=NOW - 60),
        "pods": {},
        "containers": {},
        "hook_states": {},
    }
    text = render_state(doc)
    first, second, hook = text.splitlines()[:3]
    assert first.startswith("crihook is not running")
    assert "ready=False" in second
    assert "connected=False" in hook


def test_a_hooks_own_failures_are_listed_under_it() -> None:
    failing = {**HOOK, "failures": {"pod_cgroup": 3, "other": 0}}
    doc = {"status": status(hooks=[failing]), "pods": {}, "containers": {}, "hook_states": {}}
    lines = render_state(doc).splitlines()
    hook = next(i for i, line in enumerate(lines) if line.startswith("  hook 20-cpuset"))
    assert lines[hook + 1] == "    failed beside the calls (tried again): pod_cgroup 3"


def test_json_says_whether_it_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "status.json").write_text(json.dumps(status(running=False, stopped_at=NOW)))
    assert main(["state", "--state-dir", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["running"] is False


RECORDING = {"file": "/var/r.jsonl", "lines": 12, "bytes": 3400, "dropped": 0}


@pytest.mark.parametrize(
    ("recording", "expected"),
    [
        (None, None),
        (RECORDING, "  recording to /var/r.jsonl: 12 lines, 3400 bytes, 0 lost"),
        (
            {**RECORDING, "dropped": 3, "failing_since": NOW, "last_error": "/var: full"},
            "  recording to /var/r.jsonl: 12 lines, 3400 bytes, 3 lost; FAILING: /var: full",
        ),
    ],
    ids=["not-recording", "recording", "failing"],
)
def test_the_recording_is_shown(recording: dict[str, object] | None, expected: str | None) -> None:
    doc = {"status": status(recording=recording), "pods": {}, "containers": {}, "hook_states": {}}
    shown = [line for line in render_state(doc).splitlines() if "recording" in line]
    assert shown == ([] if expected is None else [expected])


def _container(name: str, state: str, attempt: int, kind: str) -> dict[str, object]:
    view = {"id": f"{name}-0123456789abcdef", "pod_id": "sb1", "name": name, "attempt": attempt}
    return {"view": {**view, "kind": kind}, "audit": {}, "state": state}


def test_a_container_shows_what_kubelet_said_of_it_and_no_kind_it_did_not() -> None:
    """kubelet's CreateContainer names the container and its attempt (its restart count);
    nothing in it says init container or app container, so `kind=unknown` was printed for
    every one. The kind is shown where a pod annotation gives it, never as unknown."""
    pod = {
        "view": {
            "id": "sb1",
            "name": "web",
            "namespace": "shop",
            "qos_class": "Burstable",
            "cgroup_parent": "/kubepods/burstable/poduid",
        },
        "audit": {},
    }
    doc = {
        "status": None,
        "pods": {"sb1": pod},
        "containers": {
            "a": _container("app", "running", 2, "unknown"),
            "b": _container("setup", "exited", 0, "init"),
        },
        "hook_states": {},
    }
    lines = render_state(doc).splitlines()
    assert lines[-2:] == [
        "  container app app-012345678 running attempt=2",
        "  container setup setup-0123456 exited attempt=0 kind=init",
    ]


# --- running or not: the state directory's lock, not the status file -------------------------

HOLDER = """
import sys, time
from pathlib import Path
from crihook.proxy.state.directory import hold_state_dir
lock = hold_state_dir(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(600)
"""


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding `tmp_path` as crihook does (a lock of this process would not
    conflict with this process's own query)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    yield proc
    proc.kill()
    proc.wait()
    proc.stdout.close()


def _state_json(path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert main(["state", "--state-dir", str(path), "--json"]) == 0
    doc: dict[str, object] = json.loads(capsys.readouterr().out)
    return doc


@pytest.mark.parametrize("written", ["stale", "missing"])
def test_a_crihook_that_cannot_write_its_status_is_still_running(
    tmp_path: Path,
    holder: subprocess.Popen[str],
    capsys: pytest.CaptureFixture[str],
    written: str,
) -> None:
    """A full disk keeps status.json from being written: the lock says crihook runs."""
    if written == "stale":
        old = status(updated_at=time.time() - 3600)
        (tmp_path / "status.json").write_text(json.dumps(old))
    doc = _state_json(tmp_path, capsys)
    assert (doc["running"], doc["process"]) == (True, {"pid": holder.pid})
    assert main(["state", "--state-dir", str(tmp_path)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"crihook runs (pid {holder.pid})")
    assert "not running" not in capsys.readouterr().out


def test_a_fresh_status_file_does_not_make_a_dead_crihook_run(
    tmp_path: Path, holder: subprocess.Popen[str], capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "status.json").write_text(json.dumps(status(updated_at=time.time())))
    assert _state_json(tmp_path, capsys)["running"] is True
    holder.kill()  # SIGKILL: no clean shutdown wrote "stopped" into the status
    holder.wait()
    doc = _state_json(tmp_path, capsys)
    assert (doc["running"], doc["process"]) == (False, {"pid": None})
    assert main(["state", "--state-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith(
        f"crihook is not running: no process holds {LOCK_FILE}; its status was last written at"
    )


def test_a_second_crihook_on_the_same_state_directory_is_refused(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    with pytest.raises(StateDirInUseError, match=f"another crihook \\(pid {holder.pid}\\)"):
        hold_state_dir(tmp_path)
    holder.kill()
    holder.wait()
    hold_state_dir(tmp_path).close()  # free again once it is gone
    assert state_dir_holder(tmp_path) is None


def test_without_a_lock_file_the_status_files_age_decides(tmp_path: Path) -> None:
    """A state directory of a crihook older than the lock."""
    assert process_of(tmp_path) is None
    assert liveness(status(updated_at=NOW - 1), now=NOW, process=None) is None
