"""The devices hook's pure parts: the annotation parsers (tables, and properties: no input
crashes them, every refusal is a clear AnnotationError), path globs, the policy options, and
the pools' NUMA hints and pick (kubelet's device manager), and the pool book's per-pod
answers against a walk of every allocation."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crihook.hooks.devices.annotations import (
    AnnotationError,
    DeviceAsk,
    EnvAsk,
    MountAsk,
    container_ask,
    parse_device_annotation,
    parse_env_annotation,
    parse_mount_annotation,
    parse_pool_annotation,
)
from crihook.hooks.devices.policy import PoolDevice, parse_policy
from crihook.hooks.devices.pools import (
    PoolBook,
    assigned_value,
    device_hints,
    parse_assigned,
    pick_devices,
)
from crihook.hooks.node.globs import compile_glob, compile_path_glob
from crihook.hooks.spec import TopologyHint

# --- parsers: tables ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("[]", ()),
        ('[{"path": "/dev/fuse"}]', (DeviceAsk("/dev/fuse", "/dev/fuse", "rw", "[0]"),)),
        (
            '[{"path": "/dev/a", "container_path": "/dev/b", "permissions": "rwm"}]',
            (DeviceAsk("/dev/a", "/dev/b", "rwm", "[0]"),),
        ),
    ],
    ids=["empty", "path-only", "all-keys"],
)
def test_device_annotation_parses(value: str, expected: tuple[DeviceAsk, ...]) -> None:
    assert parse_device_annotation(value) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('{"path": "/dev/fuse"}', "expected a JSON list of device objects, got an object"),
        ("[1]", "[0]: expected an object, got a number"),
        ("[{}]", "[0]: a device needs a path"),
        ('[{"path": "dev/fuse"}]', "path 'dev/fuse' is not an absolute path"),
        ('[{"path": "/dev/fuse/"}]', "not a normalized path"),
        ('[{"path": "//dev/fuse"}]', "not a normalized path"),
        ('[{"path": "/"}]', "not a normalized path"),
        ('[{"path": "/dev/\\u0000"}]', "contains a NUL character"),
        ('[{"path": "/dev/a", "permissions": "rx"}]', "permissions 'rx' are not"),
        ('[{"path": "/dev/a", "permissions": "rr"}]', "permissions 'rr' are not"),
        ('[{"path": "/dev/a", "permissions": ""}]', "permissions '' are not"),
        ('[{"path": "/dev/a", "type": "c"}]', "type cannot be given: crihook reads them"),
        ('[{"path": "/dev/a", "contianer_path": "/x"}]', "unknown key(s) 'contianer_path'"),
        ('[{"path": "/dev/a"}, {"path": "/dev/a"}]', "[1]: container_path '/dev/a' is given twice"),
        ('[{"path": "/dev/a", "path": "/dev/b"}]', "'path' appears twice in one object"),
        ("[NaN]", "NaN is not a JSON number"),
        ("[" * 5000 + "]" * 5000, "nested too deeply"),
        ("x" * 70000, "longer than 65536"),
        ('[{"path": "/a"}]' and json.dumps([{"path": "/a"}] * 65), "65 entries; at most 64"),
    ],
    ids=[
        "object", "number", "no-path", "relative", "trailing-slash", "double-slash", "root",
        "nul", "bad-letter", "twice-letter", "no-letter", "type", "typo", "same-target",
        "duplicate-key", "nan", "deep", "long", "many",
    ],
)  # fmt: skip
def test_device_annotation_refusals(value: str, message: str) -> None:
    with pytest.raises(AnnotationError) as info:
        parse_device_annotation(value)
    assert message in str(info.value)


def test_mount_annotation_forms() -> None:
    assert parse_mount_annotation('{"/srv/a": "/a"}') == (
        MountAsk("/srv/a", "/a", True, '["/srv/a"]'),
    )
    assert parse_mount_annotation(
        '[{"host_path": "/srv/a"}, {"host_path": "/s", "container_path": "/b", "readonly": false}]'
    ) == (MountAsk("/srv/a", "/srv/a", True, "[0]"), MountAsk("/s", "/b", False, "[1]"))
    with pytest.raises(AnnotationError, match=r"\[0\]: readonly must be true or false, not 'no'"):
        parse_mount_annotation('[{"host_path": "/s", "readonly": "no"}]')
    with pytest.raises(AnnotationError, match="given twice"):
        parse_mount_annotation('{"/a": "/x", "/b": "/x"}')
    with pytest.raises(AnnotationError, match=r"\[\"/a\"\]: container path 'x'"):
        parse_mount_annotation('{"/a": "x"}')


def test_env_annotation_keeps_its_order() -> None:
    assert parse_env_annotation('[{"name": "B", "value": "1"}, {"name": "A"}]') == (
        EnvAsk("B", "1", "[0]"),
        EnvAsk("A", "", "[1]"),
    )
    for value, message in [
        ('[{"name": "1A"}]', "'1A' is not an environment variable name"),
        ('[{"name": "A=B"}]', "is not an environment variable name"),
        ('[{"name": "A", "value": 1}]', "value of A must be a string, not a number"),
        ('[{"name": "A"}, {"name": "A"}]', "[1]: A is given twice"),
    ]:
        with pytest.raises(AnnotationError) as info:
            parse_env_annotation(value)
        assert message in str(info.value)


def test_pool_annotation() -> None:
    assert dict(parse_pool_annotation('{"gpu": 2, "fpga-x": 1}')) == {"gpu": 2, "fpga-x": 1}
    for value, message in [
        ("[]", "expected an object"),
        ('{"GPU": 1}', "'GPU' is not a pool name"),
        ('{"gpu": 1.0}', "count 1.0 is not a whole number"),
        ('{"gpu": true}', "count True is not a whole number"),
        ('{"gpu": 1025}', "count 1025 is not in 0..1024"),
    ]:
        with pytest.raises(AnnotationError) as info:
            parse_pool_annotation(value)
        assert message in str(info.value)


def test_container_ask_merges_and_names_the_annotation() -> None:
    annotations = {
        "devices.crihook.io/pod": '[{"path": "/dev/a"}]',
        "devices.crihook.io/container.app": '[{"path": "/dev/b"}]',
        "devices.crihook.io/container.other": '[{"path": "/dev/c"}]',
        "example.com/unrelated": "x",
    }
    ask = container_ask(annotations, "app")
    assert [(d.path, d.source) for d in ask.devices] == [
        ("/dev/a", "devices.crihook.io/pod [0]"),
        ("/dev/b", "devices.crihook.io/container.app [0]"),
    ]
    assert not container_ask({"example.com/x": "1"}, "app")
    with pytest.raises(AnnotationError) as info:
        container_ask({"env.crihook.io/container.app": "{"}, "app")
    assert str(info.value).startswith("annotation env.crihook.io/container.app: the value is not")
    with pytest.raises(AnnotationError, match="'App' is not a container name"):
        container_ask({"env.crihook.io/container.App": "[]"}, "app")


# --- parsers: properties -------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
KEYS = ["path", "container_path", "permissions", "host_path", "readonly", "name", "value",
        "gpu", "major", "/dev/fuse"]  # fmt: skip
PATHS = st.sampled_from(["/dev/fuse", "/dev/a/../b", "dev", "/", "/x/", "/\x00", "//a", "/ä"])
# JSON shaped like what the parsers expect, with wrong parts: reaches deep into them.
SHAPED = st.recursive(
    PATHS | st.sampled_from(["rw", "rwm", "x", ""]) | st.integers(-2, 2000) | st.booleans(),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=3), inner, max_size=4)
    ),
    max_leaves=12,
)
TEXT = st.one_of(st.text(), JSON.map(json.dumps), SHAPED.map(json.dumps))
PARSERS = [parse_device_annotation, parse_mount_annotation, parse_env_annotation,
           parse_pool_annotation]  # fmt: skip


@pytest.mark.parametrize("parse", PARSERS, ids=lambda p: p.__name__)
@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=TEXT)
def test_no_input_crashes_a_parser_and_refusals_are_clear(parse: Any, value: str) -> None:
    try:
        parse(value)
    except AnnotationError as exc:
        message = str(exc.within("devices.crihook.io/container.app"))
        assert message.startswith("annotation devices.crihook.io/container.app")
        assert 0 < len(message) < 600, message


@settings(max_examples=300)
@given(
    annotations=st.dictionaries(
        st.sampled_from(
            [
                "devices.crihook.io/pod",
                "devices.crihook.io/container.app",
                "mounts.crihook.io/pod",
                "env.crihook.io/container.app",
                "pools.crihook.io/container.app",
                "pools.crihook.io/pod",
                "devices.crihook.io/x",
                "devices.crihook.io/container.A",
                "example.com/other",
            ]
        ),
        TEXT,
        max_size=4,
    )
)
def test_container_ask_never_crashes(annotations: dict[str, str]) -> None:
    try:
        ask = container_ask(annotations, "app")
    except AnnotationError as exc:
        assert exc.key in annotations and str(exc).startswith(f"annotation {exc.key}")
        return
    for device in ask.devices:
        assert device.path.startswith("/") and set(device.permissions) <= set("rwm")
        assert device.source.split(" ")[0] in annotations


@given(
    st.lists(
        st.fixed_dictionaries(
            {"path": st.from_regex(r"/dev/[a-z0-9]{1,8}(/[a-z0-9]{1,4})?", fullmatch=True)},
            optional={"permissions": st.sampled_from(["r", "w", "rw", "rwm", "mw"])},
        ),
        max_size=8,
        unique_by=lambda d: d["path"],
    )
)
def test_valid_device_lists_round_trip(entries: list[dict[str, str]]) -> None:
    parsed = parse_device_annotation(json.dumps(entries))
    assert [(d.path, d.container_path, d.permissions) for d in parsed] == [
        (e["path"], e["path"], e.get("permissions", "rw")) for e in entries
    ]


# --- globs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("/dev/nvidia*", "/dev/nvidia0", True),
        ("/dev/nvidia*", "/dev/nvidia0/x", False),
        ("/srv/**", "/srv/a/b", True),
        ("/srv/**", "/srv", False),
        ("/srv", "/srv", True),
        ("/dev/sd[a-c]", "/dev/sdb", True),
        ("/dev/sd[!a-c]", "/dev/sdd", True),
        ("/dev/sd[!a-c]", "/dev/sda", False),
        ("/a/[/]", "/a//", False),
        ("/dev/tty?", "/dev/tty1", True),
        ("/dev/tty?", "/dev/tty/", False),
        ("/a.b", "/aXb", False),
    ],
    ids=lambda v: str(v),
)
def test_globs(pattern: str, path: str, matches: bool) -> None:
    assert bool(compile_path_glob(pattern).fullmatch(path)) is matches


@pytest.mark.parametrize("pattern", ["", "dev/*", "/dev/../mem", "/dev/", "//dev", "/a/[b"])
def test_bad_path_globs_are_refused(pattern: str) -> None:
    with pytest.raises(ValueError):
        compile_path_glob(pattern)


@given(st.text(max_size=20))
def test_any_glob_compiles_or_is_refused(pattern: str) -> None:
    with contextlib.suppress(ValueError):
        compile_glob(pattern)


# --- policy options -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"devics": []}, "devices: unknown option(s) devics"),
        ({"devices": "/dev/fuse"}, "devices: devices must be a list of strings"),
        ({"devices": ["dev/fuse"]}, "devices: devices: 'dev/fuse' is not an absolute path glob"),
        ({"mounts": ["/srv/../etc"]}, "devices: mounts: '/srv/../etc' is not a normalized"),
        ({"device_permissions": "rwx"}, "device_permissions 'rwx' is not some of"),
        ({"pools": {"GPU": {"devices": [{"id": 0, "path": "/dev/a"}]}}}, "pools.GPU: not a pool"),
        ({"pools": {"gpu": {"devices": []}}}, "pools.gpu.devices must be a non-empty list"),
        ({"pools": {"gpu": {"devices": [{"id": "0"}]}}}, "give path or paths"),
        ({"pools": {"gpu": {"devices": [{"id": "0", "path": "/dev/a*"}]}}}, "is a glob"),
        ({"pools": {"gpu": {"devices": [{"id": "0", "path": "/dev/a", "numa": -1}]}}},
         "numa -1 is not a NUMA node"),
        ({"pools": {"gpu": {"devices": [{"id": "0", "path": "/dev/a"},
                                        {"id": "0", "path": "/dev/b"}]}}}, "id '0' is there twice"),
        ({"pools": {"a": {"devices": [{"id": "0", "path": "/dev/x"}]},
                    "b": {"devices": [{"id": "0", "path": "/dev/x"}]}}},
         "/dev/x is a device of pool a (id 0) already"),
        ({"pools": {"a": {"env": "X", "devices": [{"id": "0", "path": "/dev/x"}]},
                    "b": {"env": "X", "devices": [{"id": "0", "path": "/dev/y"}]}}},
         "X is the env of pool a too"),
        ({"pools": {"gpu": {"env": "1X", "devices": [{"id": "0", "path": "/dev/a"}]}}},
         "is not an environment variable name"),
    ],
    ids=[
        "unknown", "not-list", "relative", "dotdot", "permissions", "pool-name", "no-devices",
        "no-path", "glob-path", "numa", "same-id", "same-path", "same-env", "bad-env",
    ],
)  # fmt: skip
def test_policy_options_are_checked_when_read(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_policy(options)
    assert message in str(info.value)


def test_policy_defaults_allow_nothing() -> None:
    policy = parse_policy({})
    assert not policy.namespaces and not policy.devices and not policy.mounts
    assert not policy.env and not policy.pools and policy.device_permissions == "rw"


# --- pools: kubelet's hints and pick --------------------------------------------------------------

FOUR = (
    PoolDevice("a", ("/dev/a",), 0),
    PoolDevice("b", ("/dev/b",), 0),
    PoolDevice("c", ("/dev/c",), 1),
    PoolDevice("d", ("/dev/d",), 1),
)


def hint(nodes: set[int], preferred: bool) -> TopologyHint:
    return TopologyHint(frozenset(nodes), preferred)


@pytest.mark.parametrize(
    ("available", "count", "expected"),
    [
        ({"a", "b", "c", "d"}, 1, [hint({0}, True), hint({1}, True), hint({0, 1}, False)]),
        ({"a", "b", "c", "d"}, 2, [hint({0}, True), hint({1}, True), hint({0, 1}, False)]),
        ({"a", "b", "c", "d"}, 3, [hint({0, 1}, True)]),
        ({"a", "c", "d"}, 2, [hint({1}, True), hint({0, 1}, False)]),
        ({"a", "c"}, 2, [hint({0, 1}, False)]),  # could be on one node were both free
        ({"a"}, 2, []),
    ],
    ids=["one", "two", "three", "two-one-node-busy", "split", "too-few"],
)
def test_device_hints_are_kubelets(available: set[str], count: int, expected: list[Any]) -> None:
    assert device_hints(FOUR, available, count, (0, 1)) == expected


def test_a_pool_without_numa_information_has_no_preference() -> None:
    devices = (PoolDevice("a", ("/dev/a",)), PoolDevice("b", ("/dev/b",)))
    assert device_hints(devices, {"a", "b"}, 1, (0, 1)) is None


def test_pick_takes_the_chosen_node_then_unknown_then_others() -> None:
    devices = (*FOUR, PoolDevice("e", ("/dev/e",)))
    assert pick_devices(devices, {"a", "b", "c", "d", "e"}, 3, frozenset({1})) == ("c", "d", "e")
    assert pick_devices(devices, {"a", "c", "e"}, 3, frozenset({1})) == ("c", "e", "a")
    assert pick_devices(devices, {"a", "b"}, 1, None) == ("a",)
    assert pick_devices(devices, {"a"}, 2, None) is None


# --- the pool book's per-pod index ---------------------------------------------------------


class _DictState(dict):  # type: ignore[type-arg]
    """A HookState kept in a dict (values as they were set)."""

    def set(self, key: str, value: Any) -> None:
        self[key] = json.loads(json.dumps(value))

    def delete(self, key: str) -> None:
        self.pop(key, None)


_BOOK_POLICY = parse_policy(
    {"pools": {"gpu": {"devices": [{"id": str(i), "path": f"/dev/g{i}"} for i in range(6)]}}}
)
_KINDS = {"init": "init", "app": "app", "side": "unknown"}  # side: CRI did not say
_BOOK_STEPS = st.lists(
    st.tuples(
        st.sampled_from(["reserve", "confirm", "release", "remove", "remove_pod", "reload"]),
        st.sampled_from(["p1", "p2", "p3"]),
        st.sampled_from(["init", "app", "side"]),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_BOOK_STEPS)
def test_the_book_answers_per_pod_as_a_walk_of_every_allocation_would(
    steps: list[tuple[str, str, str]],
) -> None:
    state = _DictState()
    book = PoolBook(_BOOK_POLICY.pools, state)
    ids = iter(f"c{i}" for i in range(1000))
    for op, pod, name in steps:
        if op == "reserve" and book.of(pod, name) is None:
            free = sorted(book.available("gpu"))
            if free:
                book.reserve(pod, name, {"gpu": (free[0],)}, _KINDS[name])
        elif op == "confirm":
            book.confirm(pod, name, next(ids))
        elif op == "release":
            book.release_pending(pod, name)
        elif op == "remove":
            held = book.of(pod, name)
            if held is not None and held.containers:
                book.remove_container(held.containers[0])
        elif op == "remove_pod":
            gone = book.remove_pod(pod)
            assert all(a.pod == pod for a in gone)
            assert not [a for a in book.allocations.values() if a.pod == pod]
        else:  # crihook restarts: the book is read back from its state
            book = PoolBook(_BOOK_POLICY.pools, state)
            assert book.load() == []
        for each in ("p1", "p2", "p3"):
            walked = [a for a in book.allocations.values() if a.pod == each]
            assert book.undecided(each) == any(a.kind == "unknown" for a in walked)
            expected = _reusable_by_walking(walked, "app")
            assert book.reusable(each, "app", {}) == expected


def _reusable_by_walking(allocations: list[Any], name: str) -> dict[str, frozenset[str]]:
    """What `reusable` gives for a container of kind app, from the pod's allocations."""
    reuse: set[tuple[str, str]] = set()
    keep: set[tuple[str, str]] = set()
    for a in allocations:
        if a.name == name:
            continue
        done = bool(a.containers) and not a.pending and a.kind == "init"
        (reuse if done else keep).update((p, i) for p, ids in a.devices.items() for i in ids)
    out: dict[str, set[str]] = {}
    for pool, ident in reuse - keep:
        out.setdefault(pool, set()).add(ident)
    return {p: frozenset(i) for p, i in out.items()}


@given(st.dictionaries(st.text(), st.lists(st.text(), max_size=4), max_size=4))
def test_assigned_value_is_the_json_parse_assigned_reads(devices: dict[str, list[str]]) -> None:
    """Built by hand for speed: byte for byte what json.dumps writes, and read back."""
    value = assigned_value(devices)
    assert value == json.dumps(devices, separators=(",", ":"))
    assert parse_assigned(value) == {p: tuple(ids) for p, ids in devices.items()}
