"""The store: records, hook states, crash-safe persistence, write-behind."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import shutil
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.spec import ContainerView, PodView, QoSClass, ResourcesView
from crihook.hooks.spec.views import ContainerKind
from crihook.proxy.app import journal_in_thread
from crihook.proxy.config import RuntimeSettings
from crihook.proxy.cri.runtime import RuntimeCallFailed
from crihook.proxy.errors import CrihookError, StateWriteError
from crihook.proxy.ops.state_cli import load_state, render_state
from crihook.proxy.state import store as store_module
from crihook.proxy.state.journal import STALE_TEMP_SECONDS, TEMP_MARK, journal_files, write_atomic
from crihook.proxy.state.reconcile import POD_UID_LABEL
from crihook.proxy.state.records import ContainerRecord, PodRecord
from crihook.proxy.state.store import STORE_FILE, WRITE_BEHIND_SECONDS, Store
from crihook.proxy.wire.grpc.runtime_client import RuntimeClient
from crihook.proxy.wire.h2.runtime_client import Flusher, H2RuntimeClient
from tests.lab.crihook_proc import short_tmpdir
from tests.lab.fake_runtime import FakeRuntime, Reply
from tests.lab.small_disk import SmallDisk, small_disk


def pod(sandbox_id: str, name: str = "web") -> PodRecord:
    view = PodView(
        id=sandbox_id,
        uid=f"uid-{sandbox_id}",
        name=name,
        namespace="shop",
        attempt=1,
        labels={"app": name},
        annotations={"a": "1"},
        cgroup_parent=f"/kubepods/burstable/pod-uid-{sandbox_id}",
        runtime_handler="runc",
        qos_class=QoSClass.BURSTABLE,
        resources=ResourcesView(qos_class=QoSClass.BURSTABLE, cpu_request_milli=250),
    )
    return PodRecord(view, {"annotation 'x'": {"hook": "10-a", "value": "1"}})


def container(container_id: str, sandbox_id: str) -> ContainerRecord:
    view = ContainerView(
        id=container_id,
        pod_id=sandbox_id,
        name=f"c-{container_id}",
        attempt=2,
        image="sha256:abc",
        labels={"io.kubernetes.container.name": f"c-{container_id}"},
        kind=ContainerKind.APP,
        resources=ResourcesView(
            qos_class=QoSClass.GUARANTEED,
            cpu_request_milli=2000,
            integer_cpus=2,
            cpuset_cpus="2-3",
            hugepage_limits={"2MB": 1 << 21},  # type: ignore[arg-type]
        ),
    )
    return ContainerRecord(
        view,
        {"cpuset_cpus": {"hook": "10-pin", "value": "2-3"}},
        [{"hook": "10-pin", "error": "NOT_FOUND"}],
    )


def loaded(state_dir: Path) -> Store:
    store = Store(state_dir)
    store.load()
    return store


def pods_on_disk(state_dir: Path) -> list[str]:
    """The pods in store.json, read without a Store (whose load() sweeps temp files: it
    would take the one of a write in progress for a leftover)."""
    path = state_dir / STORE_FILE
    return sorted(json.loads(path.read_bytes())["pods"]) if path.exists() else []


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# --- records -------------------------------------------------------------------------------


def test_put_and_remove_pods_and_containers(tmp_path: Path) -> None:
    store = loaded(tmp_path)
    store.put_pod(pod("sb1"))
    store.put_pod(pod("sb2"))
    store.put_container(container("c1", "sb1"))
    store.put_container(container("c2", "sb1"))
    store.put_container(container("c3", "sb2"))
    assert store.pod("sb1") == pod("sb1")
    assert store.container("c3") == container("c3", "sb2")
    assert store.remove_container("c2") == container("c2", "sb1")
    assert store.remove_container("c2") is None
    assert sorted(store.containers) == ["c1", "c3"]
    assert store.remove_pod("sb1") == pod("sb1")
    assert sorted(store.pods) == ["sb2"]
    assert sorted(store.containers) == ["c3"]  # sb1's containers went with it
    assert store.remove_pod("sb1") is None
    pods, containers = store.snapshot()
    assert ([p.id for p in pods], [c.id for c in containers]) == (["sb2"], ["c3"])


# --- persistence -----------------------------------------------------------------------------


async def test_flush_then_load_sees_the_same_records_and_hook_states(tmp_path: Path) -> None:
    store = loaded(tmp_path)
    store.put_pod(pod("sb1"))
    store.put_pod(pod("sb2", "db"))
    store.put_container(container("c1", "sb1"))
    store.hook_state("pin").set("allocations", {"c1": [2, 3]})
    store.hook_state("pin").set("free", "0-1,4-7")
    store.hook_state("annotate").set("count", 3)
    await store.flush()

    again = loaded(tmp_path)
    assert again.pods == store.pods
    assert again.containers == store.containers
    assert again.hook_states() == {
        "annotate": {"count": 3},
        "pin": {"allocations": {"c1": [2, 3]}, "free": "0-1,4-7"},
    }
    assert again.hook_state("pin").get("free") == "0-1,4-7"
    assert again.hook_state("pin").get("missing", "dflt") == "dflt"
    assert not again.hook_states_dirty


async def test_removal_is_persisted(tmp_path: Path) -> None:
    store = loaded(tmp_path)
    store.put_pod(pod("sb1"))
    store.put_container(container("c1", "sb1"))
    await store.flush()
    store.remove_pod("sb1")
    await store.flush()
    again = loaded(tmp_path)
    assert (again.pods, again.containers) == ({}, {})


async def test_a_record_changed_in_place_is_written_as_it_is_at_the_flush(
    tmp_path: Path,
) -> None:
    store = loaded(tmp_path)
    record = container("c1", "sb1")
    store.put_pod(pod("sb1"))
    store.put_container(record)
    await store.flush()
    record.audit["cpuset_mems"] = {"hook": "20-numa", "value": "0"}
    store.put_container(record)
    record.audit["oom_score_adj"] = {"hook": "30-oom", "value": -997}  # after the put
    store.put_pod(pod("sb1", "renamed"))
    await store.flush()
    again = loaded(tmp_path)
    assert sorted(again.containers["c1"].audit) == ["cpuset_cpus", "cpuset_mems", "oom_score_adj"]
    assert again.pods["sb1"].view.name == "renamed"


async def test_hook_state_delete_is_persisted(tmp_path: Path) -> None:
    store = loaded(tmp_path)
    state = store.hook_state("pin")
    state.set("a", 1)
    state.set("b", 2)
    await store.flush()
    state.delete("a")
    state.delete("never-set")
    assert store.hook_states_dirty
    await store.flush()
    assert loaded(tmp_path).hook_states() == {"pin": {"b": 2}}


async def test_deleting_a_null_hook_state_value_is_persisted(tmp_path: Path) -> None:
    store = loaded(tmp_path)
    state = store.hook_state("pin")
    state.set("released", None)  # JSON null is a valid value
    await store.flush()
    state.delete("released")
    assert list(state.items()) == []
    assert store.hook_states_dirty
    await store.flush()
    assert loaded(tmp_path).hook_states() == {"pin": {}}


def test_write_atomic_replaces_the_file_and_leaves_no_temp_files(tmp_path: Path) -> None:
    target = tmp_path / "x.json"
    write_atomic(target, b"one")
    write_atomic(target, b"two")
    assert target.read_bytes() == b"two"
    assert os.listdir(tmp_path) == ["x.json"]


async def test_flush_leaves_only_the_state_files(tmp_path: Path) -> None:
    store = loaded(tmp_path)
    store.put_pod(pod("sb1"))
    store.hook_state("pin").set("k", "v")
    await store.flush()
    store.put_pod(pod("sb2"))
    store.hook_state("pin").set("k", "w")
    await store.flush()
    assert files_under(tmp_path) == ["hooks", "hooks/pin.json", "store.json"]
    doc = json.loads((tmp_path / STORE_FILE).read_bytes())
    assert (doc["version"], sorted(doc["pods"])) == (1, ["sb1", "sb2"])


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"[1, 2]", b'{"version": 99, "pods": {}}', b"\xff\xfe"],
    ids=["not-json", "not-an-object", "other-version", "not-utf8"],
)
def test_corrupt_store_is_set_aside_and_the_store_starts_empty(
    tmp_path: Path, content: bytes
) -> None:
    (tmp_path / STORE_FILE).write_bytes(content)
    store = loaded(tmp_path)
    assert (store.pods, store.containers) == ({}, {})
    assert not (tmp_path / STORE_FILE).exists()
    aside = list(tmp_path.glob("store.json.corrupt-*"))
    assert len(aside) == 1
    assert aside[0].read_bytes() == content


def test_corrupt_hook_state_is_set_aside(tmp_path: Path) -> None:
    (tmp_path / "hooks").mkdir()
    (tmp_path / "hooks" / "pin.json").write_bytes(b"{oops")
    (tmp_path / "hooks" / "ok.json").write_bytes(b'{"a": 1}')
    store = loaded(tmp_path)
    assert store.hook_states() == {"ok": {"a": 1}}
    assert len(list((tmp_path / "hooks").glob("pin.json.corrupt-*"))) == 1


def test_load_without_files_starts_empty(tmp_path: Path) -> None:
    store = loaded(tmp_path / "new")
    assert (store.pods, store.containers, store.hook_states()) == ({}, {}, {})
    assert (tmp_path / "new" / "hooks").is_dir()


# --- hook states -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [object(), {1, 2}, b"bytes", {"nested": object()}],
    ids=["object", "set", "bytes", "nested-object"],
)
def test_hook_state_refuses_non_json_values_and_changes_nothing(tmp_path: Path, value: Any) -> None:
    store = loaded(tmp_path)
    state = store.hook_state("pin")
    with pytest.raises(TypeError):
        state.set("fresh", value)
    assert state.get("fresh") is None
    assert not store.hook_states_dirty
    state.set("kept", [1])
    before = store.hook_states()
    with pytest.raises(TypeError):
        state.set("kept", value)
    assert store.hook_states() == before


def test_a_value_that_contains_itself_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    store = loaded(tmp_path)
    state = store.hook_state("pin")
    looped: list[Any] = []
    looped.append(looped)
    with pytest.raises(RecursionError):
        state.set("k", {"devices": looped})
    assert state.get("k") is None and not store.hook_states_dirty


@pytest.mark.parametrize(
    "value",
    [{"b": [1, 2.5, None], "a": {"z": True, "é": "ü"}}, "x\ty", -3, 1e100, float("nan"), []],
)
async def test_hook_state_values_reach_the_journal_as_compact_sorted_json(
    tmp_path: Path, value: Any
) -> None:
    store = loaded(tmp_path)
    await store.write_ahead(await change(store, "pin", "k", value))
    line = (tmp_path / "hooks" / "journal-1.jsonl").read_text()
    shown = json.dumps(value, sort_keys=True, separators=(",", ":"))
    assert line == f'{{"pin":{{"set":{{"k":{shown}}}}}}}\n'
    await store.close()


async def test_hook_states_dirty_follows_hook_changes_only(tmp_path: Path) -> None:
    store = loaded(tmp_path)
    assert not store.hook_states_dirty
    store.put_pod(pod("sb1"))
    assert not store.hook_states_dirty
    store.hook_state("pin").set("k", 1)
    assert store.hook_states_dirty
    await store.flush()
    assert not store.hook_states_dirty


def test_hook_state_items_is_a_snapshot(tmp_path: Path) -> None:
    state = loaded(tmp_path).hook_state("pin")
    state.set("a", 1)
    items = state.items()
    state.set("b", 2)
    assert list(items) == [("a", 1)]


# --- write-behind ----------------------------------------------------------------------------


def count_writes(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    writes: list[int] = []
    real = store._write

    def counting(*args: Any) -> None:
        writes.append(1)
        real(*args)

    monkeypatch.setattr(store, "_write", counting)
    return writes


def count_appends(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The lines written ahead to the hook journal."""
    lines: list[bytes] = []
    real = store_module.JournalFile.append

    def counting(journal: store_module.JournalFile, path: Path, data: bytes) -> None:
        lines.append(data)
        real(journal, path, data)

    monkeypatch.setattr(store_module.JournalFile, "append", counting)
    return lines


