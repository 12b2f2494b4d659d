"""The lab's cgroup removal on the host's real cgroups (root): a cgroup whose processes were
killed is removed, one that stays busy is reported after `RELEASE_SECONDS` rather than
waited on for ever or let pass."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from tests.lab import cgroups


@pytest.fixture
def cgroup() -> Iterator[str]:
    """A new cgroup in every hierarchy; whatever a test left of it is removed after."""
    if os.geteuid() != 0:
        pytest.fail("needs root to make cgroups", pytrace=False)
    path = f"/crihook-lab-test-{uuid.uuid4().hex[:12]}"
    for mount in cgroups.cgroup_mounts():
        (mount / path.strip("/")).mkdir()
    yield path
    left = cgroups.remove_cgroup_dir(path)
    assert not left, f"test cgroup not removed: {left}"


def _put_in(path: str, pid: int) -> int:
    """Move `pid` into the cgroup in every hierarchy that takes it; how many took it (a v1
    cpuset with no CPUs set refuses)."""
    taken = 0
    for d in cgroups.cgroup_dirs(path):
        try:
            (d / "cgroup.procs").write_text(f"{pid}\n")
            taken += 1
        except OSError:
            continue
    return taken


def test_a_cgroup_whose_process_was_killed_is_removed(cgroup: str) -> None:
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        assert _put_in(cgroup, sleeper.pid) > 0
    finally:
        sleeper.send_signal(signal.SIGKILL)
        sleeper.wait()
    assert cgroups.remove_cgroup_dir(cgroup) == []
    assert cgroups.cgroup_dirs(cgroup) == []


def test_a_cgroup_that_stays_busy_is_reported(cgroup: str) -> None:
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        busy = _put_in(cgroup, sleeper.pid)
        assert busy > 0
        problems = cgroups.remove_cgroup_dir(cgroup)  # returns after RELEASE_SECONDS
    finally:
        sleeper.send_signal(signal.SIGKILL)
        sleeper.wait()
    assert len(problems) == busy
    assert all(p.endswith(f": EBUSY (processes {sleeper.pid})") for p in problems)


def test_a_cgroup_with_one_below_it_is_reported_so(cgroup: str) -> None:
    child = f"{cgroup}/child"
    for d in cgroups.cgroup_dirs(cgroup):
        (d / "child").mkdir()
    try:
        problems = cgroups.remove_cgroup_dir(cgroup)
    finally:
        assert cgroups.remove_cgroup_dir(child) == []
    assert problems
    assert all(p.endswith(": EBUSY (1 cgroup(s) below it: child)") for p in problems)
