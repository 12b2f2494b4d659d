"""bench.run's CreateContainer cells send into a pod per worker: crihook serializes one pod's
calls (the pipeline's pod lock), so c workers into one pod would measure the lock. No
processes here: the payloads, the load generator's choice of request per worker, its command
line and the target's verdict."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from bench import loadgen, payloads
from bench.run import GO_TARGETS, SCENARIOS, Payload, check_targets, create_container_payload
from crihook.api.cri.v1 import api_pb2
from crihook.hooks.spec.views import pod_view_from_config

HOOKS_NONE = next(s for s in SCENARIOS if s.name == "hooks-none")


class Sent(NamedTuple):
    worker: int
    sandbox_id: str
    lock_key: str
    pod_name: str
    container_name: str
    raw: bytes


def _sent(kubelet_requests: bool, concurrency: int, rounds: int = 3) -> list[Sent]:
    """What a cell's workers send over `rounds` calls each, as the bench builds it for a run
    up to c=16."""
    payload = create_container_payload(kubelet_requests, pods=16)
    make = loadgen.request_factory(
        payload.per_worker(concurrency), payloads.NAME_MARKER.encode(), 0
    )
    sent = []
    for _ in range(rounds):
        for worker in range(concurrency):
            raw = make(worker)
            request = api_pb2.CreateContainerRequest.FromString(raw)
            # The pipeline's lock key for a pod its store does not know (the fake runtime's
            # pods): the uid of the pod view it builds from the request.
            pod = pod_view_from_config(request.pod_sandbox_id, request.sandbox_config)
            sent.append(
                Sent(
                    worker,
                    request.pod_sandbox_id,
                    pod.uid,
                    pod.name,
                    request.config.metadata.name,
                    raw,
                )
            )
    return sent


@pytest.mark.parametrize("kubelet_requests", [False, True], ids=["bench-pod", "kubelet"])
@pytest.mark.parametrize("concurrency", [1, 16], ids=["c1", "c16"])
def test_a_create_container_cell_sends_a_pod_per_worker(
    kubelet_requests: bool, concurrency: int
) -> None:
    sent = _sent(kubelet_requests, concurrency)

    assert len({s.sandbox_id for s in sent}) == concurrency
    assert len({s.lock_key for s in sent}) == concurrency
    assert len({s.pod_name for s in sent}) == concurrency
    for worker in range(concurrency):  # a worker stays in its pod: no call waits on another's
        assert len({(s.sandbox_id, s.lock_key) for s in sent if s.worker == worker}) == 1
    assert len({s.container_name for s in sent}) == len(sent)  # still a name per request


@pytest.mark.parametrize("kubelet_requests", [False, True], ids=["bench-pod", "kubelet"])
def test_a_twin_pods_request_names_its_own_pod_wherever_kubelet_did(
    kubelet_requests: bool,
) -> None:
    first, twin = _sent(kubelet_requests, 16, rounds=1)[:2]
    request = api_pb2.CreateContainerRequest.FromString(twin.raw)
    sandbox, config = request.sandbox_config, request.config

    assert sandbox.labels["io.kubernetes.pod.uid"] == twin.lock_key
    assert sandbox.labels["io.kubernetes.pod.name"] == twin.pod_name
    assert config.labels["io.kubernetes.pod.uid"] == twin.lock_key
    assert config.labels["io.kubernetes.pod.name"] == twin.pod_name
    assert sandbox.linux.cgroup_parent.endswith(f"pod{twin.lock_key}")
    assert sandbox.log_directory.endswith(f"_{twin.pod_name}_{twin.lock_key}")
    assert all(twin.lock_key in m.host_path for m in config.mounts)
    # Nothing of pod 0's identity is left in the twin's bytes.
    assert first.lock_key.encode() not in twin.raw
    assert first.sandbox_id.encode() not in twin.raw


@pytest.mark.parametrize("kubelet_requests", [False, True], ids=["bench-pod", "kubelet"])
def test_pod_0s_request_is_todays_and_every_twins_as_long(kubelet_requests: bool) -> None:
    payload = create_container_payload(kubelet_requests, pods=16)
    today = (
        payloads.kubelet_create_container_request()
        if kubelet_requests
        else payloads.fake_create_container_request()
    )

    assert payload.per_worker(1) == (today,) and payload.data == today
    assert {len(request) for request in payload.per_worker(16)} == {len(today)}


def test_a_call_made_into_no_pod_sends_one_request_at_any_concurrency() -> None:
    assert Payload(b"list").per_worker(16) == (b"list",)


def test_more_workers_than_pods_is_refused() -> None:
    with pytest.raises(ValueError, match="17 workers, requests into 16 pods only"):
        create_container_payload(False, pods=16).per_worker(17)


def test_the_load_generator_is_given_every_pods_request() -> None:
    argv = loadgen.command("unix:///x.sock", payloads.CREATE_CONTAINER, ["a", "b"], 2, 0.5, 2.5)

    assert loadgen.parse_args(argv[3:]).payload == ["a", "b"]


def _summary(rps_x: float) -> list[dict[str, object]]:
    return [
        {
            "backend": "fake",
            "method": "CreateContainer",
            "concurrency": 16,
            "path": "hooks-none",
            "rps_x": rps_x,
        }
    ]


@pytest.mark.parametrize(
    ("rps_x", "met"), [(0.85, True), (0.8, True), (0.5, False)], ids=["above", "at", "below"]
)
def test_c16_intercepted_throughput_is_checked_against_at_least_08_direct(
    rps_x: float, met: bool
) -> None:
    checks = [
        c
        for c in check_targets(_summary(rps_x), [], [HOOKS_NONE], [])
        if "c=16, CreateContainer" in c["what"]
    ]

    assert [(c["value"], c["limit"], c["bound"], c["met"]) for c in checks] == [
        (rps_x, GO_TARGETS.c16_intercepted_rps_x_min, "≥", met)
    ]


def test_no_c16_verdict_when_c16_was_not_measured() -> None:
    checks = check_targets([], [], [HOOKS_NONE], [])

    assert not [c for c in checks if "c=16" in c["what"]]
