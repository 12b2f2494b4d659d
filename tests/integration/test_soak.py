"""The soak (bench/soak.py), bounded: each part at a size the suite can afford (~3 min in all),
asserting the part's invariants. `python -m bench.soak` runs the same code longer and bigger,
and prints the figures (bench/README.md, "Soak").

No timing is asserted: latencies and RSS are reported by the soak, not judged here.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.soak_chaos import run_chaos
from bench.soak_load import run_endurance, run_load
from bench.soak_wire import run_wire
from tests.lab.containerd import Containerd
from tests.lab.crihook_proc import short_tmpdir
from tests.lab.fixtures import PodCleanup


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = short_tmpdir("soak-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _seed() -> int:
    """A new seed each run, printed (pytest shows it with a failure): a run can be replayed
    with `python -m bench.soak --seed N`."""
    seed = random.SystemRandom().randrange(1 << 32)
    print(f"soak seed {seed}")
    return seed


def test_chaos_on_containerd_keeps_every_invariant(
    containerd: Containerd, pod_cleanup: PodCleanup, workdir: Path
) -> None:
    result = run_chaos(containerd, workdir, seconds=40, seed=_seed())
    print(result.summary())
    assert result.problems == [], result.summary()
    assert sum(result.kills.values()) > 0 and result.pods_created > 0, result.summary()
    containerd.ensure_running()


def test_a_kubelet_restart_storm_is_answered_in_full(workdir: Path) -> None:
    result = run_load(workdir, containers=300, relists=10)
    print(result.summary())
    assert result.problems == [], result.summary()
    assert result.calls.outcomes[("UpdateContainerResources", "OK")] == 300


def test_endurance_leaves_fds_tasks_and_objects_flat(workdir: Path) -> None:
    result = run_endurance(workdir, calls=6000)
    print(result.summary())
    assert result.problems == [], result.summary()
    assert result.calls.total >= 6000 - 12


def test_bad_bytes_on_either_socket_crash_nothing_and_disturb_no_other_connection(
    workdir: Path,
) -> None:
    result = run_wire(workdir, rounds=8, seed=_seed())
    print(result.summary())
    assert result.problems == [], result.summary()
    assert result.abuses == 8 * 2 * 10 and result.bystander.total > 0, result.summary()
