"""The netdev hook in-process on a kernel in memory (tests/unit/netdev_fakes.py): interfaces
set up after RunPodSandbox and given back before StopPodSandbox, all or nothing; refusals
before anything is made; a restart repairs what it finds. The real kernel runs the same in
tests/integration/test_device_hooks_containerd.py. Also: the annotation parser (tables and
properties)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.netdev import NetdevHook, parse_netdev_annotation, parse_policy
from crihook.hooks.netdev.annotation import AnnotationError, LinkAsk
from crihook.hooks.spec import Event, Forbidden, InvalidRequest, PodView, Reject, Stage
from crihook.hooks.spec.views import pod_view_from_config
from tests.lab.kubelet_encoding import PodSpec, sandbox_config
from tests.unit.hook_harness import SMALL, Node, burstable, topology_of
from tests.unit.netdev_fakes import HOST, FakeKernel, FakeNetlink

TOPO = topology_of(SMALL)
KEY = "netdevs.crihook.io/pod"
POLICY = {"namespaces": ["net"], "interfaces": ["vf*"], "parents": ["eth1"]}
MOVE = {"name": "net1", "interface": "vf0", "addresses": ["10.1.0.5/24"], "mtu": 9000}
MACVLAN = {"name": "net2", "type": "macvlan", "parent": "eth1", "addresses": ["fd00::5/64"]}


class Lab:
    def __init__(self, options: dict[str, Any] | None = None) -> None:
        self.kernel = FakeKernel()
        self.kernel.add("vf0", mtu=1500, up=True)
        self.kernel.add("vf1", up=False)
        self.kernel.add("eth1")
        self.kernel.add("eth0")
        self.netlink = FakeNetlink(self.kernel)
        self.node = Node(
            NetdevHook(POLICY if options is None else options), TOPO, netlink=self.netlink
        )

    async def start(self) -> Lab:
        await self.node.sync()
        return self

    def spec(self, name: str, links: Any, namespace: str = "net", **kw: Any) -> PodSpec:
        value = links if isinstance(links, str) else json.dumps(links)
        return PodSpec(
            name, namespace=namespace, containers=[burstable("app")], annotations={KEY: value},
            host_network=kw.pop("host_network", False), **kw,
        )  # fmt: skip

    async def run(self, name: str, links: Any, namespace: str = "net", **kw: Any) -> PodView:
        netns = f"/var/run/netns/cni-{name}"
        self.kernel.add_netns(netns)
        self.node.runtime.netns[name] = netns
        return await self.node.run_pod(self.spec(name, links, namespace, **kw), name)

    async def stop(self, pod: PodView, *, netns_gone: bool = True) -> None:
        request = api_pb2.StopPodSandboxRequest(pod_sandbox_id=pod.id)
        await self.node.stage(Event.STOP_POD_SANDBOX, Stage.PRE, pod, None, request)
        if netns_gone:
            self.kernel.destroy_netns(f"/var/run/netns/cni-{pod.id}")
        response = api_pb2.StopPodSandboxResponse()
        await self.node.stage(Event.STOP_POD_SANDBOX, Stage.POST, pod, None, request, response)

    def pod_ns(self, name: str) -> str:
        return f"/var/run/netns/cni-{name}"

    def records(self) -> dict[str, Any]:
        return dict(self.node.state.items())


async def lab(options: dict[str, Any] | None = None) -> Lab:
    return await Lab(options).start()


# --- set up and given back ---------------------------------------------------------------------


async def test_no_annotation_no_netlink() -> None:
    t = await lab()
    await t.node.run_pod(PodSpec("p", namespace="net", host_network=False), "p")
    assert t.netlink.sessions == [] and t.records() == {}


async def test_a_moved_interface_and_a_macvlan_come_and_go() -> None:
    t = await lab()
    pod = await t.run("p1", [MOVE, MACVLAN])
    ns = t.pod_ns("p1")
    assert t.kernel.names(ns) == ["net1", "net2"]
    net1, net2 = t.kernel.find(ns, "net1"), t.kernel.find(ns, "net2")
    assert net1 is not None and net2 is not None
    assert (net1.mtu, net1.addresses, net1.up) == (9000, ["10.1.0.5/24"], True)
    assert (net2.kind, net2.addresses, net2.up) == ("macvlan", ["fd00::5/64"], True)
    assert t.kernel.find(HOST, "vf0") is None
    assert [k for k in t.records()] == ["s:p1"]
    await t.stop(pod)
    vf0 = t.kernel.find(HOST, "vf0")
    assert vf0 is not None and (vf0.mtu, vf0.up) == (1500, True)  # as it was
    assert t.records() == {}


async def test_an_interface_goes_to_one_pod_at_a_time() -> None:
    t = await lab()
    first = await t.run("p1", [MOVE])
    with pytest.raises(Reject) as info:
        await t.run("p2", [{"name": "x", "interface": "vf0"}])
    assert type(info.value) is Reject  # FAILED_PRECONDITION: it is free again later
    assert "interface vf0 is in pod net/p1 until that pod stops" in info.value.reason
    await t.stop(first)
    await t.run("p3", [{"name": "x", "interface": "vf0"}])


# --- refused before anything is made ------------------------------------------------------------

REFUSALS = [
    ("net", [MOVE], {"host_network": True}, InvalidRequest, "runs on the host's network"),
    ("default", [MOVE], {}, Forbidden, "namespace 'default' may not ask for network interfaces"),
    ("net", [{"name": "n", "interface": "eth0"}], {}, Forbidden,
     "[0]: interface eth0 may not be moved into a pod ([hooks.netdev] interfaces allows vf*)"),
    ("net", [{"name": "n", "type": "macvlan", "parent": "eth0"}], {}, Forbidden,
     "macvlan on eth0 is not allowed ([hooks.netdev] parents allows eth1)"),
    ("net", [{"name": "n", "interface": "vf9"}], {}, InvalidRequest,
     "[0]: interface vf9 is not on this node"),
    ("net", "[{", {}, InvalidRequest, "the value is not JSON"),
    ("net", [MOVE] * 5, {}, InvalidRequest, "name net1 is given twice"),
    ("net", [{"name": f"n{i}", "type": "macvlan", "parent": "eth1"} for i in range(5)], {},
     Forbidden, "5 interfaces asked, at most 4 per pod"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("namespace", "links", "kw", "error", "message"),
    REFUSALS,
    ids=["host-network", "namespace", "interface", "parent", "missing", "json", "twice", "many"],
)
async def test_refusals_come_before_anything_is_made(
    namespace: str, links: Any, kw: dict[str, Any], error: type[Reject], message: str
) -> None:
    t = await lab()
    with pytest.raises(Reject) as info:
        await t.run("p1", links, namespace, **kw)
    assert type(info.value) is error and message in info.value.reason
    assert t.records() == {} and t.kernel.names(t.pod_ns("p1")) == []
    assert all(name in t.kernel.names(HOST) for name in ("vf0", "vf1", "eth1"))


# --- all or nothing -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("operation", "name"),
    [("configure", "net1"), ("create", "net2"), ("configure", "net2")],
    ids=["first-configure", "second-create", "second-configure"],
)
async def test_a_failure_midway_undoes_everything_for_the_pod(operation: str, name: str) -> None:
    t = await lab()
    t.kernel.fail(operation, name)
    with pytest.raises(Reject) as info:
        await t.run("p1", [MOVE, MACVLAN])
    assert "injected" in info.value.reason and "netdevs.crihook.io/pod [" in info.value.reason
    assert t.kernel.names(t.pod_ns("p1")) == []
    vf0 = t.kernel.find(HOST, "vf0")
    assert vf0 is not None and (vf0.mtu, vf0.up) == (1500, True)
    assert t.records() == {}
    # Nothing is claimed: another pod can have it at once.
    await t.run("p2", [MOVE])


async def test_a_name_taken_in_the_pod_fails_after_the_move_and_is_undone() -> None:
    t = await lab()
    t.kernel.add_netns(t.pod_ns("p1"))
    t.kernel.add("eth0", ns=t.pod_ns("p1"), kind="veth")  # the CNI's interface
    t.node.runtime.netns["p1"] = t.pod_ns("p1")
    with pytest.raises(Reject) as info:
        await t.node.run_pod(t.spec("p1", [MACVLAN, {"name": "eth0", "interface": "vf0"}]), "p1")
    assert "[1]: moving vf0 into the pod as eth0" in info.value.reason
    assert t.kernel.names(t.pod_ns("p1")) == ["eth0"]
    vf0 = t.kernel.find(HOST, "vf0")
    assert vf0 is not None and vf0.up and t.records() == {}


async def test_a_later_hook_refusing_the_sandbox_undoes_the_set_up() -> None:
    t = await lab()
    spec = t.spec("p1", [MOVE])
    await t.run("p1", [MOVE])
    before = pod_view_from_config("", sandbox_config(spec))
    before = PodView(**{**before.__dict__, "uid": t.node.pods["p1"].uid})
    await t.node.stage(
        Event.RUN_POD_SANDBOX, Stage.FAILED, before, None,
        api_pb2.RunPodSandboxRequest(config=sandbox_config(spec)), failure="hook x refused it",
    )  # fmt: skip
    assert t.kernel.find(HOST, "vf0") is not None and t.records() == {}


async def test_what_cannot_be_given_back_before_stop_is_repaired_after() -> None:
    t = await lab()
    pod = await t.run("p1", [MOVE])
    t.kernel.fail("move_out", "net1")
    await t.stop(pod)  # the namespace goes; the kernel hands vf0 back as net1
    vf0 = t.kernel.find(HOST, "vf0")
    assert vf0 is not None and t.kernel.find(HOST, "net1") is None
    assert t.records() == {}


# --- restarts -------------------------------------------------------------------------------------


async def restarted(t: Lab, pods: list[str]) -> Lab:
    again = Lab.__new__(Lab)
    again.kernel, again.netlink = t.kernel, t.netlink
    again.node = Node(NetdevHook(POLICY), TOPO, state=t.node.state, netlink=t.netlink)
    again.node.runtime.netns = dict(t.node.runtime.netns)
    again.node.pods = {p: t.node.pods[p] for p in pods}
    await again.node.sync()
    return again


async def test_a_pod_gone_while_crihook_was_down_gets_its_interfaces_back_named() -> None:
    t = await lab()
    await t.run("p1", [MOVE, MACVLAN])
    t.kernel.add("net1")  # the name the interface had in the pod is taken on the host
    t.kernel.destroy_netns(t.pod_ns("p1"))  # vf0 comes back as devN; net2 is gone
    assert t.kernel.find(HOST, "vf0") is None
    again = await restarted(t, [])
    vf0 = again.kernel.find(HOST, "vf0")
    assert vf0 is not None and vf0.mtu == 1500 and again.records() == {}


async def test_a_set_up_crihook_did_not_see_end_is_kept_when_complete_undone_when_not() -> None:
    t = await lab()
    # crihook wrote the plan (pre) and stopped before its post stage recorded anything.
    spec = t.spec("p1", [MOVE, MACVLAN])
    t.kernel.add_netns(t.pod_ns("p1"))
    t.node.runtime.netns["p1"] = t.pod_ns("p1")
    config = sandbox_config(spec)
    view = pod_view_from_config("", config)
    await t.node.stage(
        Event.RUN_POD_SANDBOX, Stage.PRE, view, None, api_pb2.RunPodSandboxRequest(config=config)
    )
    assert list(t.records()) == [f"p:{spec.uid}/0"]
    t.node.pods["p1"] = pod_view_from_config("p1", config)
    # Half done: vf0 moved in, no macvlan yet.
    t.kernel.namespaces[HOST].pop(t.kernel.find(HOST, "vf0").index)  # type: ignore[union-attr]
    t.kernel.add("net1", ns=t.pod_ns("p1"), kind="")
    again = await restarted(t, ["p1"])
    assert again.kernel.names(again.pod_ns("p1")) == [] and again.records() == {}
    assert again.kernel.find(HOST, "net1") is None
    # Complete: kept, recorded, given back at stop.
    await again.run("p2", [MOVE, MACVLAN])
    done = again.records()["s:p2"]
    again.node.state.delete("s:p2")
    again.node.state.set(
        f"p:{again.node.pods['p2'].uid}/0", {"links": done["asked"], "moved": done["moved"]}
    )
    third = await restarted(again, ["p2"])
    assert list(third.records()) == ["s:p2"]
    await third.stop(third.node.pods["p2"])
    assert third.kernel.find(HOST, "vf0") is not None and third.records() == {}


# --- the annotation -------------------------------------------------------------------------------


def test_the_annotation_parses_both_kinds() -> None:
    ipvlan = {"name": "n3", "type": "ipvlan", "parent": "eth1", "mode": "l3"}
    asks = parse_netdev_annotation(json.dumps([MOVE, MACVLAN, ipvlan]))
    assert asks == (
        LinkAsk("net1", "move", "vf0", "", ("10.1.0.5/24",), 9000, "[0]"),
        LinkAsk("net2", "macvlan", "eth1", "bridge", ("fd00::5/64",), None, "[1]"),
        LinkAsk("n3", "ipvlan", "eth1", "l3", (), None, "[2]"),
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("[]", "non-empty JSON list"),
        ('[{"name": "lo", "interface": "vf0"}]', "name 'lo' is not an interface name"),
        ('[{"name": "a-name-too-long-x", "interface": "vf0"}]', "is not an interface name"),
        ('[{"name": "a/b", "interface": "vf0"}]', "is not an interface name"),
        ('[{"name": "n", "interface": "vf0", "parent": "x"}]', "not both"),
        ('[{"name": "n", "type": "vlan", "parent": "x"}]', "type 'vlan'"),
        ('[{"name": "n", "type": "macvlan", "parent": "x", "mode": "l2"}]', "'l2' is not a"),
        ('[{"name": "n", "interface": "vf0", "addresses": ["10.0.0.1"]}]', "with its prefix"),
        ('[{"name": "n", "interface": "vf0", "addresses": ["10.0.0.1/40"]}]', "not an IPv4"),
        ('[{"name": "n", "interface": "vf0", "mtu": 67}]', "mtu 67 is not"),
        ('[{"name": "a", "interface": "vf0"}, {"name": "b", "interface": "vf0"}]',
         "[1]: interface vf0 is given twice"),
        ('[{"name": "a", "interface": "eth1"}, {"name": "b", "type": "ipvlan", "parent": "eth1"}]',
         "parent eth1 is moved into the pod by another entry"),
        ('[{"name": "a", "interface": "vf0", "vlan": 3}]', "unknown key(s) 'vlan'"),
    ],
    ids=["empty", "lo", "long", "slash", "both", "vlan", "mode", "no-prefix", "bad-prefix",
         "mtu", "twice", "parent-moved", "unknown"],
)  # fmt: skip
def test_annotation_refusals(value: str, message: str) -> None:
    with pytest.raises(AnnotationError) as info:
        parse_netdev_annotation(value)
    assert message in str(info.value) and str(info.value).startswith(f"annotation {KEY}")


NAMES = st.sampled_from(["net1", "vf0", "eth1", "lo", "", "x" * 16, "a:b", 3])
VALUES = st.recursive(
    NAMES | st.sampled_from(["macvlan", "ipvlan", "bridge", "l3", "10.0.0.1/24", "::1/200"])
    | st.integers(0, 70000) | st.booleans() | st.none(),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(
        st.sampled_from(["name", "interface", "type", "parent", "mode", "addresses", "mtu", "x"]),
        inner,
        max_size=5,
    ),
    max_leaves=12,
)  # fmt: skip


@settings(max_examples=400)
@given(value=st.one_of(st.text(), VALUES.map(json.dumps)))
def test_no_input_crashes_the_netdev_parser(value: str) -> None:
    try:
        asks = parse_netdev_annotation(value)
    except AnnotationError as exc:
        assert str(exc).startswith(f"annotation {KEY}") and len(str(exc)) < 600
        return
    for ask in asks:
        assert ask.kind in ("move", "macvlan", "ipvlan") and ask.name != "lo"
        assert LinkAsk.from_dict(ask.to_dict()) == ask


def test_policy_options() -> None:
    assert parse_policy({}).max_links == 4
    for options, message in [
        ({"interface": []}, "unknown option(s) interface"),
        ({"parents": "eth1"}, "parents must be a list"),
        ({"max_links": 0}, "max_links 0 is not in 1..16"),
        ({"namespaces": ["[x"]}, "'[' without a closing"),
    ]:
        with pytest.raises(ValueError) as info:
            parse_policy(options)
        assert message in str(info.value)
