"""`crihook state --cpus` of a real crihook on the 256-CPU, 8-NUMA-node fixture machine
(`--sysfs-root`, the memory runtime behind it): the map and `--json` show each CPU, memory
block and pooled device where the runtime was told to put them, while crihook runs and after
it stopped, and fit 100 columns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from crihook.hooks.node import format_cpu_list, parse_cpu_list
from tests.integration.test_resource_hooks_fixtures import Node
from tests.lab.crihook_proc import PATIENCE, CrihookProcess, short_tmpdir, wait_for
from tests.lab.fixture_machine import crihook_on_fixture
from tests.lab.kubelet_encoding import ContainerSpec, PodSpec
from tests.lab.map_reading import drawn
from tests.lab.sysfs import EPYC_256_8NUMA, GIB


def state_cpus(proc: CrihookProcess, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    command = [sys.executable, "-m", "crihook", "state", "--cpus", "--state-dir"]
    out = subprocess.run(
        [*command, str(proc.state_dir), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_map_of_a_busy_256_cpu_machine_is_what_the_runtime_was_told() -> None:
    workdir = short_tmpdir("cm-")
    dev = workdir / "dev"
    dev.mkdir()
    for i in range(4):
        os.mknod(dev / f"gpu{i}", 0o666 | 0o020000, os.makedev(1, 7))  # S_IFCHR, /dev/full's
    gpus = ", ".join(f'{{ id = "{i}", path = "{dev}/gpu{i}", numa = {2 * i} }}' for i in range(4))
    config = (
        '[hooks.cpuset]\nreserved_cpus = 2\n[hooks.devices]\nnamespaces = ["default"]\n'
        f"[hooks.devices.pools.gpu]\ndevices = [{gpus}]\n"
    )
    hooks = "cpuset,numa,oom,devices"
    with crihook_on_fixture(workdir, EPYC_256_8NUMA, config=config, hooks=hooks) as m:
        node = Node(m.topology, m.runtime, m.proc, m.stub)
        _, shared = node.pod("web", None)
        placed = [node.pod(f"db-{n}", n, memory=n * GIB)[1] for n in (4, 2, 16, 1)]
        train = ContainerSpec(
            name="train", cpu_request=8000, cpu_limit=8000,
            memory_request=8 * GIB, memory_limit=8 * GIB,
        )  # fmt: skip
        trainer = PodSpec(
            name="trainer",
            containers=[train],
            annotations={"pools.crihook.io/container.train": json.dumps({"gpu": 1})},
        )
        placed.append(node.create(trainer, node.run_pod(trainer), train))
        node.hook_state("cpuset")  # the reservations confirmed on disk
        node.hook_state("numa")

        def settled() -> bool:
            doc = json.loads(state_cpus(m.proc, "--json"))
            return {h["container_id"] for h in doc["holdings"]} == set(placed)

        wait_for(settled, PATIENCE, "every container on the map, named")
        m.proc.updates_sent()  # the shared container moved (after kubelet's answers)
        running = check_map(node, m.proc, placed, shared)
        assert running["running"] is True

        assert m.proc.stop() == 0
        stopped = check_map(node, m.proc, placed, shared)
        assert stopped["running"] is False
        assert stopped["status"].startswith("crihook is not running: it stopped at")
        assert stopped["holdings"] == running["holdings"]
        assert "crihook is not running: it stopped at" in state_cpus(m.proc)


def check_map(node: Node, proc: CrihookProcess, placed: list[str], shared: str) -> Any:
    """The text and the JSON against the runtime; the JSON."""
    topo = node.topology
    doc = json.loads(state_cpus(proc, "--json"))
    text = state_cpus(proc)
    assert max(len(line) for line in text.splitlines()) <= 100, text
    by_id = {h["container_id"]: h for h in doc["holdings"]}
    cells = drawn(text)
    assert set(cells) == set(topo.online)
    held: set[int] = set()
    for cid in placed:
        holding = by_id[cid]
        cpus = node.cpus(cid)  # what the runtime was told
        assert parse_cpu_list(holding["cpus"]) == cpus
        assert {cells[c] for c in cpus} == {holding["glyph"]}
        mems = parse_cpu_list(node.runtime.mems_of(cid))
        assert {n for b in holding["memory"] for n in b["numa"]} == mems
        line = next(x for x in text.splitlines() if x.startswith(f"  {holding['glyph']}  "))
        assert f"{holding['pod']}/{holding['container']}" in line and holding["cpus"] in line
        held |= cpus
    pool = node.cpus(shared)  # the shared container runs on the shared pool
    assert parse_cpu_list(doc["cpus"]["shared"]) == pool == topo.online - held
    reserved = parse_cpu_list(doc["cpus"]["reserved"])
    assert len(reserved) == 2 and reserved <= pool
    assert {c: cells[c] for c in pool} == {c: "#" if c in reserved else "." for c in pool}
    gpu = by_id[placed[-1]]["devices"]["gpu"]
    assert [d["held_by"] for d in doc["devices"] if d["id"] in gpu] == [by_id[placed[-1]]["glyph"]]
    assert f"({len(doc['devices']) - 1} of {len(doc['devices'])} free)" in text
    assert format_cpu_list(pool) in "".join(text.split())
    return doc
