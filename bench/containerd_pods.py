"""A Guaranteed pod's CreateContainer on a real containerd that runs N shared containers.

    sudo .venv/bin/python -m bench.containerd_pods [--shared 0,10,30,60] [--reps 3]
                                                  [--updates after-answer,before-answer]
                                                  [--containerd 1.6]

crihook (`--hooks cpuset,numa,oom`, CPU 0 reserved) in front of the lab's containerd
(tests.lab), N BestEffort pods running (busybox `sleep`). Then, `reps` times: a Guaranteed
1-CPU pod's sandbox, its CreateContainer timed (what kubelet waits for), its StartContainer,
the updates of the N shared containers waited for (status.json), the pod removed and its
updates waited for. Reported per setting and N: the median CreateContainer, and the update
window (`crihook_container_update_window_seconds`: from a shared container due the pool
without the new exclusive CPU until containerd applied it) as bucket bounds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from bench.node_pods import _quantile_bound, _window
from tests.lab import peers
from tests.lab.crihook_proc import CrihookProcess, short_tmpdir
from tests.lab.images import DEFAULT_CACHE_DIR, build_images
from tests.lab.kubelet import KubeletClient, PodHandle
from tests.lab.kubelet_encoding import ContainerSpec, PodSpec
from tests.lab.metrics_scrape import scrape

__all__ = ["main"]

MIB = 1 << 20
RESERVED_0 = '[hooks.cpuset]\nreserved_cpus = "0"\n'


def _guaranteed(name: str) -> PodSpec:
    app = ContainerSpec(
        name="app", cpu_request=1000, cpu_limit=1000, memory_request=64 * MIB,
        memory_limit=64 * MIB,
    )  # fmt: skip
    return PodSpec(name=name, containers=[app])


def _timing(kubelet: KubeletClient, into: list[float]) -> Callable[[], None]:
    """Time each CreateContainer through `kubelet` into `into`; returns the undo."""
    create = kubelet.runtime.CreateContainer

    def timed(request: Any, timeout: float | None = None) -> Any:
        began = time.perf_counter()
        try:
            return create(request, timeout=timeout)
        finally:
            into.append(time.perf_counter() - began)

    kubelet.runtime.CreateContainer = timed

    def undo() -> None:
        kubelet.runtime.CreateContainer = create

    return undo


def measure(lab: Any, updates: str, shared: int, reps: int, say: Any) -> dict[str, Any]:
    workdir = short_tmpdir("cp-")
    metrics = f"unix://{workdir}/metrics.sock"
    proc = CrihookProcess(
        lab.endpoint,
        workdir=workdir,
        config=RESERVED_0,
        hooks="cpuset,numa,oom",
        args=["--log-level", "warning", "--metrics-listen", metrics, "--updates", updates],
    )
    pods: list[PodHandle] = []
    proc.start()
    try:
        with KubeletClient(proc.endpoint, log_root=lab.pod_log_dir) as kubelet:
            for i in range(shared):
                pods.append(
                    kubelet.run_pod(PodSpec(name=f"be-{i}", containers=[ContainerSpec("app")]))
                )
            say(f"[containerd-pods] {updates}: {shared} shared containers running")
            before, _ = _window(scrape(metrics))
            creates: list[float] = []
            for rep in range(reps):
                undo = _timing(kubelet, creates)
                try:
                    pinned = kubelet.run_pod(_guaranteed(f"g-{rep}"))
                finally:
                    undo()
                proc.updates_sent()
                kubelet.remove_pod(pinned)
                proc.updates_sent()
            after, _ = _window(scrape(metrics))
            for handle in pods:
                kubelet.remove_pod(handle)
    finally:
        proc.stop()
        shutil.rmtree(workdir, ignore_errors=True)  # only a test's fixture removes it otherwise
    return {
        "updates": updates,
        "shared": shared,
        "create_ms_median": round(statistics.median(creates) * 1e3, 1),
        "create_ms": [round(c * 1e3, 1) for c in creates],
        "window_p50_le_s": _quantile_bound(before, after, 0.5),
        "window_max_le_s": _quantile_bound(before, after, 1.0),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.containerd_pods", description=__doc__)
    parser.add_argument("--shared", default="0,10,30,60")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--updates", default="after-answer,before-answer")
    parser.add_argument("--containerd", default="1.6", choices=("1.6", "2"))
    args = parser.parse_args(argv)
    images = build_images(DEFAULT_CACHE_DIR)
    lab = peers.lab_runtime(args.containerd, tempfile.mkdtemp(prefix="cp-lab-", dir="/tmp"), images)
    lab.start()
    rows = []
    try:
        for updates in args.updates.split(","):
            for shared in (int(n) for n in args.shared.split(",")):
                rows.append(measure(lab, updates, shared, args.reps, print))
                print(f"[containerd-pods] {rows[-1]}", flush=True)
    finally:
        lab.cleanup()
    print(
        f"\nGuaranteed 1-CPU CreateContainer, containerd {args.containerd}, cpuset,numa,oom, "
        f"CPU 0 reserved, median of {args.reps}; {time.strftime('%Y-%m-%d %H:%M')}, "
        f"load {os.getloadavg()[0]:.1f}\n"
    )
    print(
        "| updates | shared containers | CreateContainer (median) | window p50 (≤) "
        "| window max (≤) |"
    )
    print("| --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['updates']} | {r['shared']} | {r['create_ms_median']} ms | "
            f"{r['window_p50_le_s'] * 1e3:g} ms | {r['window_max_le_s'] * 1e3:g} ms |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
