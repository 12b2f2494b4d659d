"""What a pod costs crihook as the node fills up, what crihook's memory does, how fast it starts
(issue 27, part 2):

    python -m bench.node_scale [--pods 0,100,1000] [--starts 100] [--rss] [--startup]
                               [--guaranteed 0] [--profile DIR]

crihook (`--hooks cpuset,numa,oom`) runs on the 256-CPU, 8-NUMA sysfs fixture in front of the
memory runtime (tests/lab), as the fixture tests run it. The node is filled with one-container
pods (Run + Create + Start), then `--starts` more pods are started and timed: crihook's CPU
(utime+stime from /proc, all threads) and the wall time per pod start, for each node size.
`--guaranteed N`: every Nth pod is Guaranteed with 1 CPU (0: none; their updates to the
shared pool are part 1 of the issue, measured there). "1000 vs 100" is the ratio.

`--rss`: crihook's VmRSS idle; after one CreateContainer of 15 MiB (and 2 s idle); and with
1,000 containers in the state. `--startup`: crihook SIGKILLed and started again with 0 and
1,000 containers in its state and on the runtime: the time until its socket exists
(listening: a connection waits there until served), until it answers a call (UNAVAILABLE
while not ready) and until it answers ready (reconciled; its Version call answers only
then).

`--profile DIR`: py-spy records the measured pod starts at each size (flame SVG in DIR).
Timing lives here, never in tests.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc

from bench.procfs import cpu_seconds, rss_bytes
from crihook.api.cri.v1 import api_pb2, api_pb2_grpc
from tests.lab.crihook_proc import CrihookProcess
from tests.lab.kubelet_encoding import container_config, one_container_pod, sandbox_config
from tests.lab.memory_runtime import MemoryRuntime
from tests.lab.sysfs import EPYC_256_8NUMA, GIB, write_sysfs

NODE_MEMORY = 1024 * GIB
MiB = 1 << 20
HOOKS = "cpuset,numa,oom"


class Node:
    """crihook on the fixture in `workdir`, the memory runtime behind it, a client in front."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.sysfs = write_sysfs(workdir / "sys", EPYC_256_8NUMA)
        self.runtime = MemoryRuntime(workdir / "rt.sock").start()
        self.proc = CrihookProcess(
            self.runtime.endpoint,
            workdir=workdir,
            hooks=HOOKS,
            args=["--sysfs-root", str(self.sysfs), "--log-level", "warning"],
        )
        self.channel: grpc.Channel | None = None
        self.stub: api_pb2_grpc.RuntimeServiceStub | None = None
        self.count = 0

    def start(self) -> None:
        self.proc.start()
        self.connect()

    def connect(self) -> None:
        if self.channel is not None:
            self.channel.close()
        self.channel = grpc.insecure_channel(
            self.proc.endpoint,
            options=[("grpc.max_send_message_length", 64 * MiB)],
        )
        self.stub = api_pb2_grpc.RuntimeServiceStub(self.channel)

    @property
    def pid(self) -> int:
        assert self.proc.proc is not None
        return self.proc.proc.pid

    def pod(self, guaranteed: bool = False, env_bytes: int = 0) -> str:
        """One pod started through crihook: RunPodSandbox, CreateContainer, StartContainer."""
        assert self.stub is not None
        self.count += 1
        spec, container = one_container_pod(f"p{self.count}", guaranteed, env_bytes)
        sandbox = sandbox_config(spec)
        sid = self.stub.RunPodSandbox(
            api_pb2.RunPodSandboxRequest(config=sandbox), timeout=120
        ).pod_sandbox_id
        config = container_config(spec, container, node_memory=NODE_MEMORY)
        request = api_pb2.CreateContainerRequest(
            pod_sandbox_id=sid, config=config, sandbox_config=sandbox
        )
        cid = self.stub.CreateContainer(request, timeout=120).container_id
        self.stub.StartContainer(api_pb2.StartContainerRequest(container_id=cid), timeout=120)
        return str(cid)

    def fill(self, pods: int, every: int) -> None:
        while self.count < pods:
            self.pod(guaranteed=bool(every) and (self.count + 1) % every == 0)

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
        self.proc.kill()
        self.runtime.stop()


@contextlib.contextmanager
def node() -> Iterator[Node]:
    workdir = Path(tempfile.mkdtemp(prefix="ns-", dir="/tmp"))
    made = Node(workdir)
    try:
        made.start()
        yield made
    finally:
        made.close()
        shutil.rmtree(workdir, ignore_errors=True)


def settle(seconds: float = 1.5) -> None:
    time.sleep(seconds)  # the write-behind and whatever it wakes


