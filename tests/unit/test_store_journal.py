"""The store's incremental layout: records appended to a journal, snapshots compacted in the
background, old store.json files upgraded in place (proxy/state/store.py,
proxy/state/records_journal.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import random
from pathlib import Path

import pytest

from crihook.proxy.ops import state_cli
from crihook.proxy.ops.state_cli import load_state
from crihook.proxy.state import store as store_module
from crihook.proxy.state.records_journal import records_files
from crihook.proxy.state.store import STORE_FILE, WRITE_BEHIND_SECONDS, Store
from tests.unit.test_store import container, crash, loaded, pod, wait_until


def records(state_dir: Path) -> list[str]:
    return [path.name for _, path in records_files(state_dir)]


def snapshot(state_dir: Path) -> dict[str, object]:
    doc = json.loads((state_dir / STORE_FILE).read_bytes())
    assert isinstance(doc, dict)
    return doc


def same_records(a: Store, b: Store) -> bool:
    return a.pods == b.pods and a.containers == b.containers


async def filled(state_dir: Path, pods: int) -> Store:
    """A store of `pods` pods with 2 containers each, compacted (no journal left)."""
    store = loaded(state_dir)
    for i in range(pods):
        store.put_pod(pod(f"sb{i}"))
        store.put_container(container(f"c{i}a", f"sb{i}"))
        store.put_container(container(f"c{i}b", f"sb{i}"))
    await store.flush()
    return store


async def test_a_change_on_a_full_node_appends_a_line_and_leaves_the_snapshot_alone(
    tmp_path: Path,
) -> None:
    store = await filled(tmp_path, 200)
    try:
        before = (tmp_path / STORE_FILE).stat()
        assert records(tmp_path) == []
        store.put_pod(pod("sb-new"))
        store.put_container(container("c-new", "sb-new"))
        store.remove_pod("sb7")
        store.write_behind()
        await wait_until(lambda: records(tmp_path) != [], "the records journal line")
        after = (tmp_path / STORE_FILE).stat()
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
        (name,) = records(tmp_path)
        (line,) = (tmp_path / name).read_bytes().splitlines()
        entry = json.loads(line)
        assert sorted(entry["pods"]) == ["sb-new", "sb7"]
        assert entry["pods"]["sb7"] is None
        assert sorted(entry["containers"]) == ["c-new", "c7a", "c7b"]
        assert (entry["containers"]["c7a"], entry["containers"]["c7b"]) == (None, None)
        assert len(line) < 5_000  # the changes, not the node
        crash(store)  # before any compaction
        again = loaded(tmp_path)
        assert same_records(again, store)
        state = load_state(tmp_path)  # `crihook state` after a crash
        assert sorted(state["pods"]) == sorted(store.pods)
        assert sorted(state["containers"]) == sorted(store.containers)
        await again.close()
    finally:
        await store.close()


async def test_the_journal_is_compacted_once_its_line_is_old_and_the_snapshot_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "COMPACT_SECONDS", 0.3)
    store = await filled(tmp_path, 50)
    try:
        store.put_pod(pod("sb-late"))
        async with store._write_lock:  # no compaction meanwhile
            await store._write_dirty()  # the write-behind's line, now
            (gen,) = [gen for gen, _ in records_files(tmp_path)]
        # The snapshot is written first, then the journal removed: both, or a loaded
        # machine sees the moment between them.
        await wait_until(
            lambda: "sb-late" in snapshot(tmp_path)["pods"] and not records(tmp_path),
            "the compaction",
        )
        doc = snapshot(tmp_path)
        assert doc["journal"] == gen and doc["version"] == 1
        assert same_records(loaded(tmp_path), store)
    finally:
        await store.close()


async def test_a_torn_last_line_is_skipped_and_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = await filled(tmp_path, 20)
    store.put_pod(pod("sb-a"))
    await store._write_dirty()  # one line
    store.put_pod(pod("sb-b"))
    await store._write_dirty()  # a second line, torn below
    (name,) = records(tmp_path)
    path = tmp_path / name
    whole = path.read_bytes()
    assert len(whole.splitlines()) == 2
    crash(store)
    path.write_bytes(whole[:-7])
    caplog.set_level(logging.WARNING)
    again = loaded(tmp_path)
    assert "sb-a" in again.pods and "sb-b" not in again.pods
    assert len(again.pods) == 21
    assert any(
        f"{name} line 2 is unreadable (the last line: torn by a crash)" in r.getMessage()
        for r in caplog.records
    )
    await again.close()
    await store.close()


async def test_compaction_while_calls_run_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "COMPACT_SECONDS", 0.05)
    store = await filled(tmp_path, 30)
    rng = random.Random(7)
    compactions = 0
    real = store._write

    def counting(plan: store_module._Plan) -> None:
        nonlocal compactions
        compactions += plan.snapshot is not None
        real(plan)

    monkeypatch.setattr(store, "_write", counting)
    try:
        for n in range(400):  # calls keep coming while the writer appends and compacts
            sid = f"sb{rng.randrange(60)}"
            if sid in store.pods and rng.random() < 0.3:
                store.remove_pod(sid)
            else:
                store.put_pod(pod(sid, name=f"w{n}"))
                store.put_container(container(f"{sid}-{n % 3}", sid))
            store.hook_state("pin").set(sid, n)
            store.write_behind()
            await asyncio.sleep(0.002 if n % 10 else WRITE_BEHIND_SECONDS)
        await wait_until(lambda: compactions >= 2, "compactions while the calls ran")
        crash(store)  # whatever was not written yet: the journal and the snapshot so far
        await asyncio.sleep(0.5)
    finally:
        await store.close()
    again = loaded(tmp_path)
    assert same_records(again, store)
    assert again.hook_states() == store.hook_states()
    await again.close()


async def test_a_store_json_of_an_older_crihook_loads_and_is_upgraded_in_place(
    tmp_path: Path,
) -> None:
    old = {
        "version": 1,
        "pods": {"sb1": pod("sb1").to_dict()},
        "containers": {"c1": container("c1", "sb1").to_dict()},
    }  # today's layout: no journal number, no records journal
    (tmp_path / STORE_FILE).write_text(json.dumps(old))
    store = loaded(tmp_path)
    assert (list(store.pods), list(store.containers)) == (["sb1"], ["c1"])
    assert store.pod("sb1") == pod("sb1")
    store.put_pod(pod("sb2"))
    await store.flush()
    doc = snapshot(tmp_path)
    assert doc["journal"] == 1 and sorted(doc["pods"]) == ["sb1", "sb2"]
    store.remove_pod("sb1")
    await store._write_dirty()
    crash(store)
    again = loaded(tmp_path)
    assert (list(again.pods), list(again.containers)) == (["sb2"], [])
    await again.close()
    await store.close()


async def test_a_snapshot_written_after_a_journal_file_skips_it(tmp_path: Path) -> None:
    """A crash between a compaction's snapshot and the removal of the journal files it
    holds: their lines are older than the snapshot and must not be replayed over it."""
    store = await filled(tmp_path, 10)
    store.put_pod(pod("sb-x", name="before"))
    await store._write_dirty()
    (name,) = records(tmp_path)
    kept = (tmp_path / name).read_bytes()
    store.put_pod(pod("sb-x", name="after"))
    await store.flush()  # the snapshot holds journal file 1 and removes it
    (tmp_path / name).write_bytes(kept)  # as if the removal never happened
    again = loaded(tmp_path)
    assert again.pods["sb-x"].view.name == "after"
    assert load_state(tmp_path)["pods"]["sb-x"]["view"]["name"] == "after"
    await again.close()
    await store.close()


def test_containers_of_and_remove_pod_follow_the_index(tmp_path: Path) -> None:
    store = loaded(tmp_path)
    store.put_pod(pod("sb1"))
    store.put_pod(pod("sb2"))
    store.put_container(container("c1", "sb1"))
    store.put_container(container("c2", "sb2"))
    store.put_container(container("c1", "sb2"))  # re-put under another pod
    assert [c.id for c in store.containers_of("sb1")] == []
    assert [c.id for c in store.containers_of("sb2")] == ["c2", "c1"]
    store.remove_pod("sb2")
    assert store.containers == {} and store.containers_of("sb2") == []


def test_a_container_record_keeps_its_newest_refused_updates_only(tmp_path: Path) -> None:
    store = loaded(tmp_path)
    record = container("c1", "sb1")
    for n in range(store_module.MAX_UPDATE_ERRORS + 5):
        record.update_errors.append({"hook": "pin", "code": "NOT_FOUND", "n": n})
        store.put_container(record)
    kept = [e["n"] for e in store.containers["c1"].update_errors]
    assert kept == list(range(5, store_module.MAX_UPDATE_ERRORS + 5))


async def test_a_crash_s_leftover_journal_is_compacted_after_the_flush_before_ready(
    tmp_path: Path,
) -> None:
    """crihook flushes what it reconciled before kubelet is served: appended to the journal,
    not a snapshot of the whole node; the compaction the leftover lines want follows."""
    store = await filled(tmp_path, 20)
    store.put_pod(pod("sb-x"))
    await store._write_dirty()
    crash(store)
    await store.close()
    again = loaded(tmp_path)
    try:
        before = (tmp_path / STORE_FILE).stat().st_mtime_ns
        again.put_pod(pod("sb-y"))
        await again.flush(compact=False)
        assert (tmp_path / STORE_FILE).stat().st_mtime_ns == before
        assert {"sb-x", "sb-y"} <= set(loaded(tmp_path).pods)
        again.write_behind()
        await wait_until(lambda: records(tmp_path) == [], "the compaction in the background")
        assert {"sb-x", "sb-y"} <= set(snapshot(tmp_path)["pods"])
    finally:
        await again.close()


def test_crihook_state_reads_again_when_a_compaction_ran_under_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`crihook state` reads the hook journal, then the state files. crihook keeps going in
    between: a resize settles (its key deleted) and a compaction takes the journal into the
    state file. Replaying the line read before over the newer file would show the resize
    pending again."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    journal = hooks / "journal-1.jsonl"
    pending = {"c1": {"from": 64, "to": 96}}
    journal.write_text(json.dumps({"numa": {"set": {"resizing": pending}}}) + "\n")
    (hooks / "numa.json").write_text(json.dumps({"resizing": pending}))
    real = state_cli.read_journal

    def crihook_compacts_meanwhile(hooks_dir: Path) -> list[tuple[Path, list[bytes]]]:
        read = real(hooks_dir)
        if journal.exists():  # the resize settled, then a compaction ran
            (hooks / "numa.json").write_text(json.dumps({"placed": 96}))
            journal.unlink()
        return read

    monkeypatch.setattr(state_cli, "read_journal", crihook_compacts_meanwhile)
    assert load_state(tmp_path)["hook_states"]["numa"] == {"placed": 96}