async def wait_for_file(path: Path) -> None:
    for _ in range(500):
        if path.exists():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{path} was never written")


async def test_write_behind_coalesces_changes_into_one_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = loaded(tmp_path)
    writes = count_writes(store, monkeypatch)
    try:
        store.put_pod(pod("sb1"))
        store.write_behind()
        store.put_pod(pod("sb2"))
        store.write_behind()
        store.put_container(container("c1", "sb1"))
        store.write_behind()
        assert not (tmp_path / STORE_FILE).exists()  # not on the request path
        await asyncio.sleep(WRITE_BEHIND_SECONDS + 0.05)
        await wait_for_file(tmp_path / STORE_FILE)
    finally:
        await store.close()
    assert len(writes) == 1
    again = loaded(tmp_path)
    assert (sorted(again.pods), sorted(again.containers)) == (["sb1", "sb2"], ["c1"])


async def test_write_behind_without_changes_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = loaded(tmp_path)
    writes = count_writes(store, monkeypatch)
    store.write_behind()
    await asyncio.sleep(WRITE_BEHIND_SECONDS + 0.05)
    await store.close()
    assert writes == []
    assert not (tmp_path / STORE_FILE).exists()


async def test_close_writes_pending_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = loaded(tmp_path)
    writes = count_writes(store, monkeypatch)
    store.put_pod(pod("sb1"))
    store.hook_state("pin").set("k", "v")
    store.write_behind()
    await store.close()
    assert len(writes) == 1
    again = loaded(tmp_path)
    assert sorted(again.pods) == ["sb1"]
    assert again.hook_states() == {"pin": {"k": "v"}}
    # Nothing is left to fire after close.
    await asyncio.sleep(WRITE_BEHIND_SECONDS + 0.05)
    assert len(writes) == 1


