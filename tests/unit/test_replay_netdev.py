"""The netdev hook recorded and replayed: what it asks the kernel (through the Netlink seam,
from its worker threads) is noted in the recording, what it changes is an effect the replay
compares and never makes, and its refusals replay too. Recorded in process on a kernel in
memory (tests/unit/record_harness.py); the real kernel's is in the corpus
(tests/replay/containerd-node.jsonl)."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.netdev.hook import NetdevHook
from crihook.hooks.node import LinkInfo
from crihook.hooks.spec import PodView, Reject
from crihook.proxy.config import settings_from_toml
from crihook.proxy.core import observe
from crihook.proxy.core.observe import EFFECTS, ObservedNetlink
from crihook.proxy.cri.outcome import Outcome
from crihook.proxy.cri.runtime import RuntimeCallFailed
from crihook.proxy.replay.cli import replay_command
from crihook.proxy.replay.file import CallEntry, read_recording
from crihook.proxy.replay.runner import replay
from crihook.proxy.replay.seams import RecordedNetlink, RecordedNode
from crihook.proxy.state.store import Store
from tests.lab.kubelet_encoding import ContainerSpec, PodSpec
from tests.unit.netdev_fakes import HOST, FakeKernel, FakeNetlink
from tests.unit.record_harness import RecordingNode

KEY = "netdevs.crihook.io/pod"
NETDEV = {"namespaces": ["net"], "interfaces": ["vf*"], "parents": ["eth1"]}
CONFIG = {"hooks": {"order": ["netdev"], "netdev": NETDEV}}
ASKED = [
    {"name": "net1", "interface": "vf0", "addresses": ["10.1.0.5/24"], "mtu": 9000},
    {"name": "net2", "type": "macvlan", "parent": "eth1"},
]


def pod(name: str, links: Any, namespace: str = "net", host_network: bool = False) -> PodSpec:
    return PodSpec(
        name,
        namespace=namespace,
        uid=f"00000000-0000-4000-8000-{len(name):012d}{name}"[:36],
        host_network=host_network,
        annotations={KEY: json.dumps(links)},
        containers=[ContainerSpec("app")],
    )


async def record(workdir: Path) -> Path:
    """A pod gets a moved interface and a macvlan, and gives them back; three are refused:
    on the host's network, in a namespace that may not ask, an interface not on the node."""
    node = RecordingNode(workdir, CONFIG)
    node.kernel.add("vf0", up=True)
    node.kernel.add("eth1")
    await node.start()
    outcome = await node.run_pod(pod("net-app", ASKED))
    assert outcome.status is None, outcome.status
    assert node.kernel.names("/var/run/netns/cni-1") == ["net1", "net2"]
    for refused in (
        pod("net-host", ASKED[:1], host_network=True),
        pod("net-other", ASKED[:1], namespace="default"),
        pod("net-gone", [{"name": "net1", "interface": "vf9"}]),
    ):
        assert (await node.run_pod(refused)).status is not None
    await node.stop_pod(_sandbox(outcome))
    assert node.kernel.find(HOST, "vf0") is not None
    return await node.close(workdir / "rec.jsonl")


def _sandbox(outcome: Outcome) -> str:
    assert outcome.response is not None
    return str(api_pb2.RunPodSandboxResponse.FromString(outcome.response).pod_sandbox_id)


def _calls(path: Path) -> list[CallEntry]:
    recording = read_recording(path)
    return [e for s in recording.segments for e in s.entries if isinstance(e, CallEntry)]


async def test_netdev_round_trip_replays_clean(tmp_path: Path) -> None:
    path = await record(tmp_path)

    report = await replay(read_recording(path))

    assert [r.differences for r in report.differing] == []
    assert report.warnings == []
    assert all(r.notes == [] for r in report.results)
    run = next(c for c in _calls(path) if c.doc["pod"] == "net/net-app")
    ops = [(o["seam"], o["op"]) for o in run.doc["observed"]]
    # Noted from the hook's worker threads: the host looked up, then the set-up in the pod.
    assert ("netlink", "host_link") in ops
    effects = [o["op"] for o in run.doc["observed"] if o["op"] in EFFECTS]
    assert effects == ["move_in", "configure", "create", "configure"]
    stop = next(c for c in _calls(path) if c.event.value == "StopPodSandbox")
    assert [o["op"] for o in stop.doc["observed"] if o["op"] in EFFECTS] == [
        "delete",
        "move_out",
        "restore",
    ]


async def test_netdev_refusals_replay(tmp_path: Path) -> None:
    path = await record(tmp_path)
    statuses = {c.doc["pod"]: (c.status or {}).get("code") for c in _calls(path)}
    assert statuses == {
        "net/net-app": None,
        "net/net-host": "INVALID_ARGUMENT",
        "default/net-other": "PERMISSION_DENIED",
        "net/net-gone": "INVALID_ARGUMENT",
    }

    report = await replay(read_recording(path))

    assert report.differing == []


