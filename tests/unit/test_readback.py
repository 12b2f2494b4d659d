"""Read-back: the fields hooks set, against the OCI spec the runtime made (proxy.core.readback)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import grpc
import pytest

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.spec import ContainerView, PodView
from crihook.hooks.spec.adjustment import REMOVE, Field, FieldKey
from crihook.proxy.core.readback import Change, ReadBack, changes
from crihook.proxy.cri.outcome import Status
from crihook.proxy.cri.runtime import RuntimeCallFailed
from crihook.proxy.state.records import ContainerRecord
from crihook.proxy.state.store import Store

SPEC: dict[str, Any] = {
    "process": {"env": ["PATH=/bin", "A=1", "A=2", "B=x"], "oomScoreAdj": 0},
    "annotations": {"kept": "yes", "changed": "by-nri"},
    "linux": {
        "resources": {
            "cpu": {"cpus": "0,1", "mems": "0", "shares": 1024, "quota": 50000, "period": 100000},
            "memory": {"limit": 67108864},
        }
    },
}


class Row(NamedTuple):
    key: FieldKey
    value: Any
    changed_to: Any  # what the spec has, when it is a change; None: not a change


ROWS = [
    Row((Field.ENV, "A"), b"2", None),  # the last occurrence counts
    Row((Field.ENV, "A"), b"1", "2"),
    Row((Field.ENV, "GONE"), REMOVE, None),
    Row((Field.ENV, "B"), REMOVE, "x"),  # removed by a hook, back in the spec
    Row((Field.ANNOTATION, "kept"), "yes", None),
    Row((Field.ANNOTATION, "changed"), "by-crihook", "by-nri"),
    Row((Field.ANNOTATION, "not-in-the-spec"), "v", None),  # containerd's allowlist
    Row((Field.CPUSET_CPUS, ""), "0-1", None),  # the same CPUs, written otherwise
    Row((Field.CPUSET_CPUS, ""), "1", "0,1"),
    Row((Field.CPUSET_MEMS, ""), "0", None),
    Row((Field.CPU_SHARES, ""), 512, 1024),
    Row((Field.CPU_QUOTA, ""), 50000, None),
    Row((Field.MEMORY_LIMIT, ""), 67108864, None),
    Row((Field.OOM_SCORE_ADJ, ""), -997, 0),  # restrict_oom_score_adj, for instance
    Row((Field.DEVICE, "/dev/x"), object(), None),  # not compared
]


@pytest.mark.parametrize(
    "row",
    ROWS,
    ids=[
        "env-same",
        "env-changed",
        "env-removed-stays-removed",
        "env-removed-is-back",
        "annotation-same",
        "annotation-changed",
        "annotation-not-copied",
        "cpus-same-set",
        "cpus-changed",
        "mems-same",
        "shares-changed",
        "quota-same",
        "memory-same",
        "oom-changed",
        "device-not-compared",
    ],
)
def test_changes(row: Row) -> None:
    found = changes({row.key: "10-hook"}, {row.key: row.value}, SPEC)
    if row.changed_to is None:
        assert found == []
    else:
        (change,) = found
        assert (change.key, change.hook, change.found) == (row.key, "10-hook", row.changed_to)


def test_changes_are_sorted_by_field_and_show_decoded_values() -> None:
    owners = {(Field.OOM_SCORE_ADJ, ""): "40-oom", (Field.ENV, "A"): "10-env"}
    values = {(Field.OOM_SCORE_ADJ, ""): 5, (Field.ENV, "A"): b"1"}
    assert changes(owners, values, SPEC) == [
        Change((Field.ENV, "A"), "10-env", "1", "2"),
        Change((Field.OOM_SCORE_ADJ, ""), "40-oom", 5, 0),
    ]


class _FakeRuntime:
    """Answers ContainerStatus with a verbose status carrying `spec` (or fails)."""

    def __init__(self, spec: dict[str, Any] | None, fail: bool = False) -> None:
        self.spec, self.fail, self.asked = spec, fail, []

    def call(self, path: str) -> Callable[..., Awaitable[bytes]]:
        async def unary(
            request: bytes, timeout: float | None = None, metadata: Any = None
        ) -> bytes:
            self.asked.append((path, api_pb2.ContainerStatusRequest.FromString(request)))
            if self.fail:
                raise RuntimeCallFailed(Status(grpc.StatusCode.NOT_FOUND, "gone"))
            info = {} if self.spec is None else {"info": json.dumps({"runtimeSpec": self.spec})}
            return api_pb2.ContainerStatusResponse(info=info).SerializeToString()

        return unary


def _store_with(cid: str, audit: dict[str, dict[str, Any]], tmp_path: Any) -> Store:
    store = Store(tmp_path)
    pod = PodView(id="p" * 64, uid="u", name="pod", namespace="ns")
    view = ContainerView(id=cid, pod_id=pod.id, name="app")
    store.put_container(ContainerRecord(view, audit))
    return store


async def test_a_change_is_counted_and_noted_in_the_audit(tmp_path: Any) -> None:
    cid = "c" * 64
    key = (Field.ENV, "A")
    store = _store_with(cid, {"env 'A'": {"hook": "10-env", "value": "1"}}, tmp_path)
    runtime = _FakeRuntime(SPEC)
    reader = ReadBack(runtime, store)
    reader.after_create(cid, {key: "10-env"}, {key: b"1"})
    await reader.drain()
    ((path, request),) = runtime.asked
    assert path == "/runtime.v1.RuntimeService/ContainerStatus"
    assert (request.container_id, request.verbose) == (cid, True)
    assert reader.counts == {"env": 1}
    record = store.container(cid)
    assert record is not None
    assert record.audit["env 'A'"]["runtime_made_it"] == "2"
    await store.close()


async def test_nothing_to_compare_asks_nothing(tmp_path: Any) -> None:
    runtime = _FakeRuntime(SPEC)
    reader = ReadBack(runtime, _store_with("c" * 64, {}, tmp_path))
    reader.after_create("c" * 64, {(Field.DEVICE, "/dev/x"): "50-devices"}, {})
    await reader.drain()
    assert runtime.asked == []


@pytest.mark.parametrize("fail", [True, False], ids=["runtime-fails", "no-spec"])
async def test_an_unreadable_container_is_a_failure_not_a_change(fail: bool, tmp_path: Any) -> None:
    key = (Field.ENV, "A")
    reader = ReadBack(_FakeRuntime(None, fail=fail), _store_with("c" * 64, {}, tmp_path))
    reader.after_create("c" * 64, {key: "10-env"}, {key: b"1"})
    await reader.drain()
    assert (reader.failures, dict(reader.counts)) == (1, {})
