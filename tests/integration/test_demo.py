"""The README's demo (`python -m tests.lab.demo`): each step shows what crihook did as
containerd and the kernel have it, and the demo cleans up, even when its stdout is gone."""

from __future__ import annotations

import glob
import re
import subprocess
import sys

from crihook.hooks.node import format_cpu_list, parse_cpu_list, read_topology

DEMO = [sys.executable, "-m", "tests.lab.demo", "--no-wait"]
TABLE_COLUMNS = ("pod", "QoS", "containerd", "cgroup_cpus", "cgroup_mems", "oom")


def _demo_dirs() -> set[str]:
    return set(glob.glob("/tmp/crihook-demo-*"))


def _running(needle: str) -> list[str]:
    out = subprocess.run(["pgrep", "-af", needle], capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if "pgrep" not in line]


def _steps(out: str) -> dict[str, str]:
    """The demo's output by step: `1` ... `5` (the text under `== N. ...`)."""
    parts = re.split(r"^== (\d)\. ", out, flags=re.MULTILINE)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def _table(step: str) -> dict[str, dict[str, str]]:
    """The rows of a step's table of containers, by pod."""
    rows = {}
    for line in step.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells[0].startswith("demo/") and len(cells) == len(TABLE_COLUMNS):
            rows[cells[0]] = dict(zip(TABLE_COLUMNS, cells, strict=True))
    return rows


def test_each_step_shows_what_containerd_and_the_kernel_have() -> None:
    """Run as a user would (`--no-wait` ends it after the last step): the cpusets in
    containerd and in the container cgroups follow the exclusive CPU as it comes and goes,
    the OOM scores are per QoS class, the injected device node and directory are seen inside
    the container, /dev/mem is refused with crihook's message, and the map is drawn."""
    before = _demo_dirs()
    demo = subprocess.run(DEMO, capture_output=True, text=True, timeout=600)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    steps = _steps(demo.stdout)
    assert sorted(steps) == ["1", "2", "3", "4", "5"], demo.stdout
    online = read_topology("/sys").online
    every = format_cpu_list(online)

    first = _table(steps["1"])
    assert list(first) == ["demo/batch"]
    assert first["demo/batch"]["containerd"] == first["demo/batch"]["cgroup_cpus"] == every
    assert first["demo/batch"]["oom"] == "1000 -> 1000"

    second = _table(steps["2"])
    pinned = parse_cpu_list(second["demo/db"]["cgroup_cpus"])
    assert len(pinned) == 1 and 0 not in pinned  # one exclusive CPU, never the reserved one
    assert second["demo/db"]["containerd"] == format_cpu_list(pinned)
    rest = format_cpu_list(online - pinned)
    assert second["demo/batch"]["containerd"] == second["demo/batch"]["cgroup_cpus"] == rest
    assert second["demo/db"]["QoS"] == "Guaranteed"
    assert second["demo/db"]["oom"].startswith("-997 -> ")
    assert f"A  demo/db/app  Guaranteed  1 CPU {format_cpu_list(pinned)}" in steps["2"]
    assert "accel  NUMA 0: 0=A 1=free" in steps["2"]

    third = _table(steps["3"])
    assert third["demo/web"]["QoS"] == "Burstable"
    assert third["demo/web"]["oom"].endswith("-> 500")  # [hooks.oom] qos_scores
    assert third["demo/web"]["cgroup_cpus"] == rest
    assert re.search(r"^\s+c\S+ .* 1,\s+3 .* /dev/demo0$", steps["3"], re.MULTILINE), steps["3"]
    assert "hello.txt" in steps["3"] and "hello from the host" in steps["3"]

    assert "CreateContainer failed: PERMISSION_DENIED" in steps["4"]
    refusal = " ".join(steps["4"].split())
    assert "device /dev/mem is not allowed ([hooks.devices] devices allows" in refusal

    fifth = _table(steps["5"])
    assert list(fifth) == ["demo/batch", "demo/web"]
    for row in fifth.values():
        assert row["containerd"] == row["cgroup_cpus"] == every
    assert "no container holds CPUs, NUMA memory or pooled devices" in steps["5"]
    for n in ("1", "2", "3", "5"):
        assert "crihook state --cpus:" in steps[n] and "| socket 0" in steps[n], steps[n]

    assert _demo_dirs() - before == set()
    assert _running("crihook-demo-") == []


def test_the_demo_cleans_up_when_its_reader_goes_away() -> None:
    """`sh deploy/demo.sh | tee log` and Ctrl-C: tee dies first. Here the reader closes the
    pipe after the first line: every later print hits a closed pipe, and the demo must still
    stop crihook and containerd and remove its directory."""
    before = _demo_dirs()
    demo = subprocess.Popen(DEMO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert demo.stdout is not None and demo.stderr is not None
    first = b""
    while not first.strip():
        first = demo.stdout.readline()
        if not first:
            break
    demo.stdout.close()  # the reader is gone
    try:
        err = demo.stderr.read().decode(errors="replace")
        demo.stderr.close()
        code = demo.wait(600)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert first.strip(), "the demo printed nothing"
    assert code == 0, err[-3000:]
    assert "BrokenPipeError" not in err, err[-3000:]
    made = _demo_dirs() - before
    assert made == set(), f"left behind: {made}"
    assert _running("crihook-demo-") == []
