"""The bench's kubelet pieces that need no runtime: the requests captured from the kubelet
corpus (bench/kubelet_captured) and the --kubelet report's arithmetic."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from bench import kubelet_capture, payloads
from bench.kubelet_start import own_ms, own_ms_by_call, paired_interval, report, verdict
from crihook.api.cri.v1 import api_pb2


def test_the_captured_requests_are_the_corpus_kubelets(tmp_path: Path) -> None:
    written = kubelet_capture.capture(out_dir=tmp_path)

    assert sorted(p.name for p in written) == ["CreateContainer.bin", "RunPodSandbox.bin"]
    for path in written:
        assert path.read_bytes() == (payloads.KUBELET_CAPTURED / path.name).read_bytes()


def test_the_kubelet_create_container_request_is_kubelets_with_a_name_per_request() -> None:
    raw = (payloads.KUBELET_CAPTURED / "CreateContainer.bin").read_bytes()
    captured = api_pb2.CreateContainerRequest.FromString(raw)
    sent = api_pb2.CreateContainerRequest.FromString(payloads.kubelet_create_container_request())

    assert sent.config.metadata.name == f"app-{payloads.NAME_MARKER}"
    assert sent.config.labels["io.kubernetes.container.name"] == sent.config.metadata.name
    sent.config.metadata.name = sent.config.labels["io.kubernetes.container.name"] = "app"
    assert sent == captured  # nothing else changed
    # A real kubelet's: its config source, its cgroup root, its QoS class.
    assert captured.sandbox_config.annotations["kubernetes.io/config.source"] == "api"
    assert "/kubepods/burstable/pod" in captured.sandbox_config.linux.cgroup_parent
    sandbox = api_pb2.RunPodSandboxRequest.FromString(payloads.kubelet_run_pod_sandbox_request())
    assert sandbox.config.metadata == captured.sandbox_config.metadata


def test_the_marked_kubelet_run_pod_sandbox_is_a_pod_per_request() -> None:
    captured = api_pb2.RunPodSandboxRequest.FromString(payloads.kubelet_run_pod_sandbox_request())
    marked = payloads.kubelet_run_pod_sandbox_request(marked=True)
    first = api_pb2.RunPodSandboxRequest.FromString(marked.replace(b"@@@@@@@@@@", b"0000000001"))
    second = api_pb2.RunPodSandboxRequest.FromString(marked.replace(b"@@@@@@@@@@", b"0000000002"))

    old_uid = captured.config.metadata.uid
    uid = first.config.metadata.uid
    assert len(uid) == len(old_uid) and uid.endswith("0000000001")
    assert uid != second.config.metadata.uid
    assert first.config.metadata.name == "burstable-0000000001"
    assert first.config.labels["io.kubernetes.pod.uid"] == uid
    assert first.config.labels["io.kubernetes.pod.name"] == first.config.metadata.name
    assert first.config.log_directory.endswith(f"default_burstable-0000000001_{uid}")
    assert first.config.linux.cgroup_parent.endswith(f"/pod{uid}")
    # Nothing else changed: put kubelet's names back and it is the captured request.
    marked_back = marked.replace(b"@@@@@@@@@@", old_uid[-10:].encode())
    back = api_pb2.RunPodSandboxRequest.FromString(marked_back)
    name = f"burstable-{old_uid[-10:]}"
    back.config.metadata.name = back.config.labels["io.kubernetes.pod.name"] = "burstable"
    back.config.log_directory = back.config.log_directory.replace(name, "burstable")
    assert back == captured


def test_the_kubelet_report_pairs_each_rep_with_its_direct_start() -> None:
    text = report(
        "1.6",
        "guaranteed",
        {
            "direct": [100.0, 200.0, 300.0],
            "kubelet-static": [100.0, 250.0, 300.0],
            "hooks-none": [110.0, 200.0, 600.0],
            "cpuset,numa,oom": [110.0, 250.0, 330.0],
        },
    )

    cells = {
        row[0]: row[1:]
        for line in text.splitlines()
        if line.startswith("| ") and (row := [c.strip() for c in line.strip("|").split("|")])
    }
    # hooks-none: median 200 against 200; per rep 1.1, 1.0 and 2.0, median 1.1
    assert cells["hooks-none"][1] == "200.0"
    # resampled, the median of three ratios is one of them: 1.0 to 2.0 at the widest
    assert cells["hooks-none"][3:5] == ["1.000", "1.100"]
    low, high = map(float, cells["hooks-none"][5].split("-"))
    assert 1.0 <= low <= 1.1 <= high <= 2.0
    assert cells["hooks-none"][6:] == ["-", "-"]
    assert cells["direct"][3:6] == ["1.000", "1.000", "-"]
    # the resource hooks against kubelet's own placement too: per rep 1.1, 1.0, 1.1
    assert cells["cpuset,numa,oom"][3:5] == ["1.250", "1.100"]
    assert cells["cpuset,numa,oom"][6:] == ["kubelet-static", "1.100"]


def test_crihooks_own_part_of_a_start_is_each_start_calls_time_less_the_runtimes() -> None:
    def line(method: str, pod: str, elapsed: float, runtime: float | None) -> str:
        doc = {"logger": "crihook.proxy.call_log", "method": method, "pod": f"default/{pod}"}
        doc["elapsed_ms"] = elapsed
        if runtime is not None:
            doc["runtime_ms"] = runtime
        return json.dumps(doc)

    log = "\n".join(
        [
            '{"logger": "crihook.proxy.app", "msg": "ready"}',
            line("RunPodSandbox", "p", 100.0, 99.0),
            line("CreateContainer", "p", 20.0, 18.5),
            line("CreateContainer", "other", 20.0, 1.0),  # another pod
            line("StartContainer", "p", 50.0, 49.5),
            line("StopContainer", "p", 10.0, 1.0),  # not on the way to running
            line("StartContainer", "p", 0.25, None),  # refused: never reached the runtime
        ]
    )
    assert own_ms(log, "p") == 1.0 + 1.5 + 0.5 + 0.25
    assert own_ms_by_call(log, "p") == {
        "RunPodSandbox": 1.0,
        "CreateContainer": 1.5,
        "StartContainer": 0.75,
    }

    text = report(
        "2",
        "guaranteed",
        {"direct": [100.0, 200.0, 300.0], "hooks-none": [100.0, 200.0, 300.0]},
        own={
            "hooks-none": [
                {"RunPodSandbox": 0.5, "CreateContainer": 0.25, "StartContainer": 0.25},
                {"RunPodSandbox": 1.0, "CreateContainer": 0.5, "StartContainer": 0.5},
                {"RunPodSandbox": 1.5, "CreateContainer": 1.0, "StartContainer": 0.5},
            ]
        },
    )
    assert "hooks-none: crihook's own part of a start" in text
    assert "median 2.00 ms (p25-p75 1.00-3.00), 1.00% of direct's median start" in text
    assert "median per call: RunPodSandbox 1.00, CreateContainer 0.50, StartContainer 0.50" in text


def test_the_paired_interval_narrows_with_more_reps_and_holds_the_median() -> None:
    direct = [100.0] * 40
    spread = [100.0 + (i % 10) * 3 for i in range(40)]  # ratios 1.00 to 1.27
    low, high = paired_interval(spread, direct)
    assert low <= statistics.median(s / 100.0 for s in spread) <= high
    wide = high - low
    low, high = paired_interval(spread * 10, direct * 10)
    assert high - low < wide
    assert paired_interval([105.0] * 5, [100.0] * 5) == (1.05, 1.05)


def test_the_target_is_judged_on_the_interval_not_the_median() -> None:
    assert verdict(0.99, 1.015).startswith("met")
    assert verdict(1.021, 1.05).startswith("NOT met")
    assert verdict(0.98, 1.06).startswith("not resolved by these reps")
    text = report(
        "1.6",
        "guaranteed",
        {"direct": [100.0] * 4, "hooks-none": [101.0] * 4, "cpuset,numa,oom": [110.0] * 4},
    )
    assert "- hooks-none: met (95% interval 1.010-1.010)" in text
    assert "- cpuset,numa,oom: NOT met (95% interval 1.100-1.100)" in text
