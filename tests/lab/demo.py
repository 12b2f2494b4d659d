"""`python -m tests.lab.demo`: what crihook does on a node, for real, in a few minutes.

Starts a private containerd (tests.lab) and crihook in front of it with the resource and
device hooks (`--hooks cpuset,numa,oom,devices`, CPU 0 reserved), then runs pods through it as
kubelet would, on this machine's real CPUs:

1. a BestEffort pod: it runs on the shared pool, every CPU;
2. a Guaranteed pod with one whole CPU (and a device from a pool): pinned to an exclusive CPU,
   and the BestEffort pod moved off it;
3. a Burstable pod that asks, by annotation, for a device node and a host directory the node
   allows (both made for the demo), and gets them;
4. a pod asking for /dev/mem: refused, with crihook's message;
5. the Guaranteed pod leaves: the others get its CPU back.

After each step it prints what containerd and the kernel have (containerd's cpuset, the
container cgroup's cpuset.cpus and cpuset.mems, the process's oom_score_adj, `ls` inside the
container), then the map `crihook state --cpus` draws. Then it serves until Ctrl-C, with the
commands to look further, and cleans everything up. It needs no Go peer: crictl is suggested
when the test bed has built it, and how to build it otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.node import format_cpu_list, parse_cpu_list, read_topology
from crihook.proxy.ops.cpu_map import CpuMap, load_map
from crihook.proxy.ops.cpu_map_text import render_map, use_colour
from tests.lab import peers
from tests.lab.cgroups import cgroup_dirs
from tests.lab.containerd import Containerd
from tests.lab.crihook_proc import CrihookProcess, release_staging
from tests.lab.images import DEFAULT_CACHE_DIR, build_images
from tests.lab.kubelet import ContainerSpec, KubeletClient, PodHandle, PodSpec, PodStartError

MiB = 1024 * 1024
NAMESPACE = "demo"
HOOKS = "cpuset,numa,oom,devices"
BURSTABLE_SCORE = 500
SETTLE_SECONDS = 15.0
"""How long a step waits for the updates crihook sends other containers after its answer
(sent at once; generous for a loaded machine)."""


def demo_config(workdir: Path) -> str:
    """CPU 0 reserved (kubelet's reservedSystemCPUs); a fixed OOM score for Burstable pods;
    the demo namespace may ask for the demo's device node and directory, and a pool of two
    demo devices is handed out one container at a time."""
    dev = workdir / "dev"
    pool = ", ".join(f'{{ id = "{i}", path = "{dev}/accel{i}", numa = 0 }}' for i in range(2))
    return f"""\
[hooks.cpuset]
reserved_cpus = "0"

[hooks.oom]
qos_scores = {{ Burstable = {BURSTABLE_SCORE} }}

[hooks.devices]
namespaces = ["{NAMESPACE}"]
devices = ["{dev}/demo0"]
mounts = ["{workdir}/share"]

[hooks.devices.pools.accel]
env = "ACCEL_VISIBLE_DEVICES"
devices = [{pool}]
"""


def _out(text: str = "") -> None:
    """Print, surviving a closed stdout (`demo.sh | tee log` and Ctrl-C: tee dies first):
    from then on output is dropped, and the cleanup still runs."""
    try:
        print(text, flush=True)
    except (BrokenPipeError, OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush is quiet too
        os.close(devnull)


def _say(text: str) -> None:
    _out(f"\n== {text}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--no-wait", action="store_true", help="exit after the last step")
    args = parser.parse_args(argv)

    _out("crihook demo: containerd and crihook for real, on this machine's CPUs")
    workdir = Path(tempfile.mkdtemp(prefix="crihook-demo-", dir="/tmp"))
    lab: Containerd | None = None
    crihook: CrihookProcess | None = None
    try:
        _make_host_files(workdir)
        _say("starting a private containerd")
        lab = Containerd(workdir / "containerd", build_images(DEFAULT_CACHE_DIR))
        lab.start()
        _out(f"containerd {lab.endpoint} (log {lab.log_path})")
        crihook = CrihookProcess(
            lab.endpoint, workdir=workdir / "crihook", config=demo_config(workdir), hooks=HOOKS
        )
        crihook.start()
        _say(f"crihook is serving, with --hooks {HOOKS} and CPU 0 reserved")
        _out(f"listen   {crihook.endpoint}")
        _out(f"runtime  {lab.endpoint}")
        _out(f"log      {crihook.log_path}")
        _out(f"state    {crihook.state_dir}")
        with (
            KubeletClient(crihook.endpoint, log_root=lab.pod_log_dir) as kubelet,
            KubeletClient(lab.endpoint) as direct,
        ):
            last = Demo(crihook, workdir, kubelet, direct).run()
        if not args.no_wait:
            _serve(crihook, last)
        return 0
    finally:
        _say("cleaning up")
        if crihook is not None:
            code = crihook.stop()
            _out(f"crihook exited {code}")
            release_staging(crihook.staging_dir)  # mounts of pods removed behind its back
        if lab is not None:
            lab.cleanup()
            _out("containerd stopped, pods, mounts, cgroups and the bridge removed")
        shutil.rmtree(workdir, ignore_errors=True)
        _out(f"{workdir} removed")


def _make_host_files(workdir: Path) -> None:
    """The node's side of step 3 and the pool: device nodes with the numbers of /dev/null,
    /dev/zero and /dev/full (harmless), and a host directory with a file in it."""
    (workdir / "crihook").mkdir()
    dev = workdir / "dev"
    dev.mkdir()
    # A pooled device is known by its numbers: the pool's must differ from demo0's.
    for name, minor in (("demo0", 3), ("accel0", 5), ("accel1", 7)):  # null, zero, full
        os.mknod(dev / name, 0o666 | 0o020000, os.makedev(1, minor))  # S_IFCHR
    share = workdir / "share"
    share.mkdir()
    (share / "hello.txt").write_text("hello from the host\n")


def _serve(crihook: CrihookProcess, container_id: str) -> None:
    _say("serving until Ctrl-C (point a CRI client at the listen socket)")
    _out("the map again (crihook reads its state dir; it works after crihook stopped too):")
    _out(f"  {sys.executable} -m crihook state --cpus --state-dir {crihook.state_dir}")
    _out("try crictl, a grpc-go client as kubelet is, through crihook:")
    for line in crictl_hint(peers.cached("crictl"), crihook.endpoint, container_id):
        _out(f"  {line}")
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()


def crictl_hint(crictl: Path | None, endpoint: str, container_id: str) -> list[str]:
    """Commands to try: the cached crictl (tests.lab.peers) with crihook as its runtime; when
    it is not built yet, the command that builds it (once) and prints its path."""
    binary = str(crictl) if crictl else "$(.venv/bin/python -m tests.lab.peers path crictl)"
    # --config /dev/null: no /etc/crictl.yaml, and no warning that it is missing
    base = f"{binary} --config /dev/null --runtime-endpoint {endpoint}"
    return [f"{base} ps", f"{base} inspect {container_id[:13]}"]


# --- the steps ---------------------------------------------------------------------------------


@dataclass
class Running:
    handle: PodHandle
    container_id: str
    pid: int


class Demo:
    """The steps: `kubelet` calls through crihook, `direct` asks containerd itself."""

    def __init__(
        self,
        crihook: CrihookProcess,
        workdir: Path,
        kubelet: KubeletClient,
        direct: KubeletClient,
    ) -> None:
        self.crihook = crihook
        self.workdir = workdir
        self.kubelet = kubelet
        self.direct = direct
        self.online = read_topology("/sys").online
        self.pods: dict[str, Running] = {}
        self.colour = use_colour(sys.stdout)

    def run(self) -> str:
        """The five steps; the id of a container still running, for the crictl hint."""
        self._besteffort()
        self._guaranteed()
        self._burstable_with_devices()
        self._refused()
        self._guaranteed_leaves()
        return self.pods["batch"].container_id

    def _besteffort(self) -> None:
        _say("1. a BestEffort pod, demo/batch: it runs on the shared pool")
        self._start(PodSpec(name="batch", namespace=NAMESPACE, containers=[_app()]))
        self._show(
            f"the shared pool is every CPU ({_cpus(self.online)}): no container holds one of its "
            "own. CPU 0 is reserved (kubelet's reservedSystemCPUs): it stays in the shared pool "
            "and is never given to a container alone",
        )

    def _guaranteed(self) -> None:
        _say("2. a Guaranteed pod, demo/db: 1 CPU, 64 MiB, and a device from the pool accel")
        pool = json.dumps({"accel": 1})
        spec = PodSpec(
            name="db",
            namespace=NAMESPACE,
            containers=[_app(cpu=1000, memory=64 * MiB, guaranteed=True)],
            annotations={"pools.crihook.io/container.app": pool},
        )
        self._start(spec)
        pinned = self._cgroup_cpus("db")
        self._settle()
        self._show(
            f"demo/db holds {_cpus(pinned)} alone (kubelet's static CPU manager's pick) and its "
            "64 MiB on NUMA node 0 (the memory manager's), and device accel 0; crihook moved "
            f"the shared containers off it: they run on {_cpus(self.online - pinned)}, the "
            "reserved CPU included, as in kubelet's default cpuset",
        )

    def _burstable_with_devices(self) -> None:
        _say("3. a Burstable pod, demo/web, asks by annotation for a device node and a host dir")
        devices = json.dumps(
            [{"path": f"{self.workdir}/dev/demo0", "container_path": "/dev/demo0"}]
        )
        mounts = json.dumps({f"{self.workdir}/share": "/data"})
        spec = PodSpec(
            name="web",
            namespace=NAMESPACE,
            containers=[_app(cpu=100, memory=32 * MiB)],
            annotations={
                "devices.crihook.io/container.app": devices,
                "mounts.crihook.io/container.app": mounts,
            },
        )
        for key, value in spec.annotations.items():
            _out(f"  {key}:")
            _out(f"    {value}")
        self._start(spec)
        self._settle()
        web = self.pods["web"]
        for cmd in (["ls", "-l", "/dev/demo0"], ["ls", "-l", "/data"], ["cat", "/data/hello.txt"]):
            result = self.kubelet.exec_sync(web.container_id, cmd)
            _out(f"  inside demo/web $ {' '.join(cmd)}")
            for line in (result.stdout or result.stderr).decode(errors="replace").splitlines():
                _out(f"    {line}")
        self._show(
            f"the oom hook gave the Burstable pod oom_score_adj {BURSTABLE_SCORE} "
            "([hooks.oom] qos_scores) instead of kubelet's",
        )

    def _refused(self) -> None:
        _say("4. a pod asking for /dev/mem: refused before anything reaches containerd")
        spec = PodSpec(
            name="intruder",
            namespace=NAMESPACE,
            containers=[_app()],
            annotations={"devices.crihook.io/container.app": json.dumps([{"path": "/dev/mem"}])},
        )
        handle: PodHandle | None = None
        try:
            handle = self.kubelet.run_pod(spec)
            _out("  NOT refused: the demo expected crihook to refuse it")
        except PodStartError as exc:  # with the sandbox made so far, and the status
            handle = exc.handle
            _out(f"  CreateContainer failed: {exc.code.name if exc.code else '?'}")
            for line in textwrap.wrap(exc.details or str(exc), 94):
                _out(f"  {line}")
        finally:
            if handle is not None:
                self.kubelet.remove_pod(handle)
        _out("  (its sandbox was removed, as kubelet would; nothing was injected or held)")

    def _guaranteed_leaves(self) -> None:
        _say("5. demo/db leaves: its CPU goes back to the shared pool")
        db = self.pods.pop("db")
        self.kubelet.remove_pod(db.handle)
        self._settle()
        self._show(f"the shared containers run on {_cpus(self.online)} again")

    # --- helpers ---------------------------------------------------------------------------

    def _start(self, spec: PodSpec) -> None:
        handle = self.kubelet.run_pod(spec)
        cid = handle.container_ids["app"]
        self.pods[spec.name] = Running(handle, cid, self.direct.container_pid(cid))

    def _cgroup_cpus(self, name: str) -> frozenset[int]:
        return parse_cpu_list(self._cgroup(name, "cpuset.cpus"))

    def _cgroup(self, name: str, file: str) -> str:
        running = self.pods[name]
        path = f"{running.handle.cgroup_parent}/{running.container_id}"
        for directory in cgroup_dirs(path):
            if (directory / file).exists():
                return (directory / file).read_text().strip()
        return "?"

    def _settle(self) -> None:
        """Wait until every container without CPUs of its own runs on the shared pool the
        map shows, in the kernel (crihook updates them once it has answered kubelet)."""
        deadline = time.monotonic() + SETTLE_SECONDS
        while time.monotonic() < deadline:
            cpu_map = self._map()
            held = {h.container_id for h in cpu_map.holdings if h.cpus}
            if all(
                self._cgroup_cpus(name) == cpu_map.shared
                for name, running in self.pods.items()
                if running.container_id not in held
            ):
                return
            time.sleep(0.1)
        _out(f"  (after {SETTLE_SECONDS:.0f}s the shared containers have not all moved yet)")

    def _map(self) -> CpuMap:
        """The map once crihook wrote what it knows: the demo's running containers, and only
        theirs, on it (confirmations and releases are written a fraction of a second after
        the call)."""
        deadline = time.monotonic() + 5
        while True:
            cpu_map = load_map(self.crihook.state_dir)
            held = {h.container_id for h in cpu_map.holdings if h.cpus}
            shared = sum(1 for r in self.pods.values() if r.container_id not in held)
            ids = {r.container_id for r in self.pods.values()}
            settled = (
                cpu_map.running
                and cpu_map.shared_containers == shared
                and all(
                    h.container_id in ids and h.pod.startswith(NAMESPACE) for h in cpu_map.holdings
                )
            )
            if settled or time.monotonic() > deadline:
                return cpu_map
            time.sleep(0.05)

    def _show(self, what: str) -> None:
        for line in textwrap.wrap(what, 94):
            _out(f"  {line}")
        _out("")
        for line in _table(self._rows()):
            _out(f"  {line}")
        _out("")
        _out("  crihook state --cpus:")
        for line in render_map(self._map(), width=96, colour=self.colour).splitlines():
            _out(f"  | {line}" if line else "  |")

    def _rows(self) -> Iterator[Sequence[str]]:
        yield (
            "pod",
            "QoS",
            "containerd cpuset",
            "cgroup cpuset.cpus",
            "cpuset.mems",
            "oom_score_adj",
        )
        clamped = False
        for name, running in self.pods.items():
            status = self.direct.container_status(running.container_id, verbose=True)
            linux = status.status.resources.linux
            asked = running.handle.container_configs["app"].linux.resources.oom_score_adj
            have = int(Path(f"/proc/{running.pid}/oom_score_adj").read_text())
            mark = " *" if have != asked and asked < 0 else ""
            clamped = clamped or bool(mark)
            yield (
                f"{NAMESPACE}/{name}",
                running.handle.qos.value,
                linux.cpuset_cpus or _spec_cpuset(status),
                self._cgroup(name, "cpuset.cpus"),
                self._cgroup(name, "cpuset.mems"),
                f"{asked} -> {have}{mark}",
            )
        yield (
            "oom_score_adj: kubelet's value -> what the process has (/proc/<pid>/oom_score_adj)",
        )
        if clamped:
            yield (
                "* this machine's containerd runs with restrict_oom_score_adj (no CAP_SYS_RESOURCE",
            )
            yield ("  here): a score below containerd's own (0) is raised to 0",)


def _cpus(cpus: frozenset[int]) -> str:
    return f"CPU{'s' if len(cpus) > 1 else ''} {format_cpu_list(cpus)}"


def _app(
    cpu: int | None = None, memory: int | None = None, guaranteed: bool = False
) -> ContainerSpec:
    """The container `app` (busybox sleep): BestEffort with no resources, Guaranteed with
    `guaranteed`, Burstable otherwise."""
    if cpu is None and memory is None:
        return ContainerSpec(name="app")
    return ContainerSpec(
        name="app",
        cpu_request=cpu,
        cpu_limit=cpu if guaranteed else None,
        memory_request=memory,
        memory_limit=memory if guaranteed else None,
    )


def _spec_cpuset(status: api_pb2.ContainerStatusResponse) -> str:
    """The cpuset in the OCI spec containerd keeps (verbose info), for a containerd that does
    not report resources."""
    info = json.loads(status.info.get("info", "{}"))
    spec = info.get("runtimeSpec") or {}
    return str(((spec.get("linux") or {}).get("resources") or {}).get("cpu", {}).get("cpus", "?"))


def _table(rows: Iterator[Sequence[str]]) -> list[str]:
    """Columns padded to their widest cell; a row of one cell is a note."""
    rows_list = list(rows)
    cells = [r for r in rows_list if len(r) > 1]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    out = []
    for row in rows_list:
        if len(row) == 1:
            out.append(row[0])
        else:
            out.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return out


if __name__ == "__main__":
    sys.exit(main())
