"""kubelet's pod -> CRI encoding rules (tests/lab/kubelet_encoding.py), as tables."""

from __future__ import annotations

import pytest

from crihook.api.cri.v1 import api_pb2
from tests.lab.kubelet_encoding import (
    ContainerSpec,
    Device,
    Mount,
    PodSpec,
    QOSClass,
    cgroup_parent,
    container_config,
    linux_resources,
    milli_cpu_to_quota,
    milli_cpu_to_shares,
    oom_score_adj,
    qos_class,
    sandbox_config,
    sandbox_resources,
)

MiB = 1 << 20
GiB = 1 << 30
NODE = 16 * GiB
UID = "0b0b0b0b-1111-2222-3333-444444444444"


def pod(*containers: ContainerSpec, init: tuple[ContainerSpec, ...] = (), **kw: object) -> PodSpec:
    return PodSpec(
        name="web",
        uid=UID,
        containers=list(containers),
        init_containers=list(init),
        **kw,  # type: ignore[arg-type]
    )


def c(name: str = "app", /, **kw: object) -> ContainerSpec:
    return ContainerSpec(name=name, **kw)  # type: ignore[arg-type]


GUARANTEED = dict(cpu_limit=500, memory_limit=64 * MiB)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (pod(c()), QOSClass.BEST_EFFORT),
        (pod(c(), c("b")), QOSClass.BEST_EFFORT),
        (pod(c(cpu_request=100)), QOSClass.BURSTABLE),
        (pod(c(memory_request=MiB)), QOSClass.BURSTABLE),
        (pod(c(**GUARANTEED)), QOSClass.GUARANTEED),
        (pod(c(cpu_request=500, memory_request=64 * MiB, **GUARANTEED)), QOSClass.GUARANTEED),
        (pod(c(cpu_request=250, **GUARANTEED)), QOSClass.BURSTABLE),
        (pod(c(cpu_limit=500)), QOSClass.BURSTABLE),
        (pod(c(**GUARANTEED), c("b")), QOSClass.BURSTABLE),
        (pod(c(**GUARANTEED), c("b", **GUARANTEED)), QOSClass.GUARANTEED),
        (pod(c(**GUARANTEED), init=(c("init"),)), QOSClass.BURSTABLE),
        (pod(c(**GUARANTEED), init=(c("init", **GUARANTEED),)), QOSClass.GUARANTEED),
        (pod(c(), init=(c("init", cpu_request=10),)), QOSClass.BURSTABLE),
        (pod(c(cpu_request=0, memory_request=0)), QOSClass.BEST_EFFORT),
        (pod(c(cpu_limit=0, memory_limit=0)), QOSClass.BEST_EFFORT),
    ],
    ids=[
        "no-resources",
        "two-empty",
        "cpu-request-only",
        "memory-request-only",
        "limits-only-default-requests",
        "requests-equal-limits",
        "cpu-request-below-limit",
        "cpu-limit-only",
        "one-of-two-limited",
        "both-limited",
        "init-unlimited",
        "init-limited",
        "init-request-only",
        "zero-requests-ignored",
        "zero-limits-ignored",
    ],
)
def test_qos_class(spec: PodSpec, expected: QOSClass) -> None:
    assert qos_class(spec) is expected


@pytest.mark.parametrize(
    ("spec", "root", "expected"),
    [
        (pod(c(**GUARANTEED)), "/kubepods", f"/kubepods/pod{UID}"),
        (pod(c(cpu_request=1)), "/kubepods", f"/kubepods/burstable/pod{UID}"),
        (pod(c()), "/kubepods", f"/kubepods/besteffort/pod{UID}"),
        (pod(c()), "kubepods/", f"/kubepods/besteffort/pod{UID}"),
        (pod(c(cpu_request=1)), "/lab/k8s", f"/lab/k8s/burstable/pod{UID}"),
        (pod(c(**GUARANTEED)), "/", f"/pod{UID}"),
    ],
    ids=["guaranteed", "burstable", "besteffort", "root-normalised", "custom-root", "bare-root"],
)
def test_cgroup_parent(spec: PodSpec, root: str, expected: str) -> None:
    assert cgroup_parent(spec, root) == expected


@pytest.mark.parametrize(
    ("milli", "shares"),
    [
        (0, 2),
        (1, 2),
        (2, 2),
        (3, 3),
        (250, 256),
        (1000, 1024),
        (1500, 1536),
        (256_000, 262_144),
        (10**7, 262_144),
    ],
    ids=["zero", "one", "two", "three", "quarter", "one-cpu", "one-and-half", "max", "above-max"],
)
def test_milli_cpu_to_shares(milli: int, shares: int) -> None:
    assert milli_cpu_to_shares(milli) == shares