async def test_close_writes_status(tmp_path: Path) -> None:
    store = loaded(tmp_path)
    store.status_provider = lambda: {"hooks": [{"name": "10-a"}]}
    await store.close()
    status = json.loads((tmp_path / store_module.STATUS_FILE).read_bytes())
    assert status == {"hooks": [{"name": "10-a"}]}


# --- empty ids -------------------------------------------------------------------------------


def test_records_with_an_empty_id_are_refused(tmp_path: Path) -> None:
    store = loaded(tmp_path)
    with pytest.raises(ValueError, match="sandbox id"):
        store.put_pod(pod(""))
    with pytest.raises(ValueError, match="container id"):
        store.put_container(container("", "sb1"))
    assert (store.pods, store.containers, store.hook_states_dirty) == ({}, {}, False)


# --- write_atomic and leftovers --------------------------------------------------------------


def temp_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob(f"*{TEMP_MARK}*"))


def test_write_atomic_removes_its_temp_file_when_the_replace_fails(tmp_path: Path) -> None:
    (tmp_path / "x.json").mkdir()  # a directory where the file should go: rename fails
    with pytest.raises(IsADirectoryError):
        write_atomic(tmp_path / "x.json", b"data")
    assert os.listdir(tmp_path) == ["x.json"]


def test_write_atomic_removes_its_temp_file_when_the_fsync_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(store_module.os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="Input/output error"):
        write_atomic(tmp_path / "x.json", b"data")
    assert os.listdir(tmp_path) == []


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_load_removes_temp_files_left_by_a_crash_and_keeps_a_live_write(tmp_path: Path) -> None:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    dead = _dead_pid()
    old = time.time() - 2 * STALE_TEMP_SECONDS
    leftovers = [
        tmp_path / f".store.json.tmp-{dead}",  # the name of older crihook versions
        tmp_path / f".status.json.tmp-{dead}-0a1b2c3d",
        hooks / f".pin.json.tmp-{dead}-0a1b2c3d",
        tmp_path / f".store.json.tmp-{os.getpid()}-00000000",  # this pid in an earlier life
        tmp_path / ".store.json.tmp-1-old",  # a live pid, but far too old to be a write
    ]
    live = tmp_path / ".store.json.tmp-1-fresh"  # pid 1 is alive: someone is writing it
    for path in [*leftovers, live]:
        path.write_bytes(b"x" * 65536)
    os.utime(leftovers[-1], (old, old))
    (tmp_path / "store.json.corrupt-1").write_bytes(b"kept for the operator")
    loaded(tmp_path)
    assert temp_files(tmp_path) == [live.name]
    assert (tmp_path / "store.json.corrupt-1").exists()


# --- a small disk that can be filled --------------------------------------------------------


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[SmallDisk]:
    if os.geteuid() != 0:
        pytest.fail("mounting a tmpfs needs root (run the tests as root)", pytrace=False)
    with small_disk(tmp_path / "state") as mounted:
        yield mounted


async def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


def store_log(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == store_module.__name__]


# --- write_ahead -----------------------------------------------------------------------------


async def change(store: Store, hook: str, key: str, value: object) -> int:
    """A call's pre stage changing a hook state: the number `write_ahead` is given."""
    with store.track_changes() as changes:
        store.hook_state(hook).set(key, value)
    return changes.last


