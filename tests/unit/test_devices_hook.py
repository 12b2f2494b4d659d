"""The devices hook in-process, on a table of host files: what a pod asks for is granted only
as far as the node's policy allows, checked where the paths really lead; refusals name the
annotation and the entry and leave nothing reserved; pooled devices are exclusive, NUMA
aligned, kept across restarts of a container and given back when it is removed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.devices import DevicesHook
from crihook.hooks.devices.host import DeviceNode
from crihook.hooks.spec import (
    ContainerState,
    Forbidden,
    InvalidRequest,
    PodView,
    Reject,
    TopologyHint,
)
from crihook.hooks.spec.views import container_view_from_config
from tests.lab.kubelet_encoding import PodSpec
from tests.unit.devices_fakes import FakeFiles
from tests.unit.hook_harness import SMALL, Created, FakeStaging, Node, burstable, topology_of

TOPO = topology_of(SMALL)  # NUMA nodes 0 and 1


def host() -> FakeFiles:
    return FakeFiles(
        nodes={
            "/dev/fuse": DeviceNode("c", 10, 229),
            "/dev/kvm": DeviceNode("c", 10, 232),
            "/dev/mem": DeviceNode("c", 1, 1),
            "/dev/sda": DeviceNode("b", 8, 0),
            "/dev/dri/card0": DeviceNode("c", 226, 0),
            "/dev/nvidia0": DeviceNode("c", 195, 0),
            "/dev/nvidia1": DeviceNode("c", 195, 1),
            "/dev/nvidia2": DeviceNode("c", 195, 2),
            "/dev/nvidia3": DeviceNode("c", 195, 3),
            "/dev/gpu-copy": DeviceNode("c", 195, 1),  # another node for nvidia1's device
            "/srv/models/a.bin": None,
            "/srv/models/sub/b.bin": None,
            "/etc/shadow": None,
            "/scratch/job": None,
        },
        links={
            "/dev/fuse-alias": "/dev/mem",  # in the allowlist, leads out of it
            "/dev/fuse-ok": "fuse",  # in the allowlist, leads into it
            "/dev/char/195:0": "../nvidia0",
            "/srv/models/escape": "/etc",
            "/srv/models/loop": "/srv/models/loop",
        },
    )


POLICY: dict[str, Any] = {
    "namespaces": ["ml", "team-*"],
    "devices": [
        "/dev/fuse",
        "/dev/fuse-*",
        "/dev/kvm",
        "/dev/sda",
        "/dev/dri",
        "/dev/nvidia*",
        "/dev/gpu-*",
        "/dev/char/**",
    ],
    "mounts": ["/srv/models", "/srv/models/**"],
    "writable_mounts": ["/scratch/**"],
    "env": ["MODEL_*"],
    "pools": {
        "gpu": {
            "env": "GPU_VISIBLE_DEVICES",
            "devices": [
                {"id": "0", "path": "/dev/nvidia0", "numa": 0},
                {"id": "1", "path": "/dev/nvidia1", "numa": 0},
                {"id": "2", "path": "/dev/nvidia2", "numa": 1},
                {"id": "3", "paths": ["/dev/nvidia3"], "numa": 1},
            ],
        }
    },
}


_STAGINGS: list[FakeStaging] = []
"""The stagings of the nodes `start` made in this test, newest last."""


@pytest.fixture(autouse=True)
def _stagings_of_this_test() -> Iterator[None]:
    _STAGINGS.clear()
    yield
    _STAGINGS.clear()


async def start(files: FakeFiles | None = None, options: dict[str, Any] | None = None) -> Node:
    node = Node(DevicesHook(POLICY if options is None else options, files=files or host()), TOPO)
    _STAGINGS.append(node.staging)
    await node.sync()
    return node


async def pod(node: Node, sandbox: str, namespace: str = "ml", **annotations: Any) -> PodView:
    """A pod of one burstable `app` container; keyword `devices=[...]` is the annotation
    `devices.crihook.io/container.app` (JSON-encoded), `pod_devices=...` the pod-wide one."""
    encoded = {}
    for name, value in annotations.items():
        scope = "pod" if name.startswith("pod_") else "container.app"
        kind = name.removeprefix("pod_")
        text = value if isinstance(value, str) else json.dumps(value)
        encoded[f"{kind}.crihook.io/{scope}"] = text
    spec = PodSpec(sandbox, namespace=namespace, containers=[burstable("app")], annotations=encoded)
    return await node.run_pod(spec, sandbox)


def config_of(created: Created) -> api_pb2.ContainerConfig:
    return created.request.config


def pinned(created: Created, path: str) -> str:
    """The host path a path the runtime got pins (a device asked by path, a mount: a staged
    path; a pooled device: its own path)."""
    if not path.startswith(f"{FakeStaging.ROOT}/"):
        assert path.startswith("/dev/nvidia"), f"{path}: not staged, not pooled"
        return path
    return next(s.source[path] for s in reversed(_STAGINGS) if path in s.source)


def devices_of(created: Created) -> list[tuple[str, str, str]]:
    return [
        (d.container_path, pinned(created, d.host_path), d.permissions)
        for d in config_of(created).devices
    ]


def mounts_of(created: Created) -> list[tuple[str, str, bool]]:
    return [
        (m.container_path, pinned(created, m.host_path), m.readonly)
        for m in config_of(created).mounts
        if not m.container_path.startswith("/dev/termination")
    ]


def env_of(created: Created) -> dict[str, str]:
    return {e.key: e.value.decode() for e in config_of(created).envs}  # bytes, as in CRI


def held(node: Node) -> dict[str, Any]:
    return {k: v for k, v in node.state.items() if k.startswith("a:")}


# --- what is granted -------------------------------------------------------------------------


async def test_nothing_asked_nothing_done() -> None:
    files = host()
    node = await start(files)
    files.asked.clear()
    created = await node.create(await pod(node, "p1"), burstable("app"), "c1")
    assert created.pre is None and created.hints is None
    assert files.asked == []


async def test_devices_mounts_and_env_are_added_as_resolved_on_the_host() -> None:
    node = await start()
    p = await pod(
        node,
        "p1",
        devices=[
            {"path": "/dev/fuse"},
            {"path": "/dev/fuse-ok", "container_path": "/dev/f2"},
            {"path": "/dev/sda", "permissions": "r"},
        ],
        mounts={"/srv/models/sub": "/models"},
        pod_mounts=[{"host_path": "/scratch/job", "container_path": "/scratch", "readonly": False}],
        env=[{"name": "MODEL_DIR", "value": "/models"}, {"name": "MODEL_N", "value": "2"}],
    )
    created = await node.create(p, burstable("app"), "c1")
    assert devices_of(created) == [
        ("/dev/fuse", "/dev/fuse", "rw"),
        ("/dev/f2", "/dev/fuse", "rw"),  # the symlink resolved: the runtime gets the node
        ("/dev/sda", "/dev/sda", "r"),
    ]
    assert sorted(mounts_of(created)) == [
        ("/models", "/srv/models/sub", True),
        ("/scratch", "/scratch/job", False),
    ]
    assert list(env_of(created).items())[-2:] == [("MODEL_DIR", "/models"), ("MODEL_N", "2")]
    assert held(node) == {}


async def test_the_containers_own_entry_replaces_the_pod_wide_one() -> None:
    node = await start()
    p = await pod(
        node,
        "p1",
        pod_devices=[{"path": "/dev/fuse"}, {"path": "/dev/kvm"}],
        devices=[{"path": "/dev/fuse", "permissions": "r"}],
        pod_env=[{"name": "MODEL_A", "value": "pod"}, {"name": "MODEL_B", "value": "pod"}],
        env=[{"name": "MODEL_A", "value": "mine"}],
    )
    created = await node.create(p, burstable("app"), "c1")
    assert devices_of(created) == [("/dev/kvm", "/dev/kvm", "rw"), ("/dev/fuse", "/dev/fuse", "r")]
    assert env_of(created)["MODEL_A"] == "mine" and env_of(created)["MODEL_B"] == "pod"


async def test_another_containers_annotation_is_not_this_ones() -> None:
    node = await start()
    spec = PodSpec(
        "p1",
        namespace="ml",
        containers=[burstable("app"), burstable("side")],
        annotations={"devices.crihook.io/container.side": json.dumps([{"path": "/dev/kvm"}])},
    )
    p = await node.run_pod(spec, "p1")
    assert (await node.create(p, burstable("app"), "c1")).pre is None
    assert devices_of(await node.create(p, burstable("side"), "c2")) == [
        ("/dev/kvm", "/dev/kvm", "rw")
    ]


# --- what is refused ---------------------------------------------------------------------------

DEV = "devices.crihook.io/container.app"
REFUSALS = [
    # (namespace, annotations, error, fragments of the message)
    ("default", {"devices": [{"path": "/dev/fuse"}]}, Forbidden,
     ["namespace 'default'", DEV, "namespaces allows ml, team-*"]),
    ("ml", {"devices": [{"path": "/dev/fuse"}, {"path": "/dev/mem"}]}, Forbidden,
     [f"{DEV} [1]", "device /dev/mem is not allowed"]),
    ("ml", {"devices": [{"path": "/dev/fuse-alias"}]}, Forbidden,
     [f"{DEV} [0]", "/dev/fuse-alias leads to /dev/mem"]),
    ("ml", {"devices": [{"path": "/dev/fuse-gone"}]}, InvalidRequest,
     [f"{DEV} [0]", "/dev/fuse-gone does not exist"]),
    ("ml", {"devices": [{"path": "/dev/dri"}]}, InvalidRequest,
     [f"{DEV} [0]", "/dev/dri is not a character or block device"]),
    ("ml", {"devices": [{"path": "/dev/kvm", "permissions": "rwm"}]}, Forbidden,
     ["permissions 'rwm'", "at most 'rw'"]),
    ("ml", {"devices": [{"path": "/dev/nvidia0"}]}, Forbidden,
     ["device 0 of pool gpu", "pools.crihook.io/container.<name>"]),
    ("ml", {"devices": [{"path": "/dev/char/195:0"}]}, Forbidden, ["device 0 of pool gpu"]),
    ("ml", {"devices": [{"path": "/dev/gpu-copy"}]}, Forbidden,
     ["c 195:1", "device 1 of pool gpu"]),
    ("ml", {"devices": [{"path": "/dev/../dev/mem"}]}, InvalidRequest, ["not a normalized path"]),
    ("ml", {"devices": [{"path": "/dev/fuse", "major": 1, "minor": 1}]}, InvalidRequest,
     ["major, minor cannot be given", "reads them from the host"]),
    ("ml", {"devices": "[{"}, InvalidRequest, [DEV, "not JSON"]),
    ("ml", {"mounts": {"/etc": "/etc"}}, Forbidden,
     ['mounts.crihook.io/container.app ["/etc"]', "mounting /etc read-only is not allowed"]),
    ("ml", {"mounts": {"/srv/models/escape": "/x"}}, Forbidden,
     ["/srv/models/escape leads to /etc"]),
    ("ml", {"mounts": {"/srv/models/loop": "/x"}}, InvalidRequest, ["cannot be resolved"]),
    ("ml", {"mounts": [{"host_path": "/srv/models", "readonly": False}]}, Forbidden,
     ["mounting /srv/models read-write is not allowed", "writable_mounts allows /scratch/**"]),
    ("ml", {"env": [{"name": "PATH", "value": "/x"}]}, Forbidden,
     ["env.crihook.io/container.app [0]", "env PATH is not allowed"]),
    ("ml", {"env": [{"name": "GPU_VISIBLE_DEVICES", "value": "0,1,2,3"}]}, Forbidden,
     ["GPU_VISIBLE_DEVICES is set by pool gpu"]),
    ("ml", {"pools": {"tpu": 1}}, InvalidRequest, ["no pool 'tpu'", "pools: gpu"]),
    ("ml", {"pools": {"gpu": 5}}, InvalidRequest, ["5 device(s) of pool gpu asked; it has 4"]),
    ("ml", {"pools": {"gpu": -1}}, InvalidRequest, ['["gpu"]', "count -1"]),
    ("ml", {"pod_pools": {"gpu": 1}, "pools": {"tpu": 1}}, InvalidRequest,
     ["pools.crihook.io/container.app: this node has no pool 'tpu'"]),
    ("ml", {"pools": {"gpu": 1}, "devices": [{"path": "/dev/mem"}]}, Forbidden, ["/dev/mem"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("namespace", "annotations", "error", "fragments"),
    REFUSALS,
    ids=[
        "namespace", "not-allowlisted", "symlink-escapes", "missing", "directory",
        "permissions", "pooled-by-path", "pooled-by-symlink", "pooled-by-other-node",
        "dotdot", "type-from-annotation", "bad-json", "mount-not-allowed", "mount-escapes",
        "mount-loop", "mount-rw", "env-not-allowed", "env-of-pool", "unknown-pool",
        "pool-too-big", "pool-negative", "pool-own-unknown", "pool-and-forbidden-device",
    ],
)  # fmt: skip
async def test_refusals_name_the_annotation_and_leave_nothing_reserved(
    namespace: str, annotations: dict[str, Any], error: type[Reject], fragments: list[str]
) -> None:
    node = await start()
    p = await pod(node, "p1", namespace, **annotations)
    with pytest.raises(Reject) as info:
        await node.begin_create(p, burstable("app"))
    assert type(info.value) is error
    for fragment in fragments:
        assert fragment in info.value.reason
    assert held(node) == {}


async def test_a_typo_in_a_key_is_refused_not_ignored() -> None:
    node = await start()
    spec = PodSpec(
        "p1",
        namespace="ml",
        containers=[burstable("app")],
        annotations={"devices.crihook.io/containers.app": "[]"},
    )
    p = await node.run_pod(spec, "p1")
    with pytest.raises(InvalidRequest, match=r"devices\.crihook\.io/containers\.app: unknown key"):
        await node.begin_create(p, burstable("app"))


async def test_the_default_policy_allows_nothing() -> None:
    node = await start(options={})
    for asked in (
        {"devices": [{"path": "/dev/fuse"}]},
        {"mounts": {"/srv/models": "/m"}},
        {"env": [{"name": "MODEL_A", "value": "x"}]},
    ):
        p = await pod(node, "p1", "ml", **asked)
        with pytest.raises(Forbidden, match="namespaces allows nothing"):
            await node.begin_create(p, burstable("app"))
    node = await start(options={"namespaces": ["*"]})
    p = await pod(node, "p2", "ml", devices=[{"path": "/dev/fuse"}])
    with pytest.raises(Forbidden, match="devices allows nothing"):
        await node.begin_create(p, burstable("app"))
    p = await pod(node, "p3", "ml", pools={"gpu": 1})
    with pytest.raises(InvalidRequest, match=r"no pool 'gpu' \(pools: none\)"):
        await node.begin_create(p, burstable("app"))


# --- pools -------------------------------------------------------------------------------------


async def gpu_pod(node: Node, sandbox: str, count: int, name: str = "app") -> PodView:
    spec = PodSpec(
        sandbox,
        namespace="ml",
        containers=[burstable(name)],
        annotations={f"pools.crihook.io/container.{name}": json.dumps({"gpu": count})},
    )
    return await node.run_pod(spec, sandbox)


def gpus(created: Created) -> str:
    return env_of(created)["GPU_VISIBLE_DEVICES"]


async def test_pooled_devices_are_exclusive_and_go_back_on_removal() -> None:
    node = await start()
    first = await node.create(await gpu_pod(node, "p1", 2), burstable("app"), "c1")
    assert gpus(first) == "0,1"  # one NUMA node: 0 has two
    assert devices_of(first) == [("/dev/nvidia0", "/dev/nvidia0", "rw"),
                                 ("/dev/nvidia1", "/dev/nvidia1", "rw")]  # fmt: skip
    second = await node.create(await gpu_pod(node, "p2", 1), burstable("app"), "c2")
    assert gpus(second) == "2"
    p3 = await gpu_pod(node, "p3", 2)
    with pytest.raises(Reject) as info:
        await node.begin_create(p3, burstable("app"))
    assert type(info.value) is Reject  # the pool is exhausted: FAILED_PRECONDITION
    assert "pool gpu cannot give 2 device(s): 3 of 4 are held" in info.value.reason
    await node.remove("c1")
    third = await node.create(p3, burstable("app"), "c3")
    assert gpus(third) == "0,1"
    assert sorted(v["containers"][0] for v in held(node).values()) == ["c2", "c3"]


async def test_a_pod_wide_pool_count_is_each_containers_unless_its_own_says_otherwise() -> None:
    node = await start()
    spec = PodSpec(
        "p1",
        namespace="ml",
        containers=[burstable("a"), burstable("b"), burstable("c")],
        annotations={
            "pools.crihook.io/pod": '{"gpu": 1}',
            "pools.crihook.io/container.b": '{"gpu": 2}',
            "pools.crihook.io/container.c": '{"gpu": 0}',
        },
    )
    p = await node.run_pod(spec, "p1")
    assert gpus(await node.create(p, burstable("a"), "ca")) == "0"
    assert gpus(await node.create(p, burstable("b"), "cb")) == "2,3"
    assert "GPU_VISIBLE_DEVICES" not in env_of(await node.create(p, burstable("c"), "cc"))
    assert sorted(held(node)) == ["a:p1/a", "a:p1/b"]


async def test_a_restarted_container_keeps_its_devices() -> None:
    node = await start()
    p1 = await gpu_pod(node, "p1", 1)
    first = await node.create(p1, burstable("app"), "c1")
    await node.create(await gpu_pod(node, "p2", 1), burstable("app"), "c2")
    await node.stop("c1")
    again = await node.create(p1, burstable("app"), "c1b", attempt=1)
    assert gpus(again) == gpus(first) == "0"
    await node.remove("c1")  # kubelet removes the old attempt: the new one keeps them
    assert held(node)["a:p1/app"]["containers"] == ["c1b"]
    await node.remove("c1b")
    assert "a:p1/app" not in held(node)


async def test_a_failed_create_gives_its_reservation_back() -> None:
    node = await start()
    p1 = await gpu_pod(node, "p1", 4)
    created = await node.begin_create(p1, burstable("app"))
    book = node.hook.book  # type: ignore[attr-defined]
    # Reserved in the hook's state (which crihook writes ahead, before the runtime acts),
    # and carried by the container too.
    assert book.available("gpu") == frozenset()
    assert held(node) == {
        "a:p1/app": {
            "pod": "p1",
            "name": "app",
            "devices": {"gpu": ["0", "1", "2", "3"]},
            "containers": [],
            "pending": True,
        }
    }
    assert config_of(created).annotations["pools.crihook.io/assigned"] == (
        '{"gpu":["0","1","2","3"]}'
    )
    await node.fail_create(p1, created)
    assert book.available("gpu") == {"0", "1", "2", "3"} and held(node) == {}


async def test_the_pods_removal_gives_everything_back() -> None:
    node = await start()
    p1 = await gpu_pod(node, "p1", 3)
    await node.create(p1, burstable("app"), "c1")
    await node.remove_pod("p1")
    assert held(node) == {}


async def test_hints_and_the_pick_follow_the_chosen_numa_node() -> None:
    node = await start()
    p1 = await gpu_pod(node, "p1", 2)
    created = await node.begin_create(
        p1, burstable("app"), affinity=TopologyHint(frozenset({1}), True)
    )
    assert created.hints == {
        "devices/gpu": [
            TopologyHint(frozenset({0}), True),
            TopologyHint(frozenset({1}), True),
            TopologyHint(frozenset({0, 1}), False),
        ]
    }
    await node.finish_create(p1, created, "c1")
    assert gpus(created) == "2,3"
    # Now node 1 is full: two more fit only on node 0, three on no single node.
    p2 = await gpu_pod(node, "p2", 2)
    assert (await node.begin_create(p2, burstable("app"))).hints == {
        "devices/gpu": [TopologyHint(frozenset({0}), True), TopologyHint(frozenset({0, 1}), False)]
    }


async def test_a_pooled_device_missing_on_the_host_is_passed_over() -> None:
    files = host()
    node = await start(files)
    del files.nodes["/dev/nvidia0"]
    created = await node.create(await gpu_pod(node, "p1", 1), burstable("app"), "c1")
    assert gpus(created) == "1"
    del files.nodes["/dev/nvidia1"], files.nodes["/dev/nvidia2"]
    p2 = await gpu_pod(node, "p2", 2)
    with pytest.raises(Reject) as info:
        await node.begin_create(p2, burstable("app"))
    assert info.value.reason.endswith(
        "pool gpu cannot give 2 device(s): 1 of 4 are held by other containers, "
        "2 missing on the host (2, 0)"
    )
    assert list(held(node)) == ["a:p1/app"]


async def test_holdings_survive_a_restart_and_are_checked_against_the_runtime() -> None:
    node = await start()
    p1 = await gpu_pod(node, "p1", 1)
    await node.create(p1, burstable("app"), "c1")
    p2 = await gpu_pod(node, "p2", 1)
    await node.create(p2, burstable("app"), "c2")
    p3 = await gpu_pod(node, "p3", 1)
    pending = await node.begin_create(p3, burstable("app"))  # crihook stops here
    p4 = await gpu_pod(node, "p4", 1)
    await node.begin_create(p4, burstable("app"))  # and this one the runtime never made
    # A new crihook: the same state; the runtime removed c2 meanwhile, and did create p3's
    # (with what crihook sent it: the annotation that says which device it was given).
    restarted = Node(DevicesHook(POLICY, files=host()), TOPO, state=node.state)
    restarted.pods = dict(node.pods)
    restarted.specs = dict(node.specs)
    made = container_view_from_config("c3", p3, pending.request.config)
    restarted.containers = {"c1": node.containers["c1"], "c3": made}
    restarted.states = {"c1": ContainerState.RUNNING, "c3": ContainerState.CREATED}
    await restarted.sync()
    assert held(restarted) == {
        "a:p1/app": {"pod": "p1", "name": "app", "devices": {"gpu": ["0"]}, "containers": ["c1"]},
        "a:p3/app": {"pod": "p3", "name": "app", "devices": {"gpu": ["2"]}, "containers": ["c3"]},
    }
    p5 = await gpu_pod(restarted, "p5", 2)
    assert gpus(await restarted.create(p5, burstable("app"), "c5")) == "1,3"


async def test_a_saved_holding_the_configuration_no_longer_has_is_dropped() -> None:
    node = await start()
    await node.create(await gpu_pod(node, "p1", 2), burstable("app"), "c1")
    smaller = {**POLICY, "pools": {"gpu": {"devices": [{"id": "1", "path": "/dev/nvidia1"}]}}}
    restarted = Node(DevicesHook(smaller, files=host()), TOPO, state=node.state)
    restarted.pods, restarted.specs = dict(node.pods), dict(node.specs)
    restarted.containers, restarted.states = dict(node.containers), dict(node.states)
    await restarted.sync()
    assert held(restarted)["a:p1/app"]["devices"] == {"gpu": ["1"]}


async def test_a_container_id_the_runtime_reuses_is_a_new_container() -> None:
    node = await start()
    await node.create(await gpu_pod(node, "p1", 2), burstable("app"), "same")
    # A runtime that answers "same" again for p2's container (the bench's fake runtime
    # does): p1's container is gone, and so is its holding.
    await node.create(await gpu_pod(node, "p2", 2), burstable("app"), "same")
    assert list(held(node)) == ["a:p2/app"]
    assert node.hook.book.available("gpu") == {"0", "1"}  # type: ignore[attr-defined]


async def test_a_container_carrying_a_device_another_holds_is_not_adopted() -> None:
    node = await start()
    p1 = await gpu_pod(node, "p1", 1)
    await node.create(p1, burstable("app"), "c1")  # holds gpu 0
    p2 = await gpu_pod(node, "p2", 1)
    config = node.create_request(p2, burstable("app"))[1].config
    config.annotations["pools.crihook.io/assigned"] = '{"gpu":["0","2"]}'
    node.containers["c2"] = container_view_from_config("c2", p2, config)
    await node.sync("reconcile")
    book = node.hook.book  # type: ignore[attr-defined]
    assert book.of("p2", "app").devices == {"gpu": ("2",)}  # what is free of it
    assert book.of("p1", "app").devices == {"gpu": ("0",)}


async def test_a_reservation_written_ahead_is_confirmed_or_released_after_a_restart() -> None:
    """crihook stops between the pre stage and the runtime's answer: the reservation is in
    its state, and the next crihook settles it from what the runtime has, without needing
    the container's annotation."""
    node = await start()
    p1 = await gpu_pod(node, "p1", 2)
    made = await node.begin_create(p1, burstable("app"))  # the runtime makes this one
    p2 = await gpu_pod(node, "p2", 2)
    await node.begin_create(p2, burstable("app"))  # and never this one
    assert {k: v.get("pending") for k, v in held(node).items()} == {
        "a:p1/app": True,
        "a:p2/app": True,
    }

    restarted = Node(DevicesHook(POLICY, files=host()), TOPO, state=node.state)
    restarted.pods, restarted.specs = dict(node.pods), dict(node.specs)
    config = made.request.config
    del config.annotations["pools.crihook.io/assigned"]  # not what the restart relies on
    restarted.containers = {"c1": container_view_from_config("c1", p1, config)}
    restarted.states = {"c1": ContainerState.CREATED}
    await restarted.sync()

    assert held(restarted) == {
        "a:p1/app": {
            "pod": "p1",
            "name": "app",
            "devices": {"gpu": ["0", "1"]},
            "containers": ["c1"],
        }
    }
    assert restarted.hook.book.available("gpu") == {"2", "3"}  # type: ignore[attr-defined]
    p3 = await gpu_pod(restarted, "p3", 2)
    assert gpus(await restarted.create(p3, burstable("app"), "c3")) == "2,3"


