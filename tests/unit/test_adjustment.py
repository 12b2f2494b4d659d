"""The Adjustment builder: validation, explicit presence, REMOVE, env bytes, updates."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from crihook.hooks.spec.adjustment import (
    REMOVE,
    Adjustment,
    ContainerUpdate,
    Device,
    Field,
    Mount,
    ResourceDelta,
    describe_key,
)

Build = Callable[[Adjustment], Any]

# (id, builder call, exception, text the message must contain)
INVALID_CASES: list[tuple[str, Build, type[Exception], str]] = [
    ("cgroup_parent-not-str", lambda a: a.set_cgroup_parent(1), TypeError, "cgroup_parent"),
    ("label-key-empty", lambda a: a.set_label("", "v"), ValueError, "label"),
    ("label-key-not-str", lambda a: a.set_label(1, "v"), ValueError, "label"),
    ("label-value-not-str", lambda a: a.set_label("k", 1), TypeError, "label value"),
    ("remove-label-key-empty", lambda a: a.remove_label(""), ValueError, "label"),
    ("annotation-key-empty", lambda a: a.set_annotation("", "v"), ValueError, "annotation"),
    ("annotation-value-none", lambda a: a.set_annotation("k", None), TypeError, "annotation"),
    ("remove-annotation-empty", lambda a: a.remove_annotation(""), ValueError, "annotation"),
    ("cpuset_cpus-not-str", lambda a: a.set_cpuset_cpus(3), TypeError, "cpuset_cpus"),
    ("cpuset_mems-bytes", lambda a: a.set_cpuset_mems(b"0"), TypeError, "cpuset_mems"),
    ("cpu_shares-negative", lambda a: a.set_cpu_shares(-1), ValueError, "cpu_shares"),
    ("cpu_shares-bool", lambda a: a.set_cpu_shares(True), TypeError, "cpu_shares"),
    ("cpu_shares-float", lambda a: a.set_cpu_shares(1.5), TypeError, "cpu_shares"),
    ("cpu_shares-str", lambda a: a.set_cpu_shares("2"), TypeError, "cpu_shares"),
    ("cpu_quota-below-minus-1", lambda a: a.set_cpu_quota(-2), ValueError, "cpu_quota"),
    ("cpu_period-negative", lambda a: a.set_cpu_period(-1), ValueError, "cpu_period"),
    # What the kernel and runc refuse (hooks.spec.limits), refused when the hook sets it.
    ("cpu_period-under-1ms", lambda a: a.set_cpu_period(999), ValueError, "CFS period of 1000"),
    ("cpu_period-over-1s", lambda a: a.set_cpu_period(1_000_001), ValueError, "to 1000000 µs"),
    ("cpu_quota-under-1ms", lambda a: a.set_cpu_quota(10), ValueError, "CFS quota of 1000"),
    ("cpu_shares-1", lambda a: a.set_cpu_shares(1), ValueError, "cpu shares are 2 to 262144"),
    ("cpu_shares-over", lambda a: a.set_cpu_shares(262_145), ValueError, "2 to 262144"),
    (
        "update-shares-1",
        lambda a: a.update_container("c" * 64, ResourceDelta(cpu_shares=1)),
        ValueError,
        "cpu shares are 2 to 262144",
    ),
    (
        "memory_limit-negative",
        lambda a: a.set_memory_limit(-1),
        ValueError,
        "memory_limit_in_bytes",
    ),
    ("memory_limit-float", lambda a: a.set_memory_limit(1e9), TypeError, "memory_limit_in_bytes"),
    (
        "memory_swap-below-minus-1",
        lambda a: a.set_memory_swap_limit(-2),
        ValueError,
        "memory_swap_limit_in_bytes",
    ),
    ("hugepage-size-empty", lambda a: a.set_hugepage_limit("", 1), ValueError, "hugepage size"),
    ("hugepage-limit-negative", lambda a: a.set_hugepage_limit("2MB", -1), ValueError, "limit"),
    ("unified-key-empty", lambda a: a.set_unified("", "1"), ValueError, "unified"),
    (
        "unified-value-not-str",
        lambda a: a.set_unified("memory.high", 1),
        TypeError,
        "unified value",
    ),
    ("oom_score_adj-above-1000", lambda a: a.set_oom_score_adj(1001), ValueError, "oom_score_adj"),
    ("oom_score_adj-below-1000", lambda a: a.set_oom_score_adj(-1001), ValueError, "oom_score_adj"),
    (
        "device-container-path-relative",
        lambda a: a.add_device("dev/x", "/dev/x"),
        ValueError,
        "container_path",
    ),
    (
        "device-host-path-relative",
        lambda a: a.add_device("/dev/x", "dev/x"),
        ValueError,
        "host_path",
    ),
    (
        "device-permissions-bad",
        lambda a: a.add_device("/dev/x", "/dev/x", "rwx"),
        ValueError,
        "permissions",
    ),
    (
        "device-permissions-empty",
        lambda a: a.add_device("/dev/x", "/dev/x", ""),
        ValueError,
        "permissions",
    ),
    ("remove-device-relative", lambda a: a.remove_device("dev/x"), ValueError, "container_path"),
    (
        "mount-propagation-bad",
        lambda a: a.add_mount("/a", "/b", propagation="shared"),
        ValueError,
        "propagation",
    ),
    (
        "mount-container-path-relative",
        lambda a: a.add_mount("a", "/b"),
        ValueError,
        "container_path",
    ),
    ("mount-host-path-relative", lambda a: a.add_mount("/a", "b"), ValueError, "host_path"),
    ("remove-mount-relative", lambda a: a.remove_mount("a"), ValueError, "container_path"),
    ("env-name-empty", lambda a: a.set_env("", "v"), ValueError, "env"),
    ("env-value-int", lambda a: a.set_env("K", 1), TypeError, "env value"),
    ("env-value-none", lambda a: a.set_env("K", None), TypeError, "env value"),
    ("remove-env-empty", lambda a: a.remove_env(""), ValueError, "env"),
    ("cdi-name-empty", lambda a: a.add_cdi_device(""), ValueError, "cdi device"),
    ("remove-cdi-empty", lambda a: a.remove_cdi_device(""), ValueError, "cdi device"),
    (
        "update-no-id",
        lambda a: a.update_container("", ResourceDelta(cpu_shares=2)),
        ValueError,
        "container id",
    ),
    (
        "update-no-field",
        lambda a: a.update_container("c1", ResourceDelta()),
        ValueError,
        "at least one",
    ),
]


@pytest.mark.parametrize(
    ("build", "error", "text"),
    [c[1:] for c in INVALID_CASES],
    ids=[c[0] for c in INVALID_CASES],
)
def test_invalid_values_are_refused_naming_the_field(
    build: Build, error: type[Exception], text: str
) -> None:
    adj = Adjustment().set_annotation("kept", "1")
    before = dict(adj.changes)
    with pytest.raises(error) as info:
        build(adj)
    assert type(info.value) is error
    assert text in str(info.value)
    # A refused call changes nothing.
    assert dict(adj.changes) == before
    assert adj.updates == ()


# (id, builder call, expected changes)
VALID_CASES: list[tuple[str, Build, dict[tuple[Field, str], Any]]] = [
    (
        "cgroup_parent",
        lambda a: a.set_cgroup_parent("/kubepods/x"),
        {(Field.CGROUP_PARENT, ""): "/kubepods/x"},
    ),
    ("label", lambda a: a.set_label("k", ""), {(Field.LABEL, "k"): ""}),
    ("annotation", lambda a: a.set_annotation("a/b", "v"), {(Field.ANNOTATION, "a/b"): "v"}),
    (
        "cpuset_cpus-empty-is-present",
        lambda a: a.set_cpuset_cpus(""),
        {(Field.CPUSET_CPUS, ""): ""},
    ),
    ("cpuset_mems", lambda a: a.set_cpuset_mems("0-1"), {(Field.CPUSET_MEMS, ""): "0-1"}),
    ("cpu_shares-zero", lambda a: a.set_cpu_shares(0), {(Field.CPU_SHARES, ""): 0}),
    ("cpu_quota-zero", lambda a: a.set_cpu_quota(0), {(Field.CPU_QUOTA, ""): 0}),
    ("cpu_quota-minus-1", lambda a: a.set_cpu_quota(-1), {(Field.CPU_QUOTA, ""): -1}),
    ("cpu_period", lambda a: a.set_cpu_period(100000), {(Field.CPU_PERIOD, ""): 100000}),
    ("memory_limit-zero", lambda a: a.set_memory_limit(0), {(Field.MEMORY_LIMIT, ""): 0}),
    (
        "memory_swap-minus-1",
        lambda a: a.set_memory_swap_limit(-1),
        {(Field.MEMORY_SWAP_LIMIT, ""): -1},
    ),
    ("hugepage", lambda a: a.set_hugepage_limit("2MB", 0), {(Field.HUGEPAGE_LIMIT, "2MB"): 0}),
    (
        "unified",
        lambda a: a.set_unified("memory.high", "max"),
        {(Field.UNIFIED, "memory.high"): "max"},
    ),
    ("oom-low-bound", lambda a: a.set_oom_score_adj(-1000), {(Field.OOM_SCORE_ADJ, ""): -1000}),
    ("oom-high-bound", lambda a: a.set_oom_score_adj(1000), {(Field.OOM_SCORE_ADJ, ""): 1000}),
    (
        "device",
        lambda a: a.add_device("/dev/x", "/dev/y", "r"),
        {(Field.DEVICE, "/dev/x"): Device("/dev/x", "/dev/y", "r")},
    ),
    (
        "mount",
        lambda a: a.add_mount("/a", "/b", readonly=True, propagation="rslave"),
        {(Field.MOUNT, "/a"): Mount("/a", "/b", True, "rslave", False)},
    ),
    ("env-str-is-encoded", lambda a: a.set_env("K", "é"), {(Field.ENV, "K"): "é".encode()}),
    ("env-bytes-kept", lambda a: a.set_env("K", b"\xff\x00"), {(Field.ENV, "K"): b"\xff\x00"}),
    ("env-empty", lambda a: a.set_env("K", ""), {(Field.ENV, "K"): b""}),
    (
        "cdi",
        lambda a: a.add_cdi_device("vendor.com/gpu=0"),
        {(Field.CDI_DEVICE, "vendor.com/gpu=0"): "vendor.com/gpu=0"},
    ),
    ("remove-label", lambda a: a.remove_label("k"), {(Field.LABEL, "k"): REMOVE}),
    ("remove-annotation", lambda a: a.remove_annotation("k"), {(Field.ANNOTATION, "k"): REMOVE}),
    (
        "remove-unified",
        lambda a: a.remove_unified("memory.high"),
        {(Field.UNIFIED, "memory.high"): REMOVE},
    ),
    ("remove-device", lambda a: a.remove_device("/dev/x"), {(Field.DEVICE, "/dev/x"): REMOVE}),
    ("remove-mount", lambda a: a.remove_mount("/a"), {(Field.MOUNT, "/a"): REMOVE}),
    ("remove-env", lambda a: a.remove_env("K"), {(Field.ENV, "K"): REMOVE}),
    ("remove-cdi", lambda a: a.remove_cdi_device("v/g=0"), {(Field.CDI_DEVICE, "v/g=0"): REMOVE}),
    (
        "last-write-wins",
        lambda a: a.set_cpuset_cpus("1").set_cpuset_cpus("2"),
        {(Field.CPUSET_CPUS, ""): "2"},
    ),
    (
        "set-then-remove",
        lambda a: a.set_label("k", "v").remove_label("k"),
        {(Field.LABEL, "k"): REMOVE},
    ),
]


@pytest.mark.parametrize(
    ("build", "expected"), [c[1:] for c in VALID_CASES], ids=[c[0] for c in VALID_CASES]
)
def test_valid_values_are_recorded_exactly(
    build: Build, expected: dict[tuple[Field, str], Any]
) -> None:
    adj = Adjustment()
    assert build(adj) is adj  # builders chain
    assert dict(adj.changes) == expected
    assert bool(adj) is True


def test_explicit_presence_zero_is_present_and_unset_is_absent() -> None:
    adj = Adjustment().set_cpu_quota(0)
    assert (Field.CPU_QUOTA, "") in adj.changes
    assert adj.changes[(Field.CPU_QUOTA, "")] == 0
    for field in Field:
        if field is not Field.CPU_QUOTA:
            assert not any(key[0] is field for key in adj.changes), field


def test_empty_adjustment_is_falsy_and_changes_read_only() -> None:
    adj = Adjustment()
    assert not adj
    assert dict(adj.changes) == {}
    with pytest.raises(TypeError):
        adj.changes[(Field.LABEL, "k")] = "v"  # type: ignore[index]


def test_remove_is_a_singleton_distinct_from_values() -> None:
    assert type(REMOVE)() is REMOVE
    assert repr(REMOVE) == "REMOVE"
    assert REMOVE not in ("", 0, None, b"")
    assert Adjustment().remove_env("K") != Adjustment().set_env("K", "")


def test_update_container_records_explicitly_present_fields() -> None:
    adj = Adjustment().update_container("c1", ResourceDelta(cpu_quota=0, cpuset_cpus="0-1"))
    assert bool(adj) is True
    assert dict(adj.changes) == {}
    assert adj.updates == (ContainerUpdate("c1", ResourceDelta(cpu_quota=0, cpuset_cpus="0-1")),)
    assert dict(adj.updates[0].resources.items()) == {"cpuset_cpus": "0-1", "cpu_quota": 0}


def test_updates_keep_their_order() -> None:
    adj = (
        Adjustment()
        .update_container("c2", ResourceDelta(cpu_shares=2))
        .update_container("c1", ResourceDelta(cpu_shares=3))
    )
    assert [u.container_id for u in adj.updates] == ["c2", "c1"]


def test_equality_compares_changes_and_updates() -> None:
    a = Adjustment().set_cpuset_cpus("1").update_container("c", ResourceDelta(cpu_shares=2))
    b = Adjustment().set_cpuset_cpus("1").update_container("c", ResourceDelta(cpu_shares=2))
    c = Adjustment().set_cpuset_cpus("1")
    assert a == b
    assert a != c


DESCRIBE_CASES = [
    ("annotation", (Field.ANNOTATION, "a/b"), "annotation 'a/b'"),
    ("env", (Field.ENV, "PATH"), "env 'PATH'"),
    ("device", (Field.DEVICE, "/dev/x"), "device '/dev/x'"),
    ("scalar", (Field.CPUSET_CPUS, ""), "cpuset_cpus"),
    ("memory", (Field.MEMORY_LIMIT, ""), "memory_limit_in_bytes"),
]


@pytest.mark.parametrize(
    ("key", "expected"), [c[1:] for c in DESCRIBE_CASES], ids=[c[0] for c in DESCRIBE_CASES]
)
def test_describe_key(key: tuple[Field, str], expected: str) -> None:
    assert describe_key(key) == expected


def test_a_reason_explains_and_changes_nothing() -> None:
    adj = Adjustment().set_cpuset_cpus("2-3").because("  scheduler's\ncpus ").because("LSR")
    assert adj.reason == "scheduler's cpus; LSR"
    assert adj == Adjustment().set_cpuset_cpus("2-3")  # the reason is not a change
    assert not Adjustment().because("skipped")  # nothing set: still empty
    assert 'because "scheduler\'s cpus; LSR"' in repr(adj)
    with pytest.raises(TypeError):
        Adjustment().because(3)  # type: ignore[arg-type]
