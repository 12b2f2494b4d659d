"""The replay corpus: recordings of real node traffic (crihook in front of the lab's
containerd, driven by the kubelet-like client; re-recorded with
`python -m tests.replay.record_corpus`) replayed through today's chain, without containerd.

A difference here means the hooks now do something else with the same traffic: look at the
diff, and if the new behaviour is meant, re-record the corpus (or `crihook replay --update`).
"""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from crihook.proxy.config import settings_from_toml
from crihook.proxy.core.observe import EFFECTS
from crihook.proxy.replay.cli import replay_command
from crihook.proxy.replay.explain import explain
from crihook.proxy.replay.file import CallEntry, Recording, read_recording
from crihook.proxy.replay.runner import replay

HERE = Path(__file__).resolve().parent
CORPUS = sorted(HERE.glob("*.jsonl"))


KUBELET = sorted(HERE.glob("kubelet-*.jsonl"))


def test_the_corpus_is_there_and_small() -> None:
    assert [p.name for p in CORPUS] == [
        "containerd-node.jsonl",
        "koordinator-colocated.jsonl",
        "kubelet-containerd-1.6.jsonl",
        "kubelet-containerd-2.jsonl",
        "kubelet-crio.jsonl",
    ]
    assert all(p.stat().st_size < 400 * 1024 for p in CORPUS)


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
async def test_the_corpus_replays_without_a_difference(path: Path) -> None:
    report = await replay(read_recording(path))

    problems = [
        f"line {r.entry.line}: " + "; ".join(d.describe() for d in r.differences)
        for r in report.differing
    ]
    assert problems == []
    assert report.warnings == []
    assert len(report.results) == sum(len(s.entries) for s in report.recording.segments)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _effects(entry: CallEntry) -> list[str]:
    return [o["op"] for o in entry.doc["observed"] if o["op"] in EFFECTS]


def _calls(recording: Recording) -> list[CallEntry]:
    return [e for s in recording.segments for e in s.entries if isinstance(e, CallEntry)]


def _request(entry: CallEntry) -> dict[str, Any]:
    doc: dict[str, Any] = entry.doc["request"]["json"]
    return doc


def test_the_corpus_is_the_workload_the_issue_asks_for() -> None:
    recording = read_recording(HERE / "containerd-node.jsonl")
    calls = _calls(recording)
    methods = Counter(c.event.value for c in calls)
    # A crihook restart in the middle: two parts, each starting with a synchronize.
    assert len(recording.segments) == 2
    assert all(s.entries[0].doc["kind"] == "sync" for s in recording.segments)
    # Pods of the three QoS classes, with pod-level budgets on their sandboxes.
    parents = [_request(c)["config"]["linux"]["cgroup_parent"] for c in calls
               if c.event.value == "RunPodSandbox"]  # fmt: skip
    assert any("/besteffort/" in p for p in parents)
    assert any("/burstable/" in p for p in parents)
    assert any(p.startswith("/kubepods/pod") for p in parents)
    sandboxes = [_request(c)["config"] for c in calls if c.event.value == "RunPodSandbox"]
    assert any("resources" in s["linux"] for s in sandboxes)
    # A Guaranteed container on an exclusive CPU; init and sidecar containers.
    creates = [c for c in calls if c.event.value == "CreateContainer"]
    changed = [c.doc["forwarded"].get("changes", {}) for c in creates if c.doc["forwarded"]]
    assert any(ch.get("config.linux.resources.cpuset_cpus") == "1" for ch in changed)
    annotations = [_request(c)["sandbox_config"].get("annotations", {}) for c in creates]
    assert any("crihook.io/init-containers" in a for a in annotations)
    assert any("crihook.io/sidecar-containers" in a for a in annotations)
    # Device annotations: injected, and refused by the node's policy.
    assert any("pools.crihook.io/container.app" in a for a in annotations)
    statuses = Counter(((c.status or {}).get("code", "OK"), c.doc["pod"]) for c in calls)
    assert statuses[("PERMISSION_DENIED", "ml/sneaky-0")] == 1
    assert statuses[("INVALID_ARGUMENT", "batch/batch-1")] == 1
    # Netdev annotations: a macvlan and a moved interface, given back; two refusals.
    assert statuses[("INVALID_ARGUMENT", "net/net-host")] == 1
    assert statuses[("PERMISSION_DENIED", "default/net-other")] == 1
    net = {c.event.value: _effects(c) for c in calls if c.doc["pod"] == "net/net-app"}
    assert net["RunPodSandbox"] == ["create", "configure", "move_in", "configure"]
    assert net["StopPodSandbox"] == ["move_out", "restore", "delete"]
    # A plugin process: noted with its settings, its answers kept.
    plugins = [line for line in _lines(HERE / "containerd-node.jsonl") if line["kind"] == "plugins"]
    assert [[p["name"] for p in line["plugins"]] for line in plugins] == [["70-annotate"]] * 2
    verdicts = Counter(h["verdict"] for c in creates for h in c.doc["hooks"]
                       if h["hook"] == "70-annotate")  # fmt: skip
    assert verdicts == Counter({"adjusted": len(creates) - 3})  # not kube-system, refused ones
    # Resizes and the kubelet-restart bursts; deletions; updates sent to other containers.
    assert methods["UpdateContainerResources"] >= 2 * 7
    assert methods["RemoveContainer"] >= 5 and methods["RemovePodSandbox"] >= 5
    assert any(c.doc["updates"] for c in calls)
    # The secrets kubelet sent were not recorded.
    assert "do-not-record" not in (HERE / "containerd-node.jsonl").read_text()


