"""crihook on a fixture machine: a sysfs tree of a machine this VM is not, the memory
runtime behind crihook, and a stub to call crihook with. What the fixture tests of the
resource, device and Koordinator hooks (and the pool metrics) all start from."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from crihook.api.cri.v1 import api_pb2_grpc
from crihook.hooks.node import Topology, read_topology
from tests.lab.crihook_proc import CrihookProcess
from tests.lab.memory_runtime import MemoryRuntime
from tests.lab.sysfs import MachineSpec, write_sysfs

__all__ = ["FixtureMachine", "crihook_on_fixture"]


@dataclass(frozen=True)
class FixtureMachine:
    topology: Topology
    runtime: MemoryRuntime
    proc: CrihookProcess
    stub: api_pb2_grpc.RuntimeServiceStub


@contextlib.contextmanager
def crihook_on_fixture(
    workdir: Path,
    spec: MachineSpec,
    *,
    config: str = "",
    hooks: str | None,
    args: Sequence[str] = (),
) -> Iterator[FixtureMachine]:
    """`crihook serve --sysfs-root <spec's tree>` in front of the memory runtime, in
    `workdir`; everything stopped and `workdir` removed afterwards."""
    root = write_sysfs(workdir / "sys", spec)
    runtime = MemoryRuntime(workdir / "rt.sock").start()
    proc = CrihookProcess(
        runtime.endpoint,
        workdir=workdir,
        config=config,
        hooks=hooks,
        args=["--sysfs-root", str(root), *args],
    )
    try:
        proc.start()
        with grpc.insecure_channel(proc.endpoint) as channel:
            stub = api_pb2_grpc.RuntimeServiceStub(channel)
            yield FixtureMachine(read_topology(root), runtime, proc, stub)
    finally:
        proc.kill()
        runtime.stop()
        shutil.rmtree(workdir, ignore_errors=True)
