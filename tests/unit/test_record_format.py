"""The pure parts of recording: the readable rendering of CRI messages, redaction, the
effective configuration written back as a config document, and field-level differences."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.node import Topology, read_topology
from crihook.hooks.spec import Adjustment, Event, ResourceDelta, Stage
from crihook.hooks.spec.adjustment import REMOVE, Field, describe_key, parse_key
from crihook.proxy.config import (
    DEFAULT_REDACT_ANNOTATIONS,
    DEFAULT_REDACT_VALUES,
    Settings,
    apply_flags,
    load_config,
    settings_from_toml,
)
from crihook.proxy.config_doc import settings_doc
from crihook.proxy.cri.outcome import HookRun
from crihook.proxy.cri.values import from_jsonable
from crihook.proxy.record.lines import adjustment_of, hook_docs, message_doc
from crihook.proxy.record.redact import REDACTED, Redactor
from crihook.proxy.record.render import render
from crihook.proxy.replay.diff import ABSENT, Difference, field_diff
from tests.lab.kubelet_encoding import (
    ContainerSpec,
    PodSpec,
    burstable_pod,
    container_config,
    sandbox_config,
)
from tests.lab.sysfs import DUAL_SOCKET_SMT2_4NUMA, OFFLINE_CPUS, write_sysfs

REPO = Path(__file__).resolve().parents[2]


def _create_request() -> api_pb2.CreateContainerRequest:
    pod = burstable_pod("web")
    pod.annotations["example.com/db-password"] = "hunter2"
    pod.annotations["example.com/cert"] = "-----BEGIN PRIVATE KEY-----\nMII"
    pod.annotations["example.com/team"] = "payments"
    pod.annotations["example.com/session"] = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig"
    # What a hook reads must survive: its name is not a secret's, its value not a key's.
    pod.annotations["devices.crihook.io/pod"] = '[{"path": "/dev/secret-token"}]'
    container = pod.containers[0]
    container.env = [("TOKEN", "s3cr3t"), ("EMPTY", ""), ("BINARY", b"\xff\x00")]
    return api_pb2.CreateContainerRequest(
        pod_sandbox_id="sandbox-1",
        config=container_config(pod, container, image_ref="busybox", node_memory=1 << 34),
        sandbox_config=sandbox_config(pod, log_root="/var/log/pods"),
    )


MESSAGES: dict[str, Message] = {
    "create-container": _create_request(),
    "run-pod-sandbox": api_pb2.RunPodSandboxRequest(
        config=sandbox_config(PodSpec(name="p", containers=[ContainerSpec(name="c")]))
    ),
    "update-resources": api_pb2.UpdateContainerResourcesRequest(
        container_id="c1",
        linux=api_pb2.LinuxContainerResources(
            cpuset_cpus="1", hugepage_limits=[api_pb2.HugepageLimit(page_size="2MB", limit=4)]
        ),
        annotations={"a": "b"},
    ),
    "container-status": api_pb2.ContainerStatusResponse(
        status=api_pb2.ContainerStatus(id="c", state=api_pb2.CONTAINER_RUNNING),
        info={"info": '{"pid": 1}'},
    ),
    "empty": api_pb2.StartContainerResponse(),
}


@pytest.mark.parametrize("name", list(MESSAGES), ids=list(MESSAGES))
def test_render_is_protobufs_json_with_field_names_and_text_bytes(name: str) -> None:
    message = MESSAGES[name]
    # protobuf's JSON writes 64-bit integers as strings and bytes as base64; the rendering
    # keeps numbers and shows UTF-8 bytes as text. With those two read back, they agree.
    expected = _readable(json_format.MessageToDict(message, preserving_proto_field_name=True),
                         message.DESCRIPTOR)  # fmt: skip
    assert render(message) == expected


_INT64 = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64,
    FieldDescriptor.TYPE_SFIXED64,
}


def _readable(doc: dict[str, Any], descriptor: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in doc.items():
        field = descriptor.fields_by_name[name]
        entry = field.message_type
        if entry is not None and entry.GetOptions().map_entry:
            value_field = entry.fields_by_name["value"]
            out[name] = {k: _readable_value(value_field, v) for k, v in value.items()}
        elif field.is_repeated:
            out[name] = [_readable_value(field, v) for v in value]
        else:
            out[name] = _readable_value(field, value)
    return out


def _readable_value(field: Any, value: Any) -> Any:
    if field.message_type is not None:
        return _readable(value, field.message_type)
    if field.type == FieldDescriptor.TYPE_BYTES:
        raw = base64.b64decode(value)
        try:
            return raw.decode()
        except UnicodeDecodeError:
            return {"base64": value}
    if field.type in _INT64:
        return int(value)
    return value


def test_render_shows_undecodable_bytes_as_base64_and_enums_by_name() -> None:
    rendered = render(MESSAGES["create-container"])
    envs = {e["key"]: e.get("value") for e in rendered["config"]["envs"]}
    assert envs["TOKEN"] == "s3cr3t"
    assert envs["BINARY"] == {"base64": base64.b64encode(b"\xff\x00").decode()}
    assert render(MESSAGES["container-status"])["status"]["state"] == "CONTAINER_RUNNING"


REDACTOR = Redactor(DEFAULT_REDACT_ANNOTATIONS, DEFAULT_REDACT_VALUES)


def test_redaction_removes_env_values_and_secret_annotations_and_keeps_the_rest() -> None:
    message = api_pb2.CreateContainerRequest()
    message.CopyFrom(MESSAGES["create-container"])

    assert REDACTOR.message(message) is True

    envs = {e.key: e.value for e in message.config.envs}
    assert envs == {"TOKEN": REDACTED.encode(), "EMPTY": b"", "BINARY": REDACTED.encode()}
    pod_annotations = dict(message.sandbox_config.annotations)
    assert pod_annotations["example.com/db-password"] == REDACTED  # by its name
    assert pod_annotations["example.com/cert"] == REDACTED  # by its value (PEM)
    assert pod_annotations["example.com/session"] == REDACTED  # by its value (JWT)
    assert pod_annotations["example.com/team"] == "payments"
    assert pod_annotations["devices.crihook.io/pod"] == '[{"path": "/dev/secret-token"}]'
    assert b"hunter2" not in message.SerializeToString()
    assert b"s3cr3t" not in message.SerializeToString()


def test_redacting_a_request_where_its_secrets_are_is_the_full_walk() -> None:
    walked = api_pb2.CreateContainerRequest()
    walked.CopyFrom(MESSAGES["create-container"])
    targeted = api_pb2.CreateContainerRequest()
    targeted.CopyFrom(walked)

    assert REDACTOR.message(walked) is True
    assert REDACTOR.request(Event.CREATE_CONTAINER, targeted) is True
    assert targeted == walked
    assert REDACTOR.request(Event.CREATE_CONTAINER, targeted) is False  # nothing left


@pytest.mark.parametrize(
    ("message", "secret"),
    [
        (
            api_pb2.ContainerStatusResponse(info={"info": '{"config": {"envs": "pw"}}'}),
            b'"pw"',
        ),
        (api_pb2.ExecSyncResponse(stdout=b"password=pw", stderr=b"err"), b"password=pw"),
        (
            api_pb2.ListPodSandboxResponse(
                items=[api_pb2.PodSandbox(annotations={"x/api-key": "k3y"})]
            ),
            b"k3y",
        ),
    ],
    ids=["verbose-info", "exec-output", "listed-annotations"],
)
def test_redaction_reaches_pass_through_answers(message: Message, secret: bytes) -> None:
    assert secret in message.SerializeToString()
    assert REDACTOR.message(message) is True
    assert secret not in message.SerializeToString()


def test_secrets_kept_when_asked() -> None:
    message = api_pb2.CreateContainerRequest()
    message.CopyFrom(MESSAGES["create-container"])
    raw = message.SerializeToString()

    doc = message_doc(raw, api_pb2.CreateContainerRequest, Redactor((), (), enabled=False))

    assert base64.b64decode(doc["b64"]) == raw  # the exact bytes kubelet sent


def test_message_doc_keeps_the_exact_bytes_when_nothing_is_secret() -> None:
    raw = MESSAGES["update-resources"].SerializeToString()
    doc = message_doc(raw, api_pb2.UpdateContainerResourcesRequest, REDACTOR)
    assert base64.b64decode(doc["b64"]) == raw
    assert doc["json"]["linux"]["cpuset_cpus"] == "1"


def test_message_doc_of_bytes_that_do_not_decode() -> None:
    doc = message_doc(b"\xff\xff\xff", api_pb2.CreateContainerRequest, REDACTOR)
    assert doc["json"] is None
    assert "error" in doc


# --- the effective configuration as a document ------------------------------------------------


@pytest.mark.parametrize(
    "flags",
    [{}, {"hooks": "cpuset,numa,oom,devices"}, {"hooks": "none", "dry_run": True}],
    ids=["deploy-config", "built-in-hooks", "no-hooks-dry-run"],
)
def test_settings_doc_reads_back_as_the_same_settings(flags: dict[str, Any]) -> None:
    settings = apply_flags(load_config(REPO / "deploy" / "config.toml"), flags)
    settings = replace(settings, record=replace(settings.record, file=Path("/var/r.jsonl")))

    again = settings_from_toml(settings_doc(settings))

    assert again.chain.hooks == settings.chain.hooks
    assert replace(again, chain=settings.chain) == settings
    assert replace(again.chain, hook_tables=settings.chain.hook_tables) == settings.chain


def test_settings_doc_keeps_hook_options_and_non_default_settings() -> None:
    settings = settings_from_toml(
        {
            "hooks": {
                "order": ["cpuset", "10-mine"],
                "cpuset": {"reserved_cpus": "0", "policy_options": ["full-pcpus-only"]},
                "mine": {"module": "pkg.mod:Hook", "timeout_ms": 50, "allow": ["label"]},
            },
            "node": {"topology_policy": "best-effort"},
        }
    )
    doc = settings_doc(settings)
    assert doc["hooks"]["cpuset"] == {"reserved_cpus": "0", "policy_options": ["full-pcpus-only"]}
    assert doc["hooks"]["mine"] == {"module": "pkg.mod:Hook", "timeout_ms": 50, "allow": ["label"]}
    assert doc["node"]["topology_policy"] == "best-effort"
    assert settings_from_toml(doc).chain.hooks == settings.chain.hooks
    assert Settings().record.file is None


@pytest.mark.parametrize("spec", [DUAL_SOCKET_SMT2_4NUMA, OFFLINE_CPUS], ids=["80cpu", "offline"])
def test_topology_document_round_trip(tmp_path: Path, spec: Any) -> None:
    topology = read_topology(write_sysfs(tmp_path / "sys", spec))
    assert Topology.from_dict(topology.to_dict()) == topology


# --- field differences -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("recorded", "replayed", "expected"),
    [
        ({"a": 1}, {"a": 1}, []),
        ({"a": {"b": "x"}}, {"a": {"b": "y"}}, [("a.b", "x", "y")]),
        ({"a": 1}, {}, [("a", 1, ABSENT)]),
        ({}, {"a": 1}, [("a", ABSENT, 1)]),
        ({"l": [1, 2]}, {"l": [1, 3, 4]}, [("l[1]", 2, 3), ("l[2]", ABSENT, 4)]),
        ({"a": [{"k": "v"}]}, {"a": [{"k": "w"}]}, [("a[0].k", "v", "w")]),
        ({"a": 1}, {"a": "1"}, [("a", 1, "1")]),
        ("x", {"a": 1}, [("", "x", {"a": 1})]),
    ],
    ids=["same", "nested", "removed", "added", "list", "list-of-objects", "type", "shape"],
)
def test_field_diff(recorded: Any, replayed: Any, expected: list[tuple[str, Any, Any]]) -> None:
    found = [(d.field, d.recorded, d.replayed) for d in field_diff(recorded, replayed, "x")]
    assert found == expected


def test_a_difference_reads_as_a_sentence() -> None:
    line = Difference("forwarded", "config.linux.resources.cpuset_cpus", "2-3", ABSENT).describe()
    assert line == 'forwarded config.linux.resources.cpuset_cpus: recorded "2-3", replayed (absent)'


# --- a hook's recorded adjustment, read back (a replay standing in for a plugin) --------------

ADJUSTMENTS: dict[str, Callable[[Adjustment], Adjustment]] = {
    "cgroup_parent": lambda a: a.set_cgroup_parent("/kubepods/pod1"),
    "label": lambda a: a.set_label("team", "payments"),
    "label-removed": lambda a: a.remove_label("team"),
    "annotation": lambda a: a.set_annotation("example.com/it's", 'say "hi"'),
    "annotation-removed": lambda a: a.remove_annotation("example.com/x"),
    "cpuset_cpus": lambda a: a.set_cpuset_cpus("2-3"),
    "cpuset_mems": lambda a: a.set_cpuset_mems("0"),
    "cpu_shares": lambda a: a.set_cpu_shares(2048),
    "cpu_quota": lambda a: a.set_cpu_quota(-1),
    "cpu_period": lambda a: a.set_cpu_period(100000),
    "memory_limit": lambda a: a.set_memory_limit(1 << 30),
    "memory_swap_limit": lambda a: a.set_memory_swap_limit(-1),
    "hugepage_limit": lambda a: a.set_hugepage_limit("2MB", 4 << 20),
    "unified": lambda a: a.set_unified("memory.high", "max"),
    "unified-removed": lambda a: a.remove_unified("memory.high"),
    "oom_score_adj": lambda a: a.set_oom_score_adj(-997),
    "device": lambda a: a.add_device("/dev/fuse", "/dev/fuse", "rw"),
    "device-removed": lambda a: a.remove_device("/dev/fuse"),
    "mount": lambda a: a.add_mount("/models", "/srv/models", readonly=True, propagation="rslave"),
    "mount-removed": lambda a: a.remove_mount("/models"),
    "env": lambda a: a.set_env("MODEL_DIR", "/models"),
    "env-removed": lambda a: a.remove_env("MODEL_DIR"),
    "cdi_device": lambda a: a.add_cdi_device("vendor.com/gpu=0"),
    "cdi_device-removed": lambda a: a.remove_cdi_device("vendor.com/gpu=0"),
    "update": lambda a: a.update_container("c" * 64, ResourceDelta("0-1", cpu_shares=2)),
    "several": lambda a: a.set_cpuset_cpus("1").set_env("A", "b").set_annotation("k", "v"),
}


def _recorded_answer(adjustment: Adjustment, redactor: Redactor) -> Any:
    run = HookRun("50-plugin", Stage.PRE, "adjusted", "", adjustment, 0.001)
    (doc,) = json.loads(json.dumps(hook_docs([run], redactor)))
    return doc["answer"]


def test_every_field_kind_has_a_case_in_the_round_trip() -> None:
    built = [ADJUSTMENTS[name](Adjustment()) for name in ADJUSTMENTS]
    assert {key[0] for a in built for key in a.changes} == set(Field)
    assert {a.changes[k] is REMOVE for a in built for k in a.changes} == {True, False}


@pytest.mark.parametrize("name", list(ADJUSTMENTS), ids=list(ADJUSTMENTS))
def test_a_recorded_adjustment_reads_back_as_it_was(name: str) -> None:
    adjustment = ADJUSTMENTS[name](Adjustment())
    doc = _recorded_answer(adjustment, Redactor((), enabled=False))

    assert adjustment_of(doc) == adjustment
    assert [describe_key(k) for k in adjustment.changes] == list(doc["set"])
    assert all(parse_key(describe_key(k)) == k for k in adjustment.changes)


def test_a_redacted_env_value_reads_back_redacted() -> None:
    adjustment = Adjustment().set_env("TOKEN", "s3cr3t").set_annotation("example.com/token", "t")
    doc = _recorded_answer(adjustment, Redactor(("*token*",)))

    again = adjustment_of(doc)

    assert again.changes == {
        (Field.ENV, "TOKEN"): REDACTED.encode(),
        (Field.ANNOTATION, "example.com/token"): REDACTED,
    }


@pytest.mark.parametrize(
    "text",
    ["cpuset", "cpuset_cpus '1'", "annotation", "annotation x", "annotation ''", "label 1",
     "env __import__('os')"],
    ids=["unknown", "scalar-with-key", "no-key", "unquoted", "empty", "not-a-string", "code"],
)  # fmt: skip
def test_parse_key_refuses_what_describe_key_never_writes(text: str) -> None:
    with pytest.raises(ValueError, match=r"adjustment field|takes no key|quoted key"):
        parse_key(text)


@pytest.mark.parametrize(
    ("key", "shown"),
    [
        ((Field.ENV, "A"), 5),
        ((Field.DEVICE, "/dev/x"), "/dev/x"),
        ((Field.MOUNT, "/m"), {"container_path": "/m", "nope": 1}),
        ((Field.CPU_SHARES, ""), 1.5),
        ((Field.CPU_SHARES, ""), True),
    ],
    ids=["env-number", "device-string", "mount-unknown-key", "float", "bool"],
)
def test_from_jsonable_refuses_what_jsonable_never_shows(key: Any, shown: Any) -> None:
    with pytest.raises(TypeError):
        from_jsonable(key, shown)