@pytest.mark.parametrize(
    ("milli", "quota"),
    [(0, 0), (1, 1000), (10, 1000), (11, 1100), (500, 50_000), (2500, 250_000)],
    ids=["no-limit", "min-1", "min-10", "just-above-min", "half", "two-and-half"],
)
def test_milli_cpu_to_quota(milli: int, quota: int) -> None:
    assert milli_cpu_to_quota(milli) == quota


@pytest.mark.parametrize(
    ("qos", "memory_request", "expected"),
    [
        (QOSClass.GUARANTEED, 64 * MiB, -997),
        (QOSClass.BEST_EFFORT, None, 1000),
        (QOSClass.BURSTABLE, None, 999),  # 1000 would equal BestEffort
        (QOSClass.BURSTABLE, 1, 999),
        (QOSClass.BURSTABLE, 64 * MiB, 997),  # 1000 - 3.9 truncated
        (QOSClass.BURSTABLE, NODE // 10, 901),  # 99.99% of 100 truncates to 99
        (QOSClass.BURSTABLE, (NODE + 9) // 10, 900),
        (QOSClass.BURSTABLE, NODE // 2, 500),
        (QOSClass.BURSTABLE, (NODE * 997 + 999) // 1000, 3),
        (QOSClass.BURSTABLE, (NODE * 998 + 999) // 1000, 3),  # 2 is below the floor
        (QOSClass.BURSTABLE, NODE, 3),
        (QOSClass.BURSTABLE, 2 * NODE, 3),
    ],
    ids=[
        "guaranteed",
        "besteffort",
        "burstable-no-request",
        "burstable-1-byte",
        "burstable-64Mi",
        "burstable-just-under-10pct",
        "burstable-10pct",
        "burstable-half",
        "burstable-at-floor",
        "burstable-below-floor",
        "burstable-whole-node",
        "burstable-over-node",
    ],
)
def test_oom_score_adj(qos: QOSClass, memory_request: int | None, expected: int) -> None:
    assert oom_score_adj(qos, memory_request, NODE) == expected


def _res(**kw: int) -> api_pb2.LinuxContainerResources:
    return api_pb2.LinuxContainerResources(cpu_period=100_000, **kw)


@pytest.mark.parametrize(
    ("container", "qos", "expected"),
    [
        (c(), QOSClass.BEST_EFFORT, _res(cpu_shares=2, oom_score_adj=1000)),
        (
            c(cpu_request=250, cpu_limit=500, memory_request=64 * MiB, memory_limit=64 * MiB),
            QOSClass.BURSTABLE,
            _res(
                cpu_shares=256,
                cpu_quota=50_000,
                memory_limit_in_bytes=64 * MiB,
                memory_swap_limit_in_bytes=64 * MiB,
                oom_score_adj=997,
            ),
        ),
        (
            c(cpu_limit=2000, memory_limit=GiB),
            QOSClass.GUARANTEED,
            _res(
                cpu_shares=2048,
                cpu_quota=200_000,
                memory_limit_in_bytes=GiB,
                memory_swap_limit_in_bytes=GiB,
                oom_score_adj=-997,
            ),
        ),
        (c(cpu_request=100), QOSClass.BURSTABLE, _res(cpu_shares=102, oom_score_adj=999)),
        (
            c(cpu_request=0, cpu_limit=300),
            QOSClass.BURSTABLE,
            _res(cpu_shares=2, cpu_quota=30_000, oom_score_adj=999),
        ),
        (c(memory_request=NODE // 4), QOSClass.BURSTABLE, _res(cpu_shares=2, oom_score_adj=750)),
    ],
    ids=[
        "besteffort",
        "burstable-250m-500m-64Mi",
        "guaranteed-limits-only",
        "cpu-request-only",
        "explicit-zero-request",
        "memory-quarter-node",
    ],
)
def test_linux_resources(
    container: ContainerSpec, qos: QOSClass, expected: api_pb2.LinuxContainerResources
) -> None:
    assert linux_resources(container, qos, NODE) == expected


def test_linux_resources_without_no_swap_leaves_swap_unset() -> None:
    res = linux_resources(c(memory_limit=MiB), QOSClass.BURSTABLE, NODE, no_swap=False)
    assert res.memory_swap_limit_in_bytes == 0


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (pod(c()), _res(cpu_shares=2)),
        (
            pod(c(cpu_request=100, memory_limit=MiB), c("b", cpu_request=200, cpu_limit=400)),
            _res(cpu_shares=307, cpu_quota=40_000, memory_limit_in_bytes=MiB),
        ),
        (
            pod(c(cpu_request=100), init=(c("init", cpu_request=500, memory_limit=8 * MiB),)),
            _res(cpu_shares=512, memory_limit_in_bytes=8 * MiB),
        ),
        (pod(c(cpu_limit=700)), _res(cpu_shares=716, cpu_quota=70_000)),
    ],
    ids=["besteffort", "sum-of-containers", "init-container-max", "limit-defaults-request"],
)
def test_sandbox_resources(spec: PodSpec, expected: api_pb2.LinuxContainerResources) -> None:
    assert sandbox_resources(spec) == expected


@pytest.mark.parametrize(
    ("host_network", "network", "hostname"),
    [(True, api_pb2.NODE, ""), (False, api_pb2.POD, "web")],
    ids=["host-network", "pod-network"],
)
def test_sandbox_config(host_network: bool, network: int, hostname: str) -> None:
    spec = pod(
        c(cpu_request=1),
        labels={"app": "web"},
        annotations={"a": "b"},
        namespace="prod",
        host_network=host_network,
    )
    config = sandbox_config(spec, log_root="/var/log/pods")
    assert config.metadata == api_pb2.PodSandboxMetadata(
        name="web", uid=UID, namespace="prod", attempt=0
    )
    assert config.hostname == hostname
    assert config.log_directory == f"/var/log/pods/prod_web_{UID}"
    assert dict(config.labels) == {
        "app": "web",
        "io.kubernetes.pod.name": "web",
        "io.kubernetes.pod.namespace": "prod",
        "io.kubernetes.pod.uid": UID,
    }
    assert dict(config.annotations) == {"a": "b"}
    assert config.linux.cgroup_parent == f"/kubepods/burstable/pod{UID}"
    ns = config.linux.security_context.namespace_options
    assert (ns.network, ns.pid, ns.ipc) == (network, api_pb2.CONTAINER, api_pb2.POD)
    assert config.linux.security_context.HasField("seccomp")
    assert config.linux.HasField("overhead")
    assert config.linux.resources == sandbox_resources(spec)


def test_sandbox_config_without_log_root_has_no_log_directory() -> None:
    assert sandbox_config(pod(c())).log_directory == ""


def test_container_config() -> None:
    app = c(
        command=["sh", "-c"],
        args=["sleep 1"],
        env=[("A", "1"), ("RAW", b"\xff\x00")],
        cpu_request=250,
        cpu_limit=500,
        memory_request=64 * MiB,
        memory_limit=64 * MiB,
        mounts=[Mount("/host/data", "/data", readonly=True)],
        devices=[Device("/dev/null", "/dev/mynull")],
        labels={"extra": "l"},
        annotations={"extra": "a"},
    )
    spec = pod(app, namespace="prod")
    config = container_config(spec, app, node_memory=NODE, image_ref="sha256:abc")

    assert config.metadata == api_pb2.ContainerMetadata(name="app", attempt=0)
    assert config.image == api_pb2.ImageSpec(
        image="sha256:abc", user_specified_image="localhost/crihook/busybox:1.35"
    )
    assert (list(config.command), list(config.args)) == (["sh", "-c"], ["sleep 1"])
    assert [(kv.key, kv.value) for kv in config.envs] == [("A", b"1"), ("RAW", b"\xff\x00")]
    assert list(config.mounts) == [
        api_pb2.Mount(container_path="/data", host_path="/host/data", readonly=True)
    ]
    assert list(config.devices) == [
        api_pb2.Device(container_path="/dev/mynull", host_path="/dev/null", permissions="rwm")
    ]
    assert dict(config.labels) == {
        "extra": "l",
        "io.kubernetes.container.name": "app",
        "io.kubernetes.pod.name": "web",
        "io.kubernetes.pod.namespace": "prod",
        "io.kubernetes.pod.uid": UID,
    }
    annotations = dict(config.annotations)
    assert annotations.pop("io.kubernetes.container.hash")
    assert annotations == {
        "extra": "a",
        "io.kubernetes.container.restartCount": "0",
        "io.kubernetes.container.terminationMessagePath": "/dev/termination-log",
        "io.kubernetes.container.terminationMessagePolicy": "File",
        "io.kubernetes.pod.terminationGracePeriod": "30",
    }
    assert config.log_path == "app/0.log"
    assert config.linux.resources == linux_resources(app, QOSClass.BURSTABLE, NODE)
    sc = config.linux.security_context
    assert sc.namespace_options.network == api_pb2.NODE
    assert sc.run_as_user.value == 0 and sc.HasField("run_as_user")
    assert sc.seccomp.profile_type == api_pb2.SecurityProfile.Unconfined
    assert "/proc/kcore" in sc.masked_paths and "/proc/sys" in sc.readonly_paths


def test_container_config_is_deterministic_for_a_given_spec() -> None:
    spec = pod(c())
    first = container_config(spec, spec.containers[0], node_memory=NODE)
    again = container_config(spec, spec.containers[0], node_memory=NODE)
    assert first.SerializeToString(deterministic=True) == again.SerializeToString(
        deterministic=True
    )
    assert first.image.image == "localhost/crihook/busybox:1.35"


def test_container_hash_changes_with_the_spec() -> None:
    spec = pod(c(), c("b", command=["true"]))
    hashes = {
        container_config(spec, x, node_memory=NODE).annotations["io.kubernetes.container.hash"]
        for x in spec.containers
    }
    assert len(hashes) == 2