def per_pod_start(
    n: Node, starts: int, every: int, profile: Path | None, label: str
) -> tuple[float, float]:
    """(crihook CPU ms, wall ms) per pod start, over `starts` more pods."""
    spy = None
    if profile is not None:
        profile.mkdir(parents=True, exist_ok=True)
        py_spy = Path(sys.executable).parent / "py-spy"
        spy = subprocess.Popen(
            [str(py_spy), "record", "-p", str(n.pid), "-r", "200", "-f", "raw", "-o",
             str(profile / f"{label}.txt")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(1.0)
    cpu0, wall0 = cpu_seconds(n.pid), time.monotonic()
    for i in range(starts):
        n.pod(guaranteed=bool(every) and (i + 1) % every == 0)
    cpu = cpu_seconds(n.pid) - cpu0
    wall = time.monotonic() - wall0
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        spy.wait()
    return cpu / starts * 1e3, wall / starts * 1e3


def scale(sizes: list[int], starts: int, every: int, profile: Path | None) -> None:
    print(f"pod start through --hooks {HOOKS}, 256-CPU fixture, memory runtime")
    print(f"({starts} pod starts measured at each size; every {every or 'no'}th Guaranteed)\n")
    print("| containers on the node | crihook CPU per pod start | wall per pod start |")
    print("| ---: | ---: | ---: |")
    figures: dict[int, float] = {}
    with node() as n:
        for size in sorted(sizes):
            n.fill(size, every)
            settle()
            cpu, wall = per_pod_start(n, starts, every, profile, f"pods-{size}")
            n.count -= 0
            figures[size] = cpu
            print(f"| {size:,} | {cpu:.2f} ms | {wall:.2f} ms |", flush=True)
            # the measured pods stay: the next size counts them
    if 100 in figures and 1000 in figures:
        print(f"\n1,000 vs 100: {figures[1000] / figures[100]:.2f}x crihook CPU per pod start")


def rss() -> None:
    print("crihook VmRSS (--hooks cpuset,numa,oom, 256-CPU fixture)\n")
    with node() as n:
        n.pod()
        settle(2)
        idle = rss_bytes(n.pid)
        print(f"- idle (1 pod): {idle / MiB:.1f} MiB", flush=True)
        n.pod(env_bytes=15 * MiB)
        peak = rss_bytes(n.pid)
        settle(2)
        after = rss_bytes(n.pid)
        print(
            f"- after one 15 MiB CreateContainer: {peak / MiB:.1f} MiB at once, "
            f"{after / MiB:.1f} MiB 2 s later ({(after - idle) / MiB:+.1f} MiB over idle)",
            flush=True,
        )
        n.fill(1000, 0)
        settle(2)
        print(f"- with 1,000 containers in the state: {rss_bytes(n.pid) / MiB:.1f} MiB")


def _restart(n: Node) -> tuple[float, float, float]:
    """SIGKILL crihook, start it again: seconds until it listens (its socket exists: a
    connection waits there until served), until it answers (UNAVAILABLE while not ready),
    and until it is ready."""
    n.proc.kill()
    n.proc.socket_path.unlink(missing_ok=True)
    started = time.monotonic()
    n.proc.start(wait=False)
    while not n.proc.socket_path.exists():
        if n.proc.proc is not None and n.proc.proc.poll() is not None:
            raise SystemExit(f"crihook exited:\n{n.proc.log()}")
        time.sleep(0.002)
    listening = time.monotonic() - started
    answering = None
    with grpc.insecure_channel(n.proc.endpoint) as channel:
        version = channel.unary_unary("/runtime.v1.RuntimeService/Version")
        while True:
            try:
                version(b"", timeout=5)
                break
            except grpc.RpcError as exc:
                if answering is None and (exc.details() or "").startswith("crihook:"):
                    answering = time.monotonic() - started
                time.sleep(0.002)
    ready = time.monotonic() - started
    n.connect()
    return listening, answering if answering is not None else ready, ready


def startup(tries: int) -> None:
    print("crihook start-up after SIGKILL (median of tries)\n")
    print("| containers | listening | answering | ready (reconciled) |")
    print("| ---: | ---: | ---: | ---: |")
    with node() as n:
        for size in (0, 1000):
            n.fill(size, 0)
            settle(2)
            runs = [_restart(n) for _ in range(tries)]
            medians = [sorted(r[i] for r in runs)[tries // 2] for i in range(3)]
            cells = " | ".join(f"{m:.3f} s" for m in medians)
            print(f"| {size:,} | {cells} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", default="0,100,1000", help="node sizes (default 0,100,1000)")
    parser.add_argument("--starts", type=int, default=100, help="pod starts measured per size")
    parser.add_argument("--guaranteed", type=int, default=0, metavar="N")
    parser.add_argument("--rss", action="store_true", help="measure RSS instead")
    parser.add_argument("--startup", action="store_true", help="measure start-up instead")
    parser.add_argument("--tries", type=int, default=5, help="start-ups per size (--startup)")
    parser.add_argument("--profile", type=Path, help="py-spy raw stacks into this directory")
    args = parser.parse_args()
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    if args.rss:
        rss()
    elif args.startup:
        startup(args.tries)
    else:
        sizes = [int(s) for s in args.pods.split(",")]
        scale(sizes, args.starts, args.guaranteed, args.profile)


if __name__ == "__main__":
    main()
