"""Which containers a start asks the runtime about: those whose update the files may lack."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from crihook.api.cri.v1 import api_pb2
from crihook.proxy.cri.outcome import Metadata, Status
from crihook.proxy.cri.runtime import RuntimeCallFailed, UnaryCall
from crihook.proxy.state.unsettled import UPDATE_PATH, Unsettled, UnsettledRuntime
from tests.lab.small_disk import SmallDisk, small_disk

ALL = ["c1", "c2", "c3"]


def started(state_dir: Path, containers: list[str] = ALL) -> tuple[Unsettled, set[str]]:
    unsettled = Unsettled(state_dir)
    return unsettled, unsettled.load(containers)


def test_a_state_directory_that_never_said_asks_about_every_container(tmp_path: Path) -> None:
    assert started(tmp_path)[1] == set(ALL)


def test_a_container_asked_about_at_start_is_clear_once_confirmed_and_snapshot(
    tmp_path: Path,
) -> None:
    unsettled, doubt = started(tmp_path)
    for cid in doubt - {"c3"}:
        unsettled.confirmed(cid)
    unsettled.written(unsettled.planned(), ALL)
    assert started(tmp_path)[1] == {"c3"}  # c3 was not confirmed: asked again


def clear(tmp_path: Path) -> Unsettled:
    """A start after a clean one: nothing in doubt."""
    unsettled, doubt = started(tmp_path)
    for cid in doubt:
        unsettled.confirmed(cid)
    unsettled.written(unsettled.planned(), ALL)
    unsettled, doubt = started(tmp_path)
    assert doubt == set()
    return unsettled


def test_a_container_updated_before_a_crash_is_asked_about(tmp_path: Path) -> None:
    unsettled = clear(tmp_path)
    unsettled.mark("c2")
    unsettled.settled("c2", applied=True)
    # killed here: no store.json written after the update
    assert started(tmp_path)[1] == {"c2"}


def test_a_snapshot_planned_after_the_answer_clears_it(tmp_path: Path) -> None:
    unsettled = clear(tmp_path)
    unsettled.mark("c2")
    unsettled.settled("c2", applied=True)
    unsettled.written(unsettled.planned(), ALL)
    assert [n for n in os.listdir(tmp_path) if n.startswith("unsettled-")] == ["unsettled-4"]
    assert started(tmp_path)[1] == set()


@pytest.mark.parametrize(
    "when",
    ["on its way at planning", "answered after planning", "marked again after planning"],
)
def test_a_snapshot_planned_before_the_record_changed_does_not(tmp_path: Path, when: str) -> None:
    unsettled = clear(tmp_path)
    unsettled.mark("c2")
    if when == "answered after planning":
        planned = unsettled.planned()
        unsettled.settled("c2", applied=True)
    elif when == "marked again after planning":
        unsettled.settled("c2", applied=True)
        planned = unsettled.planned()
        unsettled.mark("c2")  # written into the file the snapshot's would remove
    else:
        planned = unsettled.planned()
    unsettled.written(planned, ALL)
    assert started(tmp_path)[1] == {"c2"}


def test_a_failed_update_stays_in_doubt_until_a_start_asked(tmp_path: Path) -> None:
    unsettled = clear(tmp_path)
    unsettled.mark("c1")
    unsettled.settled("c1", applied=False)  # DEADLINE_EXCEEDED: applied or not, unknown
    for _ in range(2):
        unsettled.written(unsettled.planned(), ALL)
    assert started(tmp_path)[1] == {"c1"}


def test_a_removed_container_is_forgotten(tmp_path: Path) -> None:
    unsettled = clear(tmp_path)
    unsettled.mark("c1")
    unsettled.written(unsettled.planned(), ["c2", "c3"])
    assert started(tmp_path)[1] == set()


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[SmallDisk]:
    with small_disk(tmp_path / "state") as mounted:
        yield mounted


def test_a_mark_that_cannot_be_written_makes_the_next_start_ask_everyone(
    disk: SmallDisk,
) -> None:
    unsettled = clear(disk.path)
    disk.fill()
    unsettled.mark("c1")
    assert disk.files() == []  # no file may claim to name everything in doubt
    disk.free()
    assert started(disk.path)[1] == set(ALL)


def test_marks_are_kept_again_after_a_snapshot(disk: SmallDisk) -> None:
    unsettled = clear(disk.path)
    disk.fill()
    unsettled.mark("c1")
    unsettled.settled("c1", applied=True)
    disk.free()
    unsettled.mark("c2")  # not written: the files are gone until the next snapshot
    assert disk.files() == []
    unsettled.written(unsettled.planned(), ALL)  # c2 still on its way
    assert started(disk.path)[1] == {"c2"}


def named(state_dir: Path) -> set[str]:
    """The ids the files name now (read only: one crihook writes them)."""
    files = [p for p in state_dir.iterdir() if p.name.startswith("unsettled-")]
    return {cid for path in files for cid in path.read_text().split()}


class OneCall:
    """The runtime's UpdateContainerResources: answers or fails, and notes what the files
    said while it was asked."""

    def __init__(self, state_dir: Path, fail: bool) -> None:
        self.state_dir = state_dir
        self.fail = fail
        self.seen: set[str] = set()

    def call(self, path: str) -> UnaryCall:
        assert path == UPDATE_PATH

        async def update(
            request: bytes, *, timeout: float | None = None, metadata: Metadata | None = None
        ) -> bytes:
            self.seen = named(self.state_dir)
            if self.fail:
                raise RuntimeCallFailed(Status(grpc.StatusCode.DEADLINE_EXCEEDED, "slow"))
            return b""

        return update


@pytest.mark.parametrize("fail", [False, True], ids=["applied", "failed"])
async def test_the_runtime_is_asked_once_the_mark_is_written(tmp_path: Path, fail: bool) -> None:
    unsettled = clear(tmp_path)
    runtime = OneCall(tmp_path, fail)
    update = UnsettledRuntime(runtime, unsettled).call(UPDATE_PATH)
    request = api_pb2.UpdateContainerResourcesRequest(container_id="c3")
    try:
        await update(request.SerializeToString())  # the stand-in answers at once
    except RuntimeCallFailed:
        assert fail
    assert runtime.seen == {"c3"}
    unsettled.written(unsettled.planned(), ALL)
    assert started(tmp_path)[1] == ({"c3"} if fail else set())


class Appends:
    """Counts the file writes of an Unsettled (each opens the file)."""

    def __init__(self, unsettled: Unsettled, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        append = unsettled._append  # private: what a write costs is the point

        def counted(text: str) -> None:
            self.count += 1
            append(text)

        monkeypatch.setattr(unsettled, "_append", counted)


def test_containers_named_ahead_take_one_write_and_their_marks_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    unsettled = clear(tmp_path)
    appends = Appends(unsettled, monkeypatch)
    unsettled.ahead(ALL)
    assert appends.count == 1
    assert named(tmp_path) == set(ALL)  # in the file before any is asked
    for cid in ALL:
        unsettled.mark(cid)
        unsettled.settled(cid, applied=True)
    assert appends.count == 1
    # killed here: each is asked about at the next start
    assert started(tmp_path)[1] == set(ALL)


@pytest.mark.parametrize("applied", [True, False], ids=["applied", "failed"])
def test_a_container_named_ahead_is_cleared_as_any_other(tmp_path: Path, applied: bool) -> None:
    unsettled = clear(tmp_path)
    unsettled.ahead(["c1", "c2"])
    unsettled.mark("c2")  # c1 was named, then not updated (it had the value already)
    unsettled.settled("c2", applied=applied)
    unsettled.written(unsettled.planned(), ALL)
    assert started(tmp_path)[1] == (set() if applied else {"c2"})


def test_a_container_named_ahead_and_asked_after_a_snapshot_is_named_again(
    tmp_path: Path,
) -> None:
    unsettled = clear(tmp_path)
    unsettled.ahead(["c1"])
    unsettled.written(unsettled.planned(), ALL)  # c1 cleared: nothing went to it yet
    unsettled.mark("c1")
    assert named(tmp_path) == {"c1"}


def test_containers_named_ahead_on_a_full_disk_make_the_next_start_ask_everyone(
    disk: SmallDisk,
) -> None:
    unsettled = clear(disk.path)
    disk.fill()
    unsettled.ahead(["c1", "c2"])
    assert disk.files() == []
    disk.free()
    assert started(disk.path)[1] == set(ALL)


@pytest.mark.parametrize("fail", [False, True], ids=["applied", "failed"])
async def test_an_update_for_a_named_container_is_marked_for_it_without_decoding(
    tmp_path: Path, fail: bool
) -> None:
    unsettled = clear(tmp_path)
    runtime = OneCall(tmp_path, fail)
    update = UnsettledRuntime(runtime, unsettled).container_update()
    try:
        await update("c3", b"")  # the id is the caller's: the bytes are not read for it
    except RuntimeCallFailed:
        assert fail
    assert runtime.seen == {"c3"}
    unsettled.written(unsettled.planned(), ALL)
    assert started(tmp_path)[1] == ({"c3"} if fail else set())
