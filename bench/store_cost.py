"""What one call costs the store, as the node fills up (issue 27):

    python -m bench.store_cost [--sizes 0,100,1000] [--changes 2000] [--reps 3]
                               [--store-file OLD_STORE_PY]

A Store in a temporary state directory holds N pods of one container each (the records a
kubelet-shaped pod leaves: labels, annotations, resources) and a hook state key per
container. Then each "call" does what a pod start does to the store: a new pod and its
container put, the container's state set, a hook state key set and written ahead, and the
write that follows it (the write-behind's work, awaited: at the rate kubelet starts pods
each call gets its own). The figure is the process CPU (all threads: the writer's file work
included) per call, the fastest of the reps; "1000 vs 100" is the ratio. `--store-file`
takes the Store class from another store.py (e.g. `git show <commit>:proxy/state/store.py >
/tmp/store_before.py`), to compare with an older layout in the same run. Timing lives here,
never in tests.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

from crihook.hooks.spec import ContainerState, ContainerView, PodView, QoSClass, ResourcesView
from crihook.hooks.spec.views import ContainerKind
from crihook.proxy.state.records import ContainerRecord, PodRecord
from crihook.proxy.state.store import Store


def _pod(i: int) -> PodRecord:
    labels = {
        "io.kubernetes.pod.name": f"web-{i}",
        "io.kubernetes.pod.namespace": "shop",
        "io.kubernetes.pod.uid": f"{i:08x}-0000-4000-8000-000000000000",
        "app": "web",
        "pod-template-hash": "7d4b9c8f6d",
    }
    annotations = {
        "kubernetes.io/config.seen": "2026-12-01T10:00:00Z",
        "kubernetes.io/config.source": "api",
    }
    view = PodView(
        id=f"{i:064x}",
        uid=labels["io.kubernetes.pod.uid"],
        name=f"web-{i}",
        namespace="shop",
        labels=labels,
        annotations=annotations,
        cgroup_parent=f"/kubepods/burstable/pod{i:08x}",
        runtime_handler="runc",
        qos_class=QoSClass.BURSTABLE,
        resources=ResourcesView(qos_class=QoSClass.BURSTABLE, cpu_request_milli=100),
    )
    return PodRecord(view)


def _container(i: int) -> ContainerRecord:
    view = ContainerView(
        id=f"c{i:063x}",
        pod_id=f"{i:064x}",
        name="app",
        image="sha256:" + "ab" * 32,
        labels={"io.kubernetes.container.name": "app", "io.kubernetes.pod.name": f"web-{i}"},
        annotations={
            "io.kubernetes.container.hash": "3f2a",
            "io.kubernetes.container.restartCount": "0",
        },
        kind=ContainerKind.APP,
        resources=ResourcesView(
            qos_class=QoSClass.BURSTABLE, cpu_request_milli=100, cpu_shares=102, cpuset_cpus="0-255"
        ),
    )
    return ContainerRecord(view, {"cpuset_cpus": {"hook": "cpuset", "value": "0-255"}})


async def per_call(size: int, changes: int, store_type: type[Store] = Store) -> float:
    """µs of process CPU per call with `size` pods in the store."""
    with tempfile.TemporaryDirectory(prefix="crihook-store-") as tmp:
        store = store_type(Path(tmp))
        store.load()
        state = store.hook_state("cpuset")
        for i in range(size):
            store.put_pod(_pod(i))
            store.put_container(_container(i))
            state.set(f"c:{i}", {"pod": f"{i:064x}", "pool": "shared"})
        await store.flush()
        started = time.process_time()
        for n in range(size, size + changes):
            with store.track_changes() as changed:
                state.set(f"c:{n}", {"pod": f"{n:064x}", "pool": "shared"})
            await store.write_ahead(changed.last)
            store.put_pod(_pod(n))
            store.put_container(_container(n))
            store.set_state(f"c{n:063x}", ContainerState.RUNNING)
            old = n - size  # the node stays this size: the oldest pod goes
            if size:
                store.remove_pod(f"{old:064x}")
                state.delete(f"c:{old}")
            async with store._write_lock:  # the write-behind's work for this call
                await store._write_dirty()
        spent = time.process_time() - started
        await store.close()
    return spent / changes * 1e6


def store_from(path: str) -> type[Store]:
    spec = importlib.util.spec_from_file_location("crihook_store_compared", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    found: type[Store] = module.Store
    return found


async def main(sizes: list[int], changes: int, reps: int, store_type: type[Store]) -> None:
    best: dict[int, float] = {}
    for _ in range(reps):
        for size in sizes:
            figure = await per_call(size, changes, store_type)
            best[size] = min(best.get(size, figure), figure)
    print(f"store CPU per call (process CPU, all threads; fastest of {reps} reps, {changes} calls)")
    print("\n| pods on the node | store CPU per call |\n| ---: | ---: |")
    for size in sizes:
        print(f"| {size:,} | {best[size]:.0f} µs |")
    if 100 in best and 1000 in best:
        print(f"\n1,000 vs 100: {best[1000] / best[100]:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="0,100,1000")
    parser.add_argument("--changes", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--store-file", help="take Store from this store.py instead")
    args = parser.parse_args()
    store_type = store_from(args.store_file) if args.store_file else Store
    sizes = [int(s) for s in args.sizes.split(",")]
    asyncio.run(main(sizes, args.changes, args.reps, store_type))