# --- init containers' devices ----------------------------------------------------------------

INIT = "crihook.io/init-containers"


async def init_pod(
    node: Node, sandbox: str, init: int, app: int, *, annotated: bool = True, side: int = 0
) -> PodView:
    """A pod whose init container `init` and app container `app` (and `side`) ask for gpus;
    `annotated`: kubelet's pod says which containers are init containers."""
    annotations = {
        "pools.crihook.io/container.init": json.dumps({"gpu": init}),
        "pools.crihook.io/container.app": json.dumps({"gpu": app}),
        "pools.crihook.io/container.side": json.dumps({"gpu": side}),
    }
    if annotated:
        annotations[INIT] = "init"
    containers = [burstable("app"), burstable("side")]
    spec = PodSpec(sandbox, namespace="ml", containers=containers, annotations=annotations)
    spec.init_containers = [burstable("init")]
    return await node.run_pod(spec, sandbox)


async def run_init(node: Node, p: PodView, cid: str) -> Created:
    created = await node.create(p, burstable("init"), cid)
    node.set_state(cid, ContainerState.EXITED)  # it ran to completion
    return created


async def test_an_app_container_reuses_its_init_containers_devices() -> None:
    node = await start()
    p1 = await init_pod(node, "p1", init=2, app=3, side=1)
    init = await run_init(node, p1, "i1")
    assert gpus(init) == "0,1"
    other = await node.create(await gpu_pod(node, "p2", 1), burstable("app"), "o1")
    assert gpus(other) == "2"

    app = await node.create(p1, burstable("app"), "a1")

    # The init container's two first, then one free: 3 of a 4-device pool, with another pod
    # holding one, fits only because the init container's are reused.
    assert gpus(app) == "0,1,3"
    assert node.runtime.asked == []  # kinds known: no runtime question
    # The sidecar gets none of them again: the app container holds them now.
    p3 = await gpu_pod(node, "p3", 1)
    with pytest.raises(Reject, match="pool gpu cannot give 1 device"):
        await node.begin_create(p1, burstable("side"))
    # The init container removed: the app container keeps them; then the pod's go back.
    await node.remove("i1")
    assert node.hook.book.available("gpu") == frozenset()  # type: ignore[attr-defined]
    await node.remove("a1")
    assert gpus(await node.create(p3, burstable("app"), "c3")) == "0"