async def test_a_changed_chain_differs_on_the_corpus_naming_call_and_field() -> None:
    recording = read_recording(HERE / "containerd-node.jsonl")

    report = await replay(recording, hooks="cpuset,numa,devices")  # without the oom hook

    differing = {
        (r.entry.label, d.what, d.field)
        for r in report.differing
        if isinstance(r.entry, CallEntry)
        for d in r.differences
    }
    assert (
        "CreateContainer, pod batch/batch-0, container job",
        "forwarded",
        "config.linux.resources.oom_score_adj",
    ) in differing
    label = "CreateContainer, pod batch/batch-1, container job"  # refused by oom, recorded
    refused = next(r for r in report.results if getattr(r.entry, "label", "") == label)
    assert refused.differences[0].describe().startswith('status: recorded "INVALID_ARGUMENT')
    assert json.dumps(refused.differences[0].replayed) == '"OK"'


async def test_the_corpus_replays_its_plugin_and_netdev_and_differs_without_them(
    tmp_path: Path,
) -> None:
    recording = read_recording(HERE / "containerd-node.jsonl")
    recorded = recording.segments[0].header["config"]
    (tmp_path / "hooks.d").mkdir()  # a configuration without the plugin's drop-in
    without_plugin = settings_from_toml({**recorded, "plugins_dir": str(tmp_path / "hooks.d")})

    report = await replay(recording, without_plugin)

    fields = {(d.what, d.field) for r in report.differing for d in r.differences}
    assert ("forwarded", "config.annotations.example.com/annotated") in fields

    report = await replay(recording, hooks="cpuset,numa,oom,devices")  # without netdev

    differing = {getattr(r.entry, "label", ""): r.differences for r in report.differing}
    run = differing["RunPodSandbox, pod net/net-app"]
    assert [d.what for d in run] == ["host"] * 4
    assert run[0].field.startswith("create(") and run[0].field.endswith(
        "'net1', 'macvlan', 3, 'bridge')"
    )
    assert (
        differing["RunPodSandbox, pod net/net-host"][0]
        .describe()
        .startswith("status: recorded \"INVALID_ARGUMENT: crihook: hook '60-netdev'")
    )


# --- a real kubelet's traffic ------------------------------------------------------------------


def _pod_name(call: CallEntry) -> str:
    return str(call.doc["pod"]).split("/", 1)[1]