async def test_write_ahead_on_a_full_disk_is_resource_exhausted_and_keeps_the_state(
    disk: SmallDisk,
) -> None:
    store = loaded(disk.path)
    try:
        mine = await change(store, "pin", "c1", [2, 3])
        disk.fill()
        with pytest.raises(StateWriteError) as info:
            await store.write_ahead(mine)
        assert info.value.status == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert str(info.value) == (
            f"cannot write its state to {disk.path} (No space left on device); "
            "the call was not forwarded"
        )
        assert isinstance(info.value, CrihookError)
        # Nothing lost, nothing half-written, nothing left to fill the disk.
        assert store.hook_state("pin").get("c1") == [2, 3]
        assert store.hook_states_dirty
        assert disk.files() == ["hooks"]
        assert store.degraded == (
            f"cannot write {disk.path}/hooks/journal-1.jsonl: [Errno 28] No space left on device"
        )
        assert store.write_failures >= 1
        # Space comes back: the background writer puts it on disk without another call.
        disk.free()
        await wait_until(lambda: store.degraded is None, "the store to recover")
        assert not store.hook_states_dirty
        assert loaded(disk.path).hook_states() == {"pin": {"c1": [2, 3]}}
        assert temp_files(disk.path) == []
    finally:
        await store.close()


async def test_write_ahead_on_a_read_only_disk_is_unavailable(disk: SmallDisk) -> None:
    store = loaded(disk.path)
    try:
        first = await change(store, "pin", "c1", [2, 3])
        disk.remount("ro")
        with pytest.raises(StateWriteError) as info:
            await store.write_ahead(first)
        assert info.value.status == grpc.StatusCode.UNAVAILABLE
        assert "(Read-only file system)" in str(info.value)
        assert store.hook_states_dirty
        disk.remount("rw")
        second = await change(store, "pin", "c2", [4])
        await store.write_ahead(second)  # this call's change, and the older one with it
        assert loaded(disk.path).hook_states() == {"pin": {"c1": [2, 3], "c2": [4]}}
    finally:
        await store.close()


