"""The replay corpus: recordings of real node traffic (crihook in front of the lab's
containerd, driven by the kubelet-like client; re-recorded with
`python -m tests.replay.record_corpus`) replayed through today's chain, without containerd.

A difference here means the hooks now do something else with the same traffic: look at the
diff, and if the new behaviour is meant, re-record the corpus (or `crihook replay --update`).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from crihook.proxy.replay import replay
from crihook.proxy.replay_file import CallEntry, Recording, read_recording

HERE = Path(__file__).resolve().parent
CORPUS = sorted(HERE.glob("*.jsonl"))


def test_the_corpus_is_there_and_small() -> None:
    assert [p.name for p in CORPUS] == ["containerd-node.jsonl"]
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
    statuses = Counter((c.status or {}).get("code", "OK") for c in calls)
    assert statuses["PERMISSION_DENIED"] == 1 and statuses["INVALID_ARGUMENT"] == 1
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
