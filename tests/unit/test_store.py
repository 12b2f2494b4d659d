"""The store: records, hook states, crash-safe persistence, write-behind."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from crihook.hooks.spec import ContainerView, PodView, QoSClass, ResourcesView
from crihook.hooks.spec.views import ContainerKind
from crihook.proxy import store as store_module
from crihook.proxy.store import (
    STORE_FILE,
    WRITE_BEHIND_SECONDS,
    ContainerRecord,
    PodRecord,
    Store,
    write_atomic,
)


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


async def wait_for_file(path: Path) -> None:
    for _ in range(500):
        if path.exists():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{path} was never written")


async def test_schedule_coalesces_changes_into_one_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = loaded(tmp_path)
    writes = count_writes(store, monkeypatch)
    try:
        store.put_pod(pod("sb1"))
        store.schedule()
        store.put_pod(pod("sb2"))
        store.schedule()
        store.put_container(container("c1", "sb1"))
        store.schedule()
        assert not (tmp_path / STORE_FILE).exists()  # not on the request path
        await asyncio.sleep(WRITE_BEHIND_SECONDS + 0.05)
        await wait_for_file(tmp_path / STORE_FILE)
    finally:
        await store.close()
    assert len(writes) == 1
    again = loaded(tmp_path)
    assert (sorted(again.pods), sorted(again.containers)) == (["sb1", "sb2"], ["c1"])


async def test_schedule_without_changes_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = loaded(tmp_path)
    writes = count_writes(store, monkeypatch)
    store.schedule()
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
    store.schedule()
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