@pytest.mark.parametrize("path", KUBELET, ids=[p.stem for p in KUBELET])
def test_the_kubelet_corpus_is_a_real_kubelets_workload(path: Path) -> None:
    recording = read_recording(path)
    calls = _calls(recording)
    methods = Counter(c.event.value for c in calls)
    # crihook restarted with SIGTERM under the running kubelet: two parts.
    assert len(recording.segments) == 2
    assert all(s.entries[0].doc["kind"] == "sync" for s in recording.segments)
    assert recording.segments[0].header["config"]["hooks"]["order"] == [
        "20-cpuset", "30-numa", "40-oom", "50-devices"
    ]  # fmt: skip
    # kubelet's own marks: a static pod (from its manifest dir) and pods from the API.
    sandboxes = [_request(c)["config"] for c in calls if c.event.value == "RunPodSandbox"]
    sources = Counter(s["annotations"]["kubernetes.io/config.source"] for s in sandboxes)
    assert sources["file"] == 1 and sources["api"] == len(sandboxes) - 1
    # Pods of the three QoS classes under kubelet's cgroup root.
    parents = {_pod_name(c): _request(c)["config"]["linux"]["cgroup_parent"] for c in calls
               if c.event.value == "RunPodSandbox"}  # fmt: skip
    assert "/kubepods/besteffort/pod" in parents["besteffort"]
    assert "/kubepods/burstable/pod" in parents["burstable"]
    assert "/kubepods/pod" in parents["guaranteed"]
    # The Guaranteed containers get CPU 1, exclusive, without a CFS quota; the shared pool
    # narrows to CPU 0 around them and widens back when one goes.
    creates = {(_pod_name(c), c.doc["container"]): c for c in calls
               if c.event.value == "CreateContainer" and not c.status}  # fmt: skip
    for pod in ("guaranteed", "guaranteed-2"):
        changes = creates[(pod, "app")].doc["forwarded"]["changes"]
        assert changes["config.linux.resources.cpuset_cpus"] == "1"
        assert changes["config.linux.resources.cpu_quota"] == -1
    assert ("burstable", "init") in creates
    pool = [u["resources"].get("cpuset_cpus") for c in calls for u in c.doc["updates"] or []]
    assert "0" in pool and "0-1" in pool
    # Resizes through the API: the Burstable one applied (crihook keeps its cpuset), the
    # Guaranteed memory resize refused with crihook's message, as kubelet retried it.
    updates = [c for c in calls if c.event.value == "UpdateContainerResources"]
    applied = [c for c in updates if _pod_name(c) == "burstable" and not c.status]
    assert applied and all(
        c.doc["forwarded"]["changes"] == {"linux.cpuset_cpus": "0"} for c in applied
    )
    refused = [c for c in updates if _pod_name(c) == "guaranteed" and c.status]
    assert refused and all(
        c.status["code"] == "FAILED_PRECONDITION"
        and "resize_exclusive_memory" in c.status["message"]
        for c in refused
    )
    # The device the node does not allow, refused each time kubelet retried it.
    denied = Counter((_pod_name(c), c.status["code"]) for c in calls if c.status
                     and c.status["code"] != "UNIMPLEMENTED")  # fmt: skip
    assert denied[("device-refused", "PERMISSION_DENIED")] >= 1
    assert set(denied) == {("device-refused", "PERMISSION_DENIED"),
                           ("guaranteed", "FAILED_PRECONDITION")}  # fmt: skip
    # Every pod deleted, and removed by kubelet's garbage collector.
    assert methods["RemovePodSandbox"] == methods["RunPodSandbox"] == len(sandboxes)
    assert methods["RemoveContainer"] == len(creates)


async def test_the_kubelet_corpus_differs_without_the_cpuset_hook() -> None:
    report = await replay(read_recording(HERE / "kubelet-containerd-1.6.jsonl"), hooks="numa,oom")

    fields = {(r.entry.label, d.field) for r in report.differing
              if isinstance(r.entry, CallEntry) for d in r.differences}  # fmt: skip
    assert (
        "CreateContainer, pod default/guaranteed, container app",
        "config.linux.resources.cpuset_cpus",
    ) in fields


# --- the co-located Koordinator node ----------------------------------------------------------

COLOCATED = HERE / "koordinator-colocated.jsonl"
STATUS = "scheduling.koordinator.sh/resource-status"
SPEC = "node.koordinator.sh/extended-resource-spec"
LABEL = "(label koordinator.sh/qosClass)"


def test_the_colocated_corpus_is_the_workload_the_issue_asks_for() -> None:
    calls = _calls(read_recording(COLOCATED))
    sandboxes = [_request(c)["config"] for c in calls if c.event.value == "RunPodSandbox"]
    classes = Counter(s.get("labels", {}).get("koordinator.sh/qosClass") for s in sandboxes)
    assert classes == Counter({"BE": 3, "LSR": 1, "LS": 1, None: 1, "SYSTEM": 1, "LSE": 1})
    assert sum(STATUS in s.get("annotations", {}) for s in sandboxes) == 2
    assert sum(SPEC in s.get("annotations", {}) for s in sandboxes) == 3
    assert any(
        s.get("labels", {}).get("runtimeproxy.koordinator.sh/skip-hookserver") == "true"
        for s in sandboxes
    )
    statuses = Counter((c.status or {}).get("code", "OK") for c in calls)
    assert statuses == Counter({"OK": len(calls) - 1, "INVALID_ARGUMENT": 1})
    header = json.loads(COLOCATED.read_text().splitlines()[0])
    assert header["config"]["hooks"]["order"] == ["25-koordinator"]
    # The recording itself keeps each hook's reason next to its verdict.
    lsr = next(
        c for c in calls if c.event.value == "CreateContainer" and c.doc["pod"] == "default/lsr-0"
    )
    pre = next(h for h in lsr.doc["hooks"] if h["stage"] == "pre")
    assert pre["verdict"] == "adjusted"
    assert pre["detail"].startswith(f"cpus: koord-scheduler's ({STATUS})")