async def test_an_unannotated_pods_earlier_container_is_reused_once_it_exited() -> None:
    node = await start()
    p1 = await init_pod(node, "p1", init=2, app=2, annotated=False)
    first = await node.create(p1, burstable("init"), "i1")  # kind unknown to crihook
    assert gpus(first) == "0,1"
    # Still running (a sidecar, or an app container): not reusable, the app gets new ones.
    running = await node.begin_create(p1, burstable("app"))
    assert gpus(running) == "2,3"
    await node.fail_create(p1, running)
    assert node.runtime.asked == ["p1"]
    # Exited (an init container, as CRI shows it): reused.
    node.set_state("i1", ContainerState.EXITED)
    assert gpus(await node.create(p1, burstable("app"), "a1")) == "0,1"
    assert node.hook.book.available("gpu") == {"2", "3"}  # type: ignore[attr-defined]


async def test_hints_for_a_reusing_container_hold_the_init_containers_devices() -> None:
    node = await start()
    p1 = await init_pod(node, "p1", init=1, app=2)
    await run_init(
        node,
        p1,
        "i1",
    )
    await node.create(await gpu_pod(node, "p2", 1), burstable("app"), "o1")  # holds gpu 1
    created = await node.begin_create(p1, burstable("app"))
    # gpu 0 (NUMA 0) is reused: every hint holds node 0; node 0 alone has no second device.
    assert created.hints == {"devices/gpu": [TopologyHint(frozenset({0, 1}), False)]}
    assert gpus(created) == "0,2"


async def test_shared_holdings_of_one_pod_survive_a_restart() -> None:
    node = await start()
    p1 = await init_pod(node, "p1", init=2, app=2)
    await run_init(node, p1, "i1")
    await node.create(p1, burstable("app"), "a1")
    assert held(node)["a:p1/init"]["kind"] == "init"

    restarted = Node(DevicesHook(POLICY, files=host()), TOPO, state=node.state)
    restarted.pods, restarted.specs = dict(node.pods), dict(node.specs)
    restarted.containers, restarted.states = dict(node.containers), dict(node.states)
    await restarted.sync()

    book = restarted.hook.book  # type: ignore[attr-defined]
    assert book.of("p1", "init").devices == book.of("p1", "app").devices == {"gpu": ("0", "1")}
    assert book.available("gpu") == {"2", "3"}