async def test_without_netdev_the_replay_names_the_call_and_the_effects(tmp_path: Path) -> None:
    path = await record(tmp_path)
    out = io.StringIO()

    code = await asyncio.to_thread(replay_command, path, None, "none", False, out, ())

    assert code == 1
    text = out.getvalue()
    run = next(c for c in _calls(path) if c.doc["pod"] == "net/net-app")
    assert f"line {run.line} (seq {run.seq}): RunPodSandbox, pod net/net-app\n" in text
    netns = "/var/run/netns/cni-1"
    for effect in (
        f"move_in('{netns}', 2, 'net1')",
        f"configure('{netns}', 'net1', 9000, ['10.1.0.5/24'])",
        f"create('{netns}', 'net2', 'macvlan', 3, 'bridge')",
        f"delete('{netns}', 'net2')",
        "restore(2, 'vf0', 1500, True)",
    ):
        assert f'  host {effect}: recorded "made", replayed (absent)\n' in text
    assert 'status: recorded "INVALID_ARGUMENT: ' in text  # the refusals: now let through


async def test_a_changed_netdev_policy_is_a_status_and_effect_difference(tmp_path: Path) -> None:
    path = await record(tmp_path)
    stricter = {"hooks": {"order": ["netdev"], "netdev": {**NETDEV, "parents": []}}}

    report = await replay(read_recording(path), settings_from_toml(stricter))

    run = next(r for r in report.differing if "net/net-app" in getattr(r.entry, "label", ""))
    assert [d.what for d in run.differences] == ["status", "forwarded"] + ["host"] * 4
    assert run.differences[0].replayed.startswith("PERMISSION_DENIED: ")


async def test_the_observed_netlink_notes_from_a_worker_thread() -> None:
    kernel = FakeKernel()
    kernel.add("eth1")
    kernel.add_netns("/ns/a")
    netlink = ObservedNetlink(FakeNetlink(kernel))

    def work() -> LinkInfo | None:
        with netlink.session("/ns/a") as session:
            found = session.host_link("eth1")
            session.create("m0", "macvlan", 2, "bridge")
            return found

    observed, token = observe.begin()
    try:
        found = await asyncio.to_thread(work)  # to_thread copies the context: the same list
    finally:
        observe.end(token)

    assert found is not None
    assert [(o.seam, o.op, o.args) for o in observed] == [
        ("netlink", "session", ["/ns/a"]),
        ("netlink", "host_link", ["eth1"]),
        ("netlink", "create", ["/ns/a", "m0", "macvlan", 2, "bridge"]),
    ]
    assert observed[1].result == found.to_dict()


@pytest.mark.parametrize("recorded_error", [True, False], ids=["enter-fails", "missing"])
async def test_the_recorded_netlink_answers_and_notes_without_touching_a_kernel(
    tmp_path: Path, recorded_error: bool
) -> None:
    store = Store(tmp_path)
    node = RecordedNode(store)
    session_doc: dict[str, Any] = {"seam": "netlink", "op": "session", "args": ["/ns/b"]}
    if recorded_error:
        session_doc["error"] = {"type": "FileNotFoundError", "errno": 2, "message": "[Errno 2] x"}
    else:
        session_doc["result"] = None
    node.begin([session_doc])
    netlink = RecordedNetlink(node)

    if recorded_error:
        with pytest.raises(FileNotFoundError) as caught, netlink.session("/ns/b"):
            pass
        assert caught.value.strerror == "x"
    else:
        with netlink.session("/ns/b") as session:
            assert session.pod_link("net1") is None  # not in the recording: not there
            session.move_in(7, "net1")
        assert node.effects == [
            {"seam": "netlink", "op": "move_in", "args": ["/ns/b", 7, "net1"], "result": None}
        ]
        assert node.missing == [
            "netlink.pod_link('/ns/b', 'net1')",
            "netlink.move_in('/ns/b', 7, 'net1')",
        ]


async def test_a_recorded_runtime_error_is_raised_again_and_netdev_names_it(
    tmp_path: Path,
) -> None:
    """A runtime query that failed in the recording fails again in the replay, as the
    RuntimeCallFailed the wire raises, and keeps the recording's doc. Its text is
    `CODE: details`: the reason netdev refuses the pod with (and kubelet and the recording
    see) reads so since the control path translates grpc's errors at the wire; it was
    grpc's multi-line AioRpcError text before."""
    sandbox = "ab" * 32
    error = {"type": "rpc", "code": "UNAVAILABLE", "message": "connection refused"}
    node = RecordedNode(Store(tmp_path))
    node.begin([{"seam": "runtime", "op": "sandbox_netns", "args": [sandbox], "error": error}])
    with pytest.raises(RuntimeCallFailed) as caught:
        await node.sandbox_netns(sandbox)
    assert str(caught.value) == "UNAVAILABLE: connection refused"
    assert observe.error_doc(caught.value) == error

    node.begin([{"seam": "runtime", "op": "sandbox_netns", "args": [sandbox], "error": error}])
    hook = NetdevHook(NETDEV)
    hook._runtime = node  # as synchronize hands it over
    with pytest.raises(Reject) as refused:
        await hook._netns(PodView(id=sandbox, uid="u", name="net-app", namespace="net"))
    assert str(refused.value) == (
        "netdevs.crihook.io/pod: cannot ask the runtime for sandbox abababababab's network "
        "namespace: UNAVAILABLE: connection refused"
    )
