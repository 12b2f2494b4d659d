"""`crihook state` never presents a status file crihook stopped writing as a running crihook."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crihook.proxy.cli import main
from crihook.proxy.state_cli import STALE_SECONDS, liveness, render_state

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
