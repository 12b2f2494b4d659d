"""CRI-O's verbose status, read back into CRI configs (what reconcile learns at start).

The samples follow what CRI-O 1.34 answers in the lab (tests/integration checks the real
thing): the OCI spec under info["info"]["runtimeSpec"], CRI's config in its annotations.
"""

from __future__ import annotations

import json

import pytest

from crihook.api.cri.v1 import api_pb2
from crihook.proxy.state.runtime_status import (
    container_config_from_crio,
    crio_config,
    sandbox_config_from_crio,
)

UID = "10c6a3fd-6261-4c40-8fe1-683cb5eb4e1a"
PARENT = f"/kubepods/burstable/pod{UID}"


def _info(spec: dict[str, object], **extra: object) -> dict[str, str]:
    return {"info": json.dumps({"runtimeSpec": spec, **extra})}


SANDBOX = _info(
    {
        "annotations": {
            "io.kubernetes.cri-o.Metadata": json.dumps(
                {"name": "probe", "uid": UID, "namespace": "default", "attempt": 1}
            ),
            "io.kubernetes.cri-o.Labels": json.dumps({"app": "demo"}),
            "io.kubernetes.cri-o.Annotations": json.dumps({"note": "kept"}),
            "io.kubernetes.cri-o.CgroupParent": PARENT,
            "io.kubernetes.cri-o.PodLinuxResources": json.dumps(
                {"cpu_period": 100000, "cpu_quota": 50000, "cpu_shares": 256}
            ),
        },
        "linux": {"cgroupsPath": f"{PARENT}/crio-{'a' * 64}"},
    }
)

CONTAINER = _info(
    {
        "annotations": {
            "io.kubernetes.cri-o.Metadata": json.dumps({"name": "app"}),
            "io.kubernetes.cri-o.Labels": json.dumps({"io.kubernetes.container.name": "app"}),
            "io.kubernetes.cri-o.Annotations": json.dumps(
                {"io.kubernetes.container.restartCount": "0"}
            ),
            "io.kubernetes.cri-o.ImageName": "localhost/crihook/busybox:1.35",
        },
        "process": {"oomScoreAdj": -997},
        "linux": {
            "resources": {
                "cpu": {"shares": 1024, "quota": 100000, "period": 100000, "cpus": "2-3"},
                "memory": {"limit": 67108864},
            }
        },
    },
    sandboxID="b" * 64,
    pid=42,
)


def test_sandbox_config_from_crio() -> None:
    config = sandbox_config_from_crio(SANDBOX)
    assert config is not None
    assert (config.metadata.name, config.metadata.uid, config.metadata.attempt) == (
        "probe",
        UID,
        1,
    )
    assert dict(config.labels) == {"app": "demo"}
    assert dict(config.annotations) == {"note": "kept"}
    assert config.linux.cgroup_parent == PARENT
    assert (config.linux.resources.cpu_shares, config.linux.resources.cpu_quota) == (256, 50000)


def test_container_config_from_crio() -> None:
    config = container_config_from_crio(CONTAINER)
    assert config is not None
    assert config.metadata.name == "app"
    assert config.image.image == "localhost/crihook/busybox:1.35"
    assert dict(config.annotations) == {"io.kubernetes.container.restartCount": "0"}
    r = config.linux.resources
    assert (r.cpu_shares, r.cpu_quota, r.cpu_period) == (1024, 100000, 100000)
    assert (r.memory_limit_in_bytes, r.oom_score_adj, r.cpuset_cpus) == (67108864, -997, "2-3")


# containerd's verbose info has a runtimeSpec without CRI-O's annotations (and its own
# "config", which store reads first); neither is CRI-O's.
NOT_CRIO = [
    {},
    {"info": "not json"},
    {"info": json.dumps({"config": {}, "runtimeSpec": {"annotations": {"a": "b"}}})},
    _info({"annotations": {"io.kubernetes.cri-o.Labels": "{}"}}),  # no Metadata
]


@pytest.mark.parametrize("info", NOT_CRIO, ids=["empty", "not-json", "containerd", "no-metadata"])
def test_info_that_is_not_crio_gives_none(info: dict[str, str]) -> None:
    assert sandbox_config_from_crio(info) is None
    assert container_config_from_crio(info) is None
    assert crio_config(info, api_pb2.ContainerConfig()) is None


def test_crio_config_fills_the_message_it_is_given() -> None:
    message = api_pb2.PodSandboxConfig()
    assert crio_config(SANDBOX, message) is message
    assert message.linux.cgroup_parent == PARENT


def test_a_malformed_resources_annotation_gives_none() -> None:
    doc = json.loads(SANDBOX["info"])
    doc["runtimeSpec"]["annotations"]["io.kubernetes.cri-o.PodLinuxResources"] = json.dumps(
        {"cpu_shares": "many"}
    )
    assert crio_config({"info": json.dumps(doc)}, api_pb2.PodSandboxConfig()) is None