async def test_a_failed_write_ahead_fails_only_calls_whose_own_changes_are_not_on_disk(
    disk: SmallDisk, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = loaded(disk.path)
    writes = count_appends(monkeypatch)
    try:
        b = await change(store, "pin", "b", 1)  # call B changed state first, then waits
        a = await change(store, "pin", "a", 2)
        disk.fill()
        with pytest.raises(StateWriteError):
            await store.write_ahead(a)  # A's write failed, and took B's change along
        with pytest.raises(StateWriteError):
            await store.write_ahead(b)  # so B must not be forwarded either
        tried = len(writes)
        with store.track_changes() as nothing:
            store.put_pod(pod("sb1"))  # a call that keeps no hook state
        assert nothing.last == 0  # it never writes ahead, whatever failed before
        assert len(writes) == tried
        disk.free()
        c = await change(store, "pin", "c", 3)
        await store.write_ahead(c)
        await store.write_ahead(b)  # everything up to c is on disk: nothing more to write
        assert loaded(disk.path).hook_states() == {"pin": {"a": 2, "b": 1, "c": 3}}
    finally:
        await store.close()


async def test_changes_are_counted_per_call(tmp_path: Path) -> None:
    store = loaded(tmp_path)
    try:
        outside = store.hook_state("pin")
        with store.track_changes() as first:
            outside.set("x", 1)
            with store.track_changes() as nested:  # another call's task would do this
                outside.set("y", 2)
            assert nested.last == 2
        assert first.last == 1
        outside.set("z", 3)  # a post stage: no call tracks it
        assert first.last == 1
    finally:
        await store.close()


async def test_write_ahead_without_hook_changes_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = loaded(tmp_path)
    appends = count_appends(monkeypatch)
    writes = count_writes(store, monkeypatch)
    store.put_pod(pod("sb1"))  # a record: written behind, never ahead
    await store.write_ahead(0)
    assert appends == []
    mine = await change(store, "pin", "k", 1)
    await store.write_ahead(mine)
    assert appends == [b'{"pin":{"set":{"k":1}}}\n']  # the changed key, not the whole state
    assert writes == []  # the state files follow at the checkpoint, behind
    await store.write_ahead(mine)  # already on disk
    assert len(appends) == 1
    assert not (tmp_path / STORE_FILE).exists()  # only the hook state went ahead
    assert loaded(tmp_path).hook_states() == {"pin": {"k": 1}}
    await store.close()


# --- write_behind ----------------------------------------------------------------------------


async def test_write_behind_on_a_full_disk_degrades_retries_and_recovers_by_itself(
    disk: SmallDisk, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=store_module.__name__)
    store = loaded(disk.path)
    try:
        store.put_pod(pod("sb1"))
        store.write_behind()
        await wait_until(lambda: (disk.path / STORE_FILE).exists(), "the first write")
        disk.fill()
        store.put_pod(pod("sb2"))
        store.put_container(container("c1", "sb2"))
        store.hook_state("pin").set("c1", [1])
        store.write_behind()  # never raises
        await wait_until(lambda: store.write_failures >= 3, "three failed attempts")
        # Each retry waits twice as long as the one before (the writer is waiting now).
        assert store.retry_seconds == min(
            store_module.RETRY_FIRST_SECONDS * 2 ** (store.write_failures - 1),
            store_module.RETRY_MAX_SECONDS,
        )
        assert store.degraded is not None
        assert store.degraded.endswith(": [Errno 28] No space left on device")
        assert store.degraded_since is not None
        assert store.status()["degraded"] == store.degraded
        store.put_pod(pod("sb3"))
        store.write_behind()  # while degraded: no error, nothing new scheduled
        assert sorted(store.pods) == ["sb1", "sb2", "sb3"]  # all kept in memory
        assert disk.files() == ["hooks", STORE_FILE]  # no temp file left
        assert pods_on_disk(disk.path) == ["sb1"]  # the last good write
        errors = [m for level, m in store_log(caplog) if level >= logging.WARNING]
        assert len(errors) == 1, errors  # logged once, not on every retry
        assert errors[0].startswith(store.degraded)

        disk.free()
        await wait_until(lambda: store.degraded is None, "the store to recover")
        again = loaded(disk.path)
        assert (sorted(again.pods), sorted(again.containers)) == (["sb1", "sb2", "sb3"], ["c1"])
        assert again.hook_states() == {"pin": {"c1": [1]}}
        status = store.status()
        assert (status["degraded"], status["degraded_since"]) == (None, None)
        assert status["retry_seconds"] is None
        assert status["write_failures"] == store.write_failures >= 3
        assert status["last_error"].endswith("No space left on device")
        messages = [m for level, m in store_log(caplog) if level >= logging.WARNING]
        assert len(messages) == 2, messages  # once in, once out
        assert messages[1].startswith(f"state written to {disk.path} again")
    finally:
        await store.close()


async def test_changes_made_during_a_write_behind_are_written_by_the_next_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = loaded(tmp_path)
    writing, go_on = threading.Event(), threading.Event()
    real = store._write

    def held(*args: Any) -> None:
        writing.set()
        go_on.wait(10)
        real(*args)

    monkeypatch.setattr(store, "_write", held)
    try:
        store.put_pod(pod("sb1"))
        store.write_behind()
        await wait_until(writing.is_set, "the first write to start")
        store.put_pod(pod("sb2"))  # while the first write runs
        store.write_behind()
        go_on.set()
        await wait_until(lambda: pods_on_disk(tmp_path) == ["sb1", "sb2"], "a second write")
    finally:
        go_on.set()
        await store.close()


# --- flush and close -------------------------------------------------------------------------


async def test_flush_on_a_full_disk_raises_the_oserror_and_keeps_every_change(
    disk: SmallDisk,
) -> None:
    store = loaded(disk.path)
    try:
        store.put_pod(pod("sb1"))
        store.hook_state("pin").set("k", 1)
        disk.fill()
        with pytest.raises(OSError) as info:
            await store.flush()
        assert info.value.errno == errno.ENOSPC
        assert store.degraded is not None
        assert store.hook_states_dirty
        assert disk.files() == ["hooks"]
        disk.free()
        await store.flush()
        assert store.degraded is None
        again = loaded(disk.path)
        assert (sorted(again.pods), again.hook_states()) == (["sb1"], {"pin": {"k": 1}})
    finally:
        await store.close()


async def test_close_on_a_full_disk_logs_and_does_not_raise(
    disk: SmallDisk, caplog: pytest.LogCaptureFixture
) -> None:
    store = loaded(disk.path)
    store.status_provider = lambda: {"hooks": []}
    store.put_pod(pod("sb1"))
    store.hook_state("pin").set("k", 1)
    disk.fill()
    store.write_behind()
    await wait_until(lambda: store.degraded is not None, "the write-behind to fail")
    await store.close()  # a writer waiting to retry is stopped; the last attempt is logged
    assert store._writer is None
    assert disk.files() == ["hooks"]
    assert any("crihook stops with state not written" in m for _, m in store_log(caplog))


# --- status.json -----------------------------------------------------------------------------


async def test_status_write_failures_are_counted_logged_once_and_never_raised(
    disk: SmallDisk, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=store_module.__name__)
    store = loaded(disk.path)
    store.status_provider = lambda: {"hooks": [{"name": "10-a"}], "pad": "x" * 8192}
    disk.fill()
    for _ in range(3):
        await store.write_status()
    assert store.status_write_failures == 3
    assert disk.files() == ["hooks"]
    assert [m for _, m in store_log(caplog) if "status.json" in m] == [
        f"cannot write {disk.path}/status.json: [Errno 28] No space left on device; "
        "`crihook state` shows the last status written until it works again"
    ]
    disk.free()
    await store.write_status()
    await store.write_status()
    assert json.loads((disk.path / "status.json").read_bytes())["hooks"] == [{"name": "10-a"}]
    assert store_log(caplog)[-1] == (
        logging.INFO,
        f"{disk.path}/status.json written again (3 failed writes)",
    )
    assert store.degraded is None  # status.json is not the state
    await store.close()


def test_crihook_state_shows_a_degraded_store() -> None:
    base: dict[str, Any] = {"pods": {}, "containers": {}, "hook_states": {}}
    status: dict[str, Any] = {"version": "0", "ready": True, "runtime": "r", "dry_run": False}
    degraded = {
        "degraded": "cannot write /s/store.json: [Errno 28] No space left on device",
        "degraded_since": 0.0,
        "write_failures": 4,
        "last_error": "cannot write /s/store.json: [Errno 28] No space left on device",
    }
    text = render_state({**base, "status": {**status, "store": degraded}})
    assert "  store DEGRADED since " in text
    assert (
        ": cannot write /s/store.json: [Errno 28] No space left on device "
        "(4 failed writes; kept in memory, retrying)"
    ) in text
    recovered = {**degraded, "degraded": None, "degraded_since": None}
    text = render_state({**base, "status": {**status, "store": recovered}})
    assert "  store ok again after 4 failed writes (last: cannot write /s/store.json" in text
    healthy = {"degraded": None, "write_failures": 0}
    assert "store" not in render_state({**base, "status": {**status, "store": healthy}})


# --- reconcile_pod against a scripted runtime ----------------------------------------------


def _sandbox(sandbox_id: str, uid: str, labelled: bool = True) -> api_pb2.PodSandbox:
    return api_pb2.PodSandbox(
        id=sandbox_id,
        metadata=api_pb2.PodSandboxMetadata(name=f"pod-{uid}", namespace="shop", uid=uid),
        state=api_pb2.SANDBOX_NOTREADY,
        labels={POD_UID_LABEL: uid} if labelled else {"app": "x"},
        runtime_handler="runc",
    )


def _container(container_id: str, sandbox_id: str) -> api_pb2.Container:
    return api_pb2.Container(
        id=container_id,
        pod_sandbox_id=sandbox_id,
        metadata=api_pb2.ContainerMetadata(name=f"c-{container_id}"),
        image=api_pb2.ImageSpec(image="sha256:abc"),
        labels={"io.kubernetes.container.name": f"c-{container_id}"},
    )


class ScriptedRuntime:
    """What the fake runtime answers: sandboxes and containers, filtered as containerd does."""

    def __init__(self, fake: FakeRuntime) -> None:
        self.sandboxes = [
            _sandbox("sb-a", "uid-a"),
            _sandbox("sb-b", "uid-b", labelled=False),  # not created by kubelet
            _sandbox("sb-other", "uid-other"),
        ]
        self.containers = [
            _container("c-a1", "sb-a"),
            _container("c-a2", "sb-a"),
            _container("c-b1", "sb-b"),
            _container("c-other", "sb-other"),
        ]
        fake.script["ListPodSandbox"] = self._list_pods
        fake.script["ListContainers"] = self._list_containers
        fake.script["PodSandboxStatus"] = self._pod_status
        fake.script["ContainerStatus"] = Reply(code=grpc.StatusCode.NOT_FOUND, details="gone")

    def _list_pods(self, raw: bytes) -> Reply:
        selector = api_pb2.ListPodSandboxRequest.FromString(raw).filter.label_selector
        items = [
            s for s in self.sandboxes if all(s.labels.get(k) == v for k, v in selector.items())
        ]
        return Reply(api_pb2.ListPodSandboxResponse(items=items).SerializeToString())

    def _list_containers(self, raw: bytes) -> Reply:
        sandbox_id = api_pb2.ListContainersRequest.FromString(raw).filter.pod_sandbox_id
        items = [c for c in self.containers if not sandbox_id or c.pod_sandbox_id == sandbox_id]
        return Reply(api_pb2.ListContainersResponse(containers=items).SerializeToString())

    def _pod_status(self, raw: bytes) -> Reply:
        """containerd's verbose status: the original config as JSON."""
        sandbox_id = api_pb2.PodSandboxStatusRequest.FromString(raw).pod_sandbox_id
        uid = sandbox_id.removeprefix("sb-")
        config = {
            "metadata": {"name": f"pod-uid-{uid}", "namespace": "shop", "uid": f"uid-{uid}"},
            "linux": {"cgroup_parent": f"/kubepods/burstable/poduid-{uid}"},
        }
        info = {"info": json.dumps({"config": config})}
        response = api_pb2.PodSandboxStatusResponse(
            status=api_pb2.PodSandboxStatus(id=sandbox_id), info=info
        )
        return Reply(response.SerializeToString())


@pytest.fixture
def fake_runtime() -> Iterator[FakeRuntime]:
    workdir = short_tmpdir("st-")
    runtime = FakeRuntime(workdir / "rt.sock").start()
    try:
        yield runtime
    finally:
        runtime.stop()
        shutil.rmtree(workdir)


@pytest.fixture
async def runtime_client(fake_runtime: FakeRuntime) -> AsyncIterator[RuntimeClient]:
    client = RuntimeClient(RuntimeSettings(endpoint=fake_runtime.endpoint))
    try:
        yield client
    finally:
        await client.close()


def _requests(fake: FakeRuntime, method: str, message: Any) -> list[Any]:
    return [message.FromString(c.request) for c in fake.calls(method)]


async def test_reconcile_pod_finds_the_sandbox_by_kubelet_s_label(
    tmp_path: Path, fake_runtime: FakeRuntime, runtime_client: RuntimeClient
) -> None:
    ScriptedRuntime(fake_runtime)
    store = loaded(tmp_path)
    try:
        pods, containers = await store.reconcile_pod(runtime_client, "uid-a")
        assert [p.view.id for p in pods] == ["sb-a"]
        assert [c.view.id for c in containers] == ["c-a1", "c-a2"]
        assert (sorted(store.pods), sorted(store.containers)) == (["sb-a"], ["c-a1", "c-a2"])
        # Rebuilt from the runtime's verbose status where it has one, from the listing if not.
        assert pods[0].view.uid == "uid-a"
        assert pods[0].view.cgroup_parent == "/kubepods/burstable/poduid-a"
        assert (containers[0].view.pod_id, containers[0].view.name) == ("sb-a", "c-c-a1")
        assert [
            r.filter.label_selector
            for r in _requests(fake_runtime, "ListPodSandbox", api_pb2.ListPodSandboxRequest)
        ] == [{POD_UID_LABEL: "uid-a"}]  # found by the label: the whole list was never asked for
        assert [
            r.filter.pod_sandbox_id
            for r in _requests(fake_runtime, "ListContainers", api_pb2.ListContainersRequest)
        ] == ["sb-a"]
        # Written behind like any record.
        await wait_until(lambda: (tmp_path / STORE_FILE).exists(), "the write-behind")
        assert sorted(loaded(tmp_path).containers) == ["c-a1", "c-a2"]
        # Nothing new the second time.
        assert await store.reconcile_pod(runtime_client, "uid-a") == ([], [])
    finally:
        await store.close()


async def test_reconcile_pod_falls_back_to_the_metadata_uid(
    tmp_path: Path, fake_runtime: FakeRuntime, runtime_client: RuntimeClient
) -> None:
    ScriptedRuntime(fake_runtime)
    store = loaded(tmp_path)
    try:
        pods, containers = await store.reconcile_pod(runtime_client, "uid-b")
        assert ([p.view.id for p in pods], [c.view.id for c in containers]) == (
            ["sb-b"],
            ["c-b1"],
        )
        selectors = [
            dict(r.filter.label_selector)
            for r in _requests(fake_runtime, "ListPodSandbox", api_pb2.ListPodSandboxRequest)
        ]
        assert selectors == [{POD_UID_LABEL: "uid-b"}, {}]
        assert sorted(store.pods) == ["sb-b"]  # not the other pods the full list carried
    finally:
        await store.close()


async def test_reconcile_pod_adds_only_what_the_store_lacks(
    tmp_path: Path, fake_runtime: FakeRuntime, runtime_client: RuntimeClient
) -> None:
    ScriptedRuntime(fake_runtime)
    store = loaded(tmp_path)
    known = pod("sb-a", "known")
    store.put_pod(known)
    store.put_container(container("c-a1", "sb-a"))
    try:
        pods, containers = await store.reconcile_pod(runtime_client, "uid-a")
        assert (pods, [c.view.id for c in containers]) == ([], ["c-a2"])
        assert store.pod("sb-a") is known  # kept as it was
        assert store.container("c-a1") == container("c-a1", "sb-a")
        assert fake_runtime.calls("PodSandboxStatus") == []
    finally:
        await store.close()


async def test_reconcile_pod_of_a_pod_the_runtime_does_not_have_adds_nothing(
    tmp_path: Path, fake_runtime: FakeRuntime, runtime_client: RuntimeClient
) -> None:
    ScriptedRuntime(fake_runtime)
    store = loaded(tmp_path)
    assert await store.reconcile_pod(runtime_client, "uid-none") == ([], [])
    assert (store.pods, store.containers) == ({}, {})
    with pytest.raises(ValueError, match="pod uid"):
        await store.reconcile_pod(runtime_client, "")
    await store.close()


async def test_on_the_h2_data_path_the_reconcile_still_asks_over_grpc_aio(
    tmp_path: Path, fake_runtime: FakeRuntime
) -> None:
    """The control path is RuntimeClient.control, which the h2 client inherits as it is:
    crihook's own questions stay on grpc.aio's channels whichever data path serves kubelet."""
    assert "control" not in vars(H2RuntimeClient)
    client = H2RuntimeClient(RuntimeSettings(endpoint=fake_runtime.endpoint), Flusher())
    store = loaded(tmp_path)
    try:
        assert await store.reconcile(client) == (0, 0, 0)
        calls = fake_runtime.calls("ListPodSandbox") + fake_runtime.calls("ListContainers")
        assert len(calls) == 2
        agents = {value for call in calls for key, value in call.metadata if key == "user-agent"}
        assert len(agents) == 1 and agents.pop().startswith("grpc-python-asyncio/")
        assert client.runtime_pool.ready() is None  # no HTTP/2 connection of its own
    finally:
        await store.close()
        await client.close()


async def test_reconcile_pod_raises_when_the_runtime_fails(
    tmp_path: Path, fake_runtime: FakeRuntime, runtime_client: RuntimeClient
) -> None:
    fake_runtime.script["ListPodSandbox"] = Reply(
        code=grpc.StatusCode.UNAVAILABLE, details="restarting"
    )
    store = loaded(tmp_path)
    with pytest.raises(RuntimeCallFailed) as info:
        await store.reconcile_pod(runtime_client, "uid-a")
    assert info.value.status.code == grpc.StatusCode.UNAVAILABLE
    assert store.pods == {}
    await store.close()


async def test_missing_from_names_what_the_runtime_no_longer_has_and_changes_nothing(
    tmp_path: Path, fake_runtime: FakeRuntime, runtime_client: RuntimeClient
) -> None:
    ScriptedRuntime(fake_runtime)
    store = loaded(tmp_path)
    for sandbox_id in ("sb-a", "sb-gone"):
        store.put_pod(pod(sandbox_id))
    for container_id, sandbox_id in (("c-a1", "sb-a"), ("c-a9", "sb-a"), ("c-g1", "sb-gone")):
        store.put_container(container(container_id, sandbox_id))
    try:
        assert await store.missing_from(runtime_client) == (["sb-gone"], ["c-a9", "c-g1"])
        assert sorted(store.pods) == ["sb-a", "sb-gone"]
        assert sorted(store.containers) == ["c-a1", "c-a9", "c-g1"]
    finally:
        await store.close()


# --- the hook journal ------------------------------------------------------------------------


def journal(state_dir: Path) -> list[str]:
    return sorted(p.name for p in (state_dir / "hooks").glob("journal-*"))


def crash(store: Store) -> None:
    """The process dies: the checkpoint it scheduled never runs."""
    store._closing = True
    if store._timer is not None:
        store._timer.cancel()
        store._timer = None
    store._journal_file.close()  # as the kernel closes a dead process's files


async def test_what_was_written_ahead_survives_a_crash_before_the_checkpoint(
    tmp_path: Path,
) -> None:
    store = loaded(tmp_path)
    store.hook_state("pin").set("old", 1)
    await store.flush()  # a checkpoint: the state file has it, no journal is left
    assert journal(tmp_path) == []
    await store.write_ahead(await change(store, "pin", "new", [2, 3]))
    await store.write_ahead(await change(store, "pin", "old", None))
    with store.track_changes() as gone:
        store.hook_state("pin").delete("new")
        store.hook_state("other").set("x", {"a": 1})
    await store.write_ahead(gone.last)
    assert journal(tmp_path) == ["journal-2.jsonl"]
    crash(store)  # the state file is a checkpoint behind
    assert json.loads((tmp_path / "hooks" / "pin.json").read_text()) == {"old": 1}
    assert journal_files(tmp_path / "hooks")[0][0] == 2
    again = loaded(tmp_path)
    assert again.hook_states() == {"pin": {"old": None}, "other": {"x": {"a": 1}}}
    assert load_state(tmp_path)["hook_states"] == again.hook_states()  # `crihook state`
    # Its first checkpoint puts them into the state files and drops the journal.
    await again.flush()
    assert journal(tmp_path) == []
    assert json.loads((tmp_path / "hooks" / "other.json").read_text()) == {"x": {"a": 1}}
    assert loaded(tmp_path).hook_states() == again.hook_states()
    await again.close()


async def test_a_torn_last_line_is_skipped_and_the_lines_before_it_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = loaded(tmp_path)
    await store.write_ahead(await change(store, "pin", "a", 1))
    await store.write_ahead(await change(store, "pin", "b", 2))
    path = tmp_path / "hooks" / "journal-1.jsonl"
    whole = path.read_bytes()
    crash(store)
    path.write_bytes(whole[:-5])  # the crash came in the middle of the second line
    assert loaded(tmp_path).hook_states() == {"pin": {"a": 1}}
    assert any("journal-1.jsonl line 2 is unreadable" in m for _, m in store_log(caplog))


def open_journals() -> list[str]:
    """Where this process's open files that are journal files lead."""
    links = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # the listing's own fd, closed since
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
    return sorted(link for link in links if "/journal-" in link)


def test_journal_lines_go_to_a_file_made_again_when_it_was_removed(tmp_path: Path) -> None:
    path = tmp_path / "hooks" / "journal-1.jsonl"
    journal_file = store_module.JournalFile()
    try:
        journal_file.append(path, b"a\n")
        journal_file.append(path, b"b\n")  # the same open file
        assert path.read_bytes() == b"a\nb\n"
        path.unlink()  # an operator clears the file: the next line makes it again
        journal_file.append(path, b"c\n")
        assert path.read_bytes() == b"c\n"
        shutil.rmtree(tmp_path / "hooks")  # or the whole directory
        journal_file.append(path, b"d\n")
        assert path.read_bytes() == b"d\n"
    finally:
        journal_file.close()
    assert open_journals() == []


async def test_the_journal_file_stays_open_only_until_the_checkpoint_retires_it(
    tmp_path: Path,
) -> None:
    store = loaded(tmp_path)
    await store.write_ahead(await change(store, "pin", "a", 1))
    await store.write_ahead(await change(store, "pin", "b", 2))
    assert open_journals() == [str(tmp_path / "hooks" / "journal-1.jsonl")]
    await store.flush()  # the checkpoint removes journal-1: no deleted file is held open
    assert journal(tmp_path) == [] and open_journals() == []
    await store.write_ahead(await change(store, "pin", "c", 3))
    assert open_journals() == [str(tmp_path / "hooks" / "journal-2.jsonl")]
    await store.close()
    assert open_journals() == []
    assert loaded(tmp_path).hook_states() == {"pin": {"a": 1, "b": 2, "c": 3}}


async def test_an_old_journal_left_by_a_crash_mid_checkpoint_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = loaded(tmp_path)
    await store.write_ahead(await change(store, "pin", "k", "pre stage"))
    store.hook_state("pin").set("k", "post stage")  # after the runtime answered: behind
    real_unlink = Path.unlink

    def crash_before_unlink(self: Path, missing_ok: bool = False) -> None:
        if self.name.startswith("journal-"):
            raise OSError(errno.EIO, "Input/output error")  # the journal outlives the write
        real_unlink(self, missing_ok)

    monkeypatch.setattr(Path, "unlink", crash_before_unlink)
    await store.flush()
    monkeypatch.undo()
    assert journal(tmp_path) == ["journal-1.jsonl"]
    # The journal got the post-stage value before the checkpoint: replaying it is harmless.
    assert loaded(tmp_path).hook_states() == {"pin": {"k": "post stage"}}
    await store.close()
    assert journal(tmp_path) == ["journal-1.jsonl"]  # nothing changed since: no checkpoint


def test_a_short_write_on_a_full_disk_leaves_no_torn_line(disk: SmallDisk) -> None:
    path = disk.path / "journal-1.jsonl"
    journal_file = store_module.JournalFile()
    try:
        journal_file.append(path, b'{"pin":{"set":{"a":1}}}\n')
        disk.fill()  # the file's page still has room: the next write is cut short
        with pytest.raises(OSError) as info:
            journal_file.append(path, b"x" * 20000 + b"\n")
        assert info.value.errno == errno.ENOSPC
        assert path.read_bytes() == b'{"pin":{"set":{"a":1}}}\n'
        with pytest.raises(OSError):
            journal_file.append(disk.path / "journal-2.jsonl", b"y\n")
        assert not (disk.path / "journal-2.jsonl").exists()  # no empty file left either
        disk.free()
        journal_file.append(path, b"z\n")  # the disk has room again: lines go on
        assert path.read_bytes() == b'{"pin":{"set":{"a":1}}}\nz\n'
    finally:
        journal_file.close()


def test_the_app_keeps_journal_lines_on_the_loop_on_a_local_file_system(
    disk: SmallDisk,
) -> None:
    # The mount table is read by the app (proxy/state touches no /proc); a tmpfs cannot block.
    assert journal_in_thread(disk.path) is False
    assert Store(disk.path, journal_in_thread(disk.path)).journal_in_thread is False


async def test_a_state_dir_that_can_block_gets_its_lines_from_a_thread_in_order(
    disk: SmallDisk, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = loaded(disk.path)
    assert not store.journal_in_thread  # a tmpfs: on the loop
    store.journal_in_thread = True  # as on nfs
    threads: list[str] = []
    real = asyncio.to_thread

    async def counted(func: Any, *args: Any) -> Any:
        threads.append(func.__name__)
        return await real(func, *args)

    monkeypatch.setattr(store_module.asyncio, "to_thread", counted)
    try:
        first = await change(store, "pin", "k", 0)
        disk.fill()  # no journal file yet: not one byte fits
        with pytest.raises(StateWriteError):
            await store.write_ahead(first)
        assert threads == ["append"]
        disk.free()

        async def call(n: int) -> None:
            await store.write_ahead(await change(store, "pin", "k", n))

        await asyncio.gather(*(call(n) for n in range(1, 9)))  # lines race to the journal
        crash(store)
        assert loaded(disk.path).hook_states() == {"pin": {"k": 8}}  # the last one wins
    finally:
        await store.close()