def _block(lines: list[str], heading: str) -> list[str]:
    """The lines under one `pod container` heading of the explanation."""
    start = lines.index(heading) + 1
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith(" ")), len(lines))
    return lines[start:end]


async def test_the_explanation_says_per_container_what_koordinator_set_and_why() -> None:
    report = await replay(read_recording(COLOCATED))
    lines = explain(report, "koordinator")

    assert lines[0] == "koordinator (as replayed), per container:"
    lsr = _block(lines, "default/lsr-0 server")
    assert lsr[0].startswith("  CreateContainer (line ") and lsr[0].endswith(
        ': cpu_quota=-1, cpuset_cpus="1"'
    )
    assert f"    why: cpus: koord-scheduler's ({STATUS}); QoS LSR {LABEL}" in lsr
    # The in-place resize and the kubelet-restart burst: the scheduler's cpuset stays.
    kept = [line for line in lsr if line.startswith("  UpdateContainerResources")]
    assert len(kept) == 2 and all(line.endswith('cpuset_cpus="1"') for line in kept)
    # Given back at StopContainer: the containers on the shared pool grow back to 0-1.
    assert '    moves: default/ls-0 web cpuset_cpus="0-1"' in lsr
    assert "    why: cpus 1 given back: the pools grow" in lsr

    assert f"    why: cpus: the node's shared pool; QoS LS {LABEL}" in _block(
        lines, "default/ls-0 web"
    )
    assert "    why: cpus: the node's shared pool; QoS LS (from Kubernetes QoS Burstable)" in (
        _block(lines, "default/api-0 api")
    )
    executor = _block(lines, "default/spark-0 executor")
    assert executor[0].endswith(
        ': cpu_period=100000, cpu_quota=100000, cpu_shares=512, cpuset_cpus="0-1", '
        "memory_limit_in_bytes=268435456"
    )
    assert executor[1] == (
        f"    why: cpus: the node's BE pool; QoS BE {LABEL}; batch resources ({SPEC}): "
        "CFS quota 100000/100000 µs, 512 cpu shares, memory 256Mi"
    )
    assert _block(lines, "default/spark-0 log")[1].endswith(
        f"no batch resources for this container ({SPEC})"
    )
    assert (
        "skipped: label runtimeproxy.koordinator.sh/skip-hookserver"
        in (_block(lines, "koordinator-system/koordlet-x7k2p")[1])
    )
    coredns = _block(lines, "kube-system/coredns-0 coredns")
    assert coredns[0].endswith(': cpuset_cpus="0-1"')  # placed, but no batch values
    assert "skipped: exempt by crihook's configuration" in coredns[1]
    assert (
        _block(lines, "default/spark-1")[0]
        .split(": ", 1)[1]
        .startswith(
            "rejected: hook '25-koordinator': RunPodSandbox: pod default/spark-1: annotation "
            f"{SPEC}"
        )
    )
    lse = _block(lines, "default/lse-0 server")
    assert '    moves: default/spark-0 executor cpuset_cpus="0"' in lse  # out of the BE pool
    assert "out of the BE pool too (LSE)" in lse[-1]


@pytest.mark.parametrize(
    ("hooks", "code"), [pytest.param(None, 0, id="recorded"), pytest.param("none", 1, id="none")]
)
def test_explain_keeps_the_exit_status_of_the_comparison(hooks: str | None, code: int) -> None:
    out = io.StringIO()
    assert replay_command(COLOCATED, None, hooks, False, out, ["koordinator"]) == code
    text = out.getvalue()
    assert text.startswith("koordinator (as replayed), per container:\n")
    if hooks == "none":
        assert "  hook koordinator did not run in this replay (is it in the chain?)" in text
        assert "forwarded config.linux.resources.cpuset_cpus" in text
    else:
        assert "default/lsr-0 server\n" in text
