"""`python -m bench.run --kubelet` runs: one paired rep on containerd 1.6, four kubelets
(direct, kubelet's own static CPU manager, crihook with no hooks, crihook with
cpuset,numa,oom), each on a runtime of its own. No timing is judged here, only that each
path started its pod and is reported, the resource hooks against kubelet's placement too."""

from __future__ import annotations

import re

from bench.kubelet_start import PATHS, run_kubelet_start
from tests.node.conftest import NodeBinaries


def test_the_kubelet_bench_starts_a_pod_on_each_path(node_binaries: NodeBinaries) -> None:
    text = run_kubelet_start("1.6", reps=1)

    rows = {
        cells[0]: cells[1:]
        for line in text.splitlines()
        if line.startswith("| ") and not line.startswith(("| path", "| ---"))
        if (cells := [c.strip() for c in line.strip("|").split("|")])
    }
    assert list(rows) == list(PATHS)
    assert all(float(row[1]) > 0 for row in rows.values())
    assert rows["direct"][3:5] == ["1.000", "1.000"]
    assert rows["direct"][5:] == ["-", "-", "-"]  # no interval from one rep, no reference
    assert rows["cpuset,numa,oom"][5:7] == ["-", "kubelet-static"]
    assert float(rows["cpuset,numa,oom"][7]) > 0
    # crihook's own part of the start, from its call log, on both of its paths
    for path in ("hooks-none", "cpuset,numa,oom"):
        found = re.search(
            rf"{re.escape(path)}: crihook's own part of a start .* median ([\d.]+) ms", text
        )
        assert found is not None, text
        assert float(found[1]) > 0
