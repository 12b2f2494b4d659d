"""Property tests (hypothesis) for what reaches crihook from outside: pod annotations, the
config file, and hooks' adjustments. Each parser either answers or refuses with its documented
error; nothing else escapes, nothing takes unbounded time, and a refusal changes nothing.

Already covered elsewhere, not repeated here: the devices annotation parsers and globs
(test_devices_parsers.py), the netdev annotation (test_netdev_hook.py), hook permissions
(test_chain_permissions.py). Here: the oom score annotation, Koordinator's annotations and
quantities, cpu lists, the init/sidecar container annotations, every built-in hook's options,
the config loader, the merge, and the hooks' state when an annotation is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import string
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import event as note
from hypothesis import strategies as st

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.cpus.koordinator import parse_resource_status
from crihook.hooks.cpus.options import parse_options as cpuset_options
from crihook.hooks.cpuset import CpusetHook
from crihook.hooks.devices import DevicesHook
from crihook.hooks.devices.policy import parse_policy as devices_policy
from crihook.hooks.koordinator import KoordinatorHook
from crihook.hooks.koordinator.options import parse_options as koordinator_options
from crihook.hooks.koordinator.protocol import parse_extended_resource_spec
from crihook.hooks.koordinator.quantity import parse_quantity
from crihook.hooks.netdev import parse_policy as netdev_policy
from crihook.hooks.node import parse_cpu_list
from crihook.hooks.node.cpulist import MAX_CPU_ID
from crihook.hooks.numa import NumaHook
from crihook.hooks.oom.hook import OomHook
from crihook.hooks.oom.hook import parse_options as oom_options
from crihook.hooks.oom.policy import parse_score_override, parse_score_range
from crihook.hooks.spec import Adjustment, Event, Forbidden, InvalidRequest, Reject
from crihook.hooks.spec.adjustment import Field
from crihook.hooks.spec.views import (
    INIT_CONTAINERS_ANNOTATION,
    SIDECAR_CONTAINERS_ANNOTATION,
    container_view_from_config,
    pod_view_from_config,
)
from crihook.proxy import config as config_module
from crihook.proxy.chain.merge import Merger
from crihook.proxy.config import load_config, settings_from_toml
from crihook.proxy.cri.events import ALLOWED_FIELDS
from crihook.proxy.errors import ConfigError, HookConflict, HookInvalidAdjustment
from tests.lab.kubelet_encoding import PodSpec, container_config, sandbox_config
from tests.unit.hook_harness import SMALL, Node, burstable, guaranteed, topology_of
from tests.unit.test_devices_hook import POLICY, host

TOPO = topology_of(SMALL)
FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- strategies ------------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)

# Quantities as people mistype them, with exponents up to 12 digits long (10**999999999 was a
# denial of service before exponents were bounded).
quantity_text = st.from_regex(
    r"[+-]?[0-9]{0,5}(\.[0-9]{0,4})?([eE][+-]?[0-9]{1,12}|[KMGTPE]i|[numkMGTPE])?", fullmatch=True
) | st.text(max_size=16)

# cpulists with ids up to 4 billion (a 4-billion-id range was a denial of service).
cpu_lists = st.lists(
    st.tuples(st.integers(0, 2**32), st.integers(0, 2**32)).map(
        lambda r: f"{min(r)}-{max(r)}" if r[0] != r[1] else str(r[0])
    ),
    max_size=4,
).map(",".join) | st.text(alphabet="0123456789-, ", max_size=20)

annotation_text = st.one_of(
    json_values.map(json.dumps),
    st.text(max_size=60),
    st.just(""),
)


def _refuses(call: Callable[[], object], *errors: type[BaseException]) -> None:
    """`call()` answers, or raises one of `errors` with a message."""
    try:
        call()
    except errors as exc:
        assert str(exc), f"{type(exc).__name__} with no message"


# --- annotation parsers ------------------------------------------------------------------------


@FUZZ
@given(st.text(max_size=12) | st.integers(-(10**6), 10**6).map(str))
def test_the_oom_score_annotation_is_an_integer_in_range_or_refused(text: str) -> None:
    try:
        score = parse_score_override(text)
    except ValueError as exc:
        assert "oom.crihook.io/score-adj" in str(exc)
    else:
        assert -1000 <= score <= 1000


@FUZZ
@given(
    st.text(max_size=16)
    | st.tuples(st.integers(-2000, 2000), st.integers(-2000, 2000)).map(lambda r: f"{r[0]}..{r[1]}")
)
def test_oom_score_ranges_are_ordered_and_bounded_or_refused(text: str) -> None:
    try:
        found = parse_score_range(text)
    except ValueError as exc:
        assert str(exc)
    else:
        assert -1000 <= found.low <= found.high <= 1000


@FUZZ
@given(quantity_text)
def test_a_koordinator_quantity_is_a_number_or_refused(text: str) -> None:
    _refuses(lambda: parse_quantity(text), ValueError)


@FUZZ
@given(cpu_lists)
def test_a_cpu_list_is_bounded_or_refused(text: str) -> None:
    try:
        cpus = parse_cpu_list(text)
    except ValueError as exc:
        assert "cpu list" in str(exc)
    else:
        assert all(0 <= cpu <= MAX_CPU_ID for cpu in cpus)


resource_status = st.one_of(
    annotation_text,
    st.fixed_dictionaries(
        {},
        optional={
            "cpuset": cpu_lists | json_values,
            "numaNodeResources": st.lists(
                st.fixed_dictionaries({}, optional={"node": st.integers(-2, 9) | json_values}),
                max_size=3,
            )
            | json_values,
        },
    ).map(json.dumps),
)


@FUZZ
@given(resource_status)
def test_koordinators_resource_status_parses_or_is_refused(text: str) -> None:
    _refuses(lambda: parse_resource_status(text), ValueError)


extended_spec = st.one_of(
    annotation_text,
    st.dictionaries(
        st.sampled_from(["app", "c1", ""]),
        st.fixed_dictionaries(
            {},
            optional={
                kind: st.dictionaries(
                    st.sampled_from(["kubernetes.io/batch-cpu", "kubernetes.io/batch-memory", "x"]),
                    quantity_text | json_values,
                    max_size=3,
                )
                | json_values
                for kind in ("requests", "limits")
            },
        )
        | json_values,
        max_size=3,
    ).map(lambda containers: json.dumps({"containers": containers})),
    # A JSON number is read as a Decimal: 1E+999999999 must be refused as fast as a string.
    st.integers(0, 10**9).map(
        lambda e: f'{{"containers": {{"app": {{"limits": {{"kubernetes.io/batch-cpu": 1e{e}}}}}}}}}'
    ),
)


@FUZZ
@given(extended_spec)
def test_koordinators_extended_resource_spec_parses_or_is_refused(text: str) -> None:
    _refuses(lambda: parse_extended_resource_spec(text), ValueError)


@FUZZ
@given(annotation_text, annotation_text)
def test_init_and_sidecar_annotations_never_break_a_view(init: str, sidecar: str) -> None:
    spec = PodSpec(
        "p",
        containers=[burstable("app")],
        annotations={INIT_CONTAINERS_ANNOTATION: init, SIDECAR_CONTAINERS_ANNOTATION: sidecar},
    )
    try:
        pod = pod_view_from_config("sb", sandbox_config(spec))
        container_view_from_config(
            "", pod, container_config(spec, spec.containers[0], node_memory=1 << 34)
        )
    except (ValueError, InvalidRequest) as exc:
        assert str(exc)


# --- hook options (the config's [hooks.<name>] tables) ----------------------------------------

OPTION_PARSERS: dict[str, tuple[Callable[[Mapping[str, Any]], object], list[str]]] = {
    "cpuset": (cpuset_options, ["reserved_cpus", "policy_options", "disable_cfs_quota", "policy"]),
    "oom": (oom_options, ["override_ranges", "qos_scores"]),
    "koordinator": (koordinator_options, ["cpu_manager", "reserved_cpus", "batch_cfs_quota"]),
    "devices": (
        devices_policy,
        [
            "namespaces",
            "devices",
            "device_permissions",
            "mounts",
            "writable_mounts",
            "env",
            "pools",
        ],
    ),
    "netdev": (netdev_policy, ["namespaces", "interfaces", "parents", "max_links"]),
}


@pytest.mark.parametrize("hook", sorted(OPTION_PARSERS))
@FUZZ
@given(data=st.data())
def test_hook_options_are_read_or_refused_with_a_message(hook: str, data: st.DataObject) -> None:
    parse, keys = OPTION_PARSERS[hook]
    options = data.draw(
        st.dictionaries(st.sampled_from([*keys, "typo"]), json_values | cpu_lists, max_size=4)
    )
    _refuses(lambda: parse(options), ValueError, ConfigError)


# --- the config loader -------------------------------------------------------------------------

# The parser's own key sets (sorted: hypothesis draws from sequences), so a key added to the
# parser is fuzzed without a copy to keep up to date here.
TOP_KEYS = sorted(config_module._TOP_KEYS - {"hooks", "node", "record"})
CHAIN_KEYS = sorted(config_module._CHAIN_KEYS)
HOOK_KEYS = sorted(config_module.HOOK_KEYS)
NODE_KEYS = sorted(config_module._NODE_KEYS)
RECORD_KEYS = sorted(config_module._RECORD_KEYS)

toml_values = st.recursive(
    st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
    | st.sampled_from(
        [
            "unix:///run/x.sock",
            "/tmp/x",
            "0660",
            "cpuset",
            "50-annotate",
            "fail",
            "ignore",
            "best-effort",
            "json",
            "debug",
            "10.0.0.1:1",
        ]
    ),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def _table(keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(st.sampled_from([*keys, "typo"]), toml_values, max_size=4)


hook_tables = st.dictionaries(
    st.sampled_from(["cpuset", "oom", "50-annotate", "devices", "nope"]),
    st.builds(
        lambda a, b: {**a, **b},
        _table(HOOK_KEYS),
        st.dictionaries(
            st.sampled_from([key for _, keys in OPTION_PARSERS.values() for key in keys]),
            toml_values,
            max_size=2,
        ),
    ),
    max_size=2,
)

config_docs = st.builds(
    lambda top, chain, hooks, node, record, which: {
        **top,
        **({"hooks": {**chain, **hooks}} if "hooks" in which else {}),
        **({"node": node} if "node" in which else {}),
        **({"record": record} if "record" in which else {}),
    },
    _table(TOP_KEYS),
    _table(CHAIN_KEYS),
    hook_tables,
    _table(NODE_KEYS),
    _table(RECORD_KEYS),
    st.sets(st.sampled_from(["hooks", "node", "record"])),
) | st.dictionaries(st.text(max_size=8), toml_values, max_size=3)


@FUZZ
@given(config_docs)
def test_a_config_is_settings_or_a_config_error_naming_the_setting(doc: dict[str, Any]) -> None:
    _refuses(lambda: settings_from_toml(doc), ConfigError)


@FUZZ
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_any_config_file_is_settings_or_a_config_error(tmp_path_factory: Any, raw: bytes) -> None:
    path = Path(tmp_path_factory.mktemp("cfg")) / "config.toml"
    path.write_bytes(raw)
    try:
        tomllib.loads(raw.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        with pytest.raises(ConfigError):
            load_config(path)
        return
    _refuses(lambda: load_config(path), ConfigError)


# --- the merge -----------------------------------------------------------------------------------

small_text = st.text(
    alphabet=string.ascii_letters + string.digits + "./-_", min_size=1, max_size=12
)
keys = st.sampled_from(["a.io/k", "b.io/k", "PATH"])  # few keys: hooks meet on them


def _adjustments() -> st.SearchStrategy[Adjustment]:
    """Adjustments as the builder makes them; a builder refusing a value is itself a clear
    refusal (ValueError) and is drawn again."""
    setters: list[st.SearchStrategy[Callable[[Adjustment], object]]] = [
        st.builds(lambda v: lambda a: a.set_cpuset_cpus(v), st.sampled_from(["0", "0-3", "2,5"])),
        st.builds(lambda v: lambda a: a.set_cpu_shares(v), st.integers(0, 262144)),
        st.builds(lambda v: lambda a: a.set_cpu_quota(v), st.integers(-1, 10**6)),
        st.builds(lambda v: lambda a: a.set_memory_limit(v), st.integers(0, 2**40)),
        st.builds(lambda v: lambda a: a.set_oom_score_adj(v), st.integers(-1000, 1000)),
        st.builds(lambda k, v: lambda a: a.set_annotation(k, v), keys, small_text),
        st.builds(lambda k: lambda a: a.remove_annotation(k), keys),
        st.builds(lambda k, v: lambda a: a.set_label(k, v), keys, small_text),
        st.builds(lambda k, v: lambda a: a.set_env(k, v), keys, small_text),
        st.builds(lambda k: lambda a: a.remove_env(k), keys),
        st.builds(
            lambda p: lambda a: a.set_hugepage_limit(p, 1 << 21), st.sampled_from(["2MB", "1GB"])
        ),
        st.builds(lambda k, v: lambda a: a.set_unified(k, v), keys, small_text),
        st.builds(lambda p: lambda a: a.add_device("/dev/" + p, "/dev/" + p), small_text),
        st.builds(lambda p: lambda a: a.add_mount("/mnt/" + p, "/srv/" + p), small_text),
        st.builds(lambda p: lambda a: a.remove_mount("/mnt/" + p), small_text),
        st.builds(lambda p: lambda a: a.set_cgroup_parent("/kubepods/" + p), small_text),
    ]

    def build(steps: list[Callable[[Adjustment], object]]) -> Adjustment:
        adjustment = Adjustment()
        for step in steps:
            with contextlib.suppress(ValueError):
                step(adjustment)
        return adjustment

    return st.lists(st.one_of(setters), max_size=6).map(build)


def _request(event: Event) -> Any:
    spec = PodSpec("p", containers=[guaranteed("app", 1000)])
    sandbox = sandbox_config(spec)
    config = container_config(spec, spec.containers[0], node_memory=1 << 34)
    if event is Event.CREATE_CONTAINER:
        return api_pb2.CreateContainerRequest(
            pod_sandbox_id="sb", config=config, sandbox_config=sandbox
        )
    if event is Event.RUN_POD_SANDBOX:
        return api_pb2.RunPodSandboxRequest(config=sandbox)
    if event is Event.UPDATE_CONTAINER_RESOURCES:
        return api_pb2.UpdateContainerResourcesRequest(
            container_id="c", linux=config.linux.resources
        )
    return api_pb2.StartContainerRequest(container_id="c")


@FUZZ
@given(
    st.sampled_from(
        [
            Event.CREATE_CONTAINER,
            Event.RUN_POD_SANDBOX,
            Event.UPDATE_CONTAINER_RESOURCES,
            Event.START_CONTAINER,
        ]
    ),
    st.sampled_from(["error", "precedence"]),
    st.lists(_adjustments(), min_size=1, max_size=3),
)
def test_a_merge_applies_all_of_an_adjustment_or_none_of_it(
    event: Event, conflict: str, adjustments: list[Adjustment]
) -> None:
    request = _request(event)
    merger = Merger(event, request, conflict, ["b-hook"])
    for i, adjustment in enumerate(adjustments):
        hook = f"{10 + i}-{'ab'[i % 2]}-hook"
        before = (request.SerializeToString(deterministic=True), dict(merger.owners))
        try:
            merger.validate(hook, adjustment, post=False)
            merger.add(hook, hook[3:], adjustment)
        except (HookInvalidAdjustment, HookConflict) as exc:
            note(type(exc).__name__)
            assert str(exc)
            assert (request.SerializeToString(deterministic=True), dict(merger.owners)) == before
            continue
        allowed = ALLOWED_FIELDS[event]
        for key, _ in adjustment.change_items():
            assert key[0] in allowed
            assert key in merger.owners
    assert all(isinstance(f, Field) for f, _ in merger.owners)


# --- a refused annotation leaves the hooks' state as it was -----------------------------------

HOOK_ANNOTATIONS: dict[str, tuple[Callable[[], Any], list[str]]] = {
    "cpuset": (lambda: CpusetHook({}), ["scheduling.koordinator.sh/resource-status"]),
    "numa": (lambda: NumaHook({}), ["scheduling.koordinator.sh/resource-status"]),
    "oom": (lambda: OomHook({}), ["oom.crihook.io/score-adj"]),
    "koordinator": (
        lambda: KoordinatorHook({}),
        ["node.koordinator.sh/extended-resource-spec", "scheduling.koordinator.sh/resource-status"],
    ),
    "devices": (
        lambda: DevicesHook(POLICY, files=host()),
        [
            f"{kind}.crihook.io/{scope}"
            for kind in ("devices", "mounts", "env", "pools")
            for scope in ("pod", "container.app")
        ],
    ),
}


def _state(node: Node) -> str:
    return json.dumps(sorted(node.state.items()), sort_keys=True, default=str)


@pytest.mark.parametrize("hook", sorted(HOOK_ANNOTATIONS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_refused_annotation_changes_no_hook_state(hook: str, data: st.DataObject) -> None:
    make, keys = HOOK_ANNOTATIONS[hook]
    values = st.one_of(annotation_text, resource_status, extended_spec, quantity_text)
    annotations = data.draw(st.dictionaries(st.sampled_from(keys), values, min_size=1, max_size=3))
    labels = data.draw(
        st.fixed_dictionaries(
            {},
            optional={"koordinator.sh/qosClass": st.sampled_from(["LSE", "LSR", "LS", "BE", "?"])},
        )
    )
    app = data.draw(st.sampled_from([guaranteed("app", 1000), burstable("app")]))

    async def run() -> None:
        node = Node(make(), TOPO)
        await node.sync()
        held = PodSpec("held", namespace="ml", containers=[guaranteed("app", 1000)])
        await node.create(await node.run_pod(held, "sb0"), held.containers[0], "c0")
        spec = PodSpec(
            "p", namespace="ml", labels=labels, annotations=annotations, containers=[app]
        )
        for step in ("RunPodSandbox", "CreateContainer"):
            before = _state(node)
            try:
                if step == "RunPodSandbox":
                    pod = await node.run_pod(spec, "sb1")
                else:
                    await node.begin_create(pod, app)
            except (InvalidRequest, Reject, Forbidden) as exc:
                note(f"{step} refused")  # hypothesis statistics: the property was exercised
                assert str(exc)
                assert _state(node) == before, f"a refused {step} changed the hook's state"
                return
        note("accepted")

    asyncio.run(run())
