"""Hook permissions, validators and required hooks in the chain."""

from __future__ import annotations

import asyncio
import fnmatch
import re
from typing import Any

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.spec import (
    Adjustment,
    ContainerUpdate,
    Event,
    Field,
    Hook,
    HookContext,
    PodView,
    Reject,
    ResourceDelta,
    Stage,
)
from crihook.proxy.chain.call import ChainCall
from crihook.proxy.chain.chain import Chain
from crihook.proxy.chain.permissions import _DECIDED_MAX, Permissions
from crihook.proxy.config import HookSettings
from crihook.proxy.errors import (
    HookInvalidAdjustment,
    HookNotPermitted,
    HookRejected,
    HookRequired,
)
from crihook.proxy.grants import DEFAULT_GRANTS, parse_grants
from tests.unit.test_chain import CONTAINER, POD, create_request, make_chain, make_entry


class Returns(Hook):
    """Answers pre-CreateContainer with a fixed adjustment (or raises it)."""

    def __init__(self, answer: Any, sets: tuple[str, ...] | None = None) -> None:
        super().__init__()
        self.answer = answer
        self.sets = sets

    async def pre_create_container(self, ctx: HookContext) -> Adjustment | None:
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer  # type: ignore[no-any-return]


async def run(chain: Chain, pod: PodView = POD, exempt: bool = False) -> Any:
    return await chain.pre(
        ChainCall(Event.CREATE_CONTAINER, pod, CONTAINER, create_request(), exempt=exempt)
    )


# --- grants -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("adjustment", "allow", "denied"),
    [
        (Adjustment().add_device("/dev/fuse", "/dev/fuse"), None, ["device '/dev/fuse'"]),
        (Adjustment().add_mount("/data", "/srv"), None, ["mount '/data'"]),
        (Adjustment().set_env("X", "1"), None, ["env 'X'"]),
        (Adjustment().set_cgroup_parent("/x"), None, ["cgroup_parent"]),
        (Adjustment().set_cpuset_cpus("1").set_annotation("a/b", "c"), None, []),
        (
            Adjustment().set_annotation("other.io/x", "1").set_annotation("example.com/y", "1"),
            ["annotation:example.com/*"],
            ["annotation 'other.io/x'"],
        ),
        (Adjustment().add_device("/dev/fuse", "/dev/fuse"), ["device:/dev/fuse"], []),
        (
            Adjustment().add_device("/dev/kvm", "/dev/kvm"),
            ["device:/dev/fuse"],
            ["device '/dev/kvm'"],
        ),
        (
            Adjustment().update_container("c2", ResourceDelta(cpuset_cpus="1", cpu_shares=2)),
            ["cpuset_cpus"],
            ["cpu_shares of container c2 (an update)"],
        ),
    ],
    ids=[
        "device-needs-a-grant",
        "mount-needs-a-grant",
        "env-needs-a-grant",
        "cgroup-parent-needs-a-grant",
        "defaults-allow-resources-and-annotations",
        "annotation-narrowed",
        "device-granted",
        "other-device",
        "updates-need-their-fields",
    ],
)
def test_what_a_hook_may_set(
    adjustment: Adjustment, allow: list[str] | None, denied: list[str]
) -> None:
    layers = [DEFAULT_GRANTS] if allow is None else [parse_grants(allow, "test")]
    assert list(Permissions(tuple(layers)).denied(adjustment)) == denied


_LAYERED = Permissions(
    (
        parse_grants(["annotation:a*", "annotation:*b", "device", "env:X*", "cpuset_cpus"], "t"),
        parse_grants(["annotation:*b*", "device:/dev/a*", "env", "cpuset_cpus"], "t"),
    )
)
_FIELDS_NAMED = [Field.ANNOTATION, Field.DEVICE, Field.ENV, Field.LABEL, Field.CPUSET_CPUS]


@settings(max_examples=150, deadline=None)
@given(
    keys=st.lists(
        st.tuples(st.sampled_from(_FIELDS_NAMED), st.from_regex(r"[/abdevX]{0,5}", fullmatch=True)),
        max_size=12,
    )
)
def test_a_remembered_answer_is_the_one_the_layers_give(keys: list[tuple[Field, str]]) -> None:
    # Permissions remembers what it decided per key: asked again (and in another order), it
    # answers what every layer's globs say.
    for key in [*keys, *reversed(keys)]:
        assert _LAYERED.allows(key) is all(g.allows(key) for g in _LAYERED.layers)


def test_remembered_answers_are_bounded() -> None:
    permissions = Permissions((parse_grants(["annotation:a*"], "t"),))
    for i in range(_DECIDED_MAX + 10):
        assert permissions.allows((Field.ANNOTATION, f"a{i}"))
        assert not permissions.allows((Field.ANNOTATION, f"b{i}"))
    assert 0 < len(permissions._decided) <= _DECIDED_MAX
    assert permissions.allows((Field.ANNOTATION, "a0"))  # forgotten, decided again the same
    assert not permissions.allows((Field.ANNOTATION, "b0"))


async def test_a_denied_field_fails_the_call_under_fail_naming_hook_and_field() -> None:
    chain = make_chain(
        [make_entry(Returns(Adjustment().add_device("/dev/mem", "/dev/mem")), "50-p")]
    )
    with pytest.raises(HookNotPermitted) as info:
        await run(chain)
    assert info.value.status == grpc.StatusCode.PERMISSION_DENIED
    assert "'50-p'" in str(info.value) and "device '/dev/mem'" in str(info.value)
    counters = chain.entries[0].counters
    assert (counters["not_permitted"], counters["failures"]) == (1, 1)


async def test_under_ignore_the_whole_adjustment_is_dropped_and_audited() -> None:
    answer = Adjustment().set_annotation("a/b", "fine").set_env("SECRET", "x")
    chain = make_chain([make_entry(Returns(answer), "50-p", failure_policy="ignore")])
    merger = await run(chain)
    assert not merger.changed  # nothing of it, not even the allowed annotation
    assert merger.refused == [{"hook": "50-p", "fields": ["env 'SECRET'"]}]
    assert "50-p" in merger.unapplied
    assert chain.entries[0].counters["not_permitted"] == 1


@pytest.mark.parametrize("policy", ["fail", "ignore"])
async def test_the_trace_keeps_what_the_chain_refused(policy: str) -> None:
    """A recording keeps the refused adjustment next to the verdict: a replay standing in
    for a plugin asks the chain the same, and the chain refuses it again."""
    answer = Adjustment().set_env("SECRET", "x")
    chain = make_chain([make_entry(Returns(answer), "50-p", failure_policy=policy)])
    trace: list[Any] = []
    call = chain.pre(
        ChainCall(Event.CREATE_CONTAINER, POD, CONTAINER, create_request(), trace=trace)
    )
    if policy == "fail":
        with pytest.raises(HookNotPermitted):
            await call
    else:
        await call
    ((hook, stage, verdict, detail, refused, _),) = trace
    expected = "failed" if policy == "fail" else "ignored"
    assert (hook, stage, verdict) == ("50-p", Stage.PRE, expected)
    assert "may not set env 'SECRET'" in detail
    assert refused is answer


async def test_a_declared_hook_is_narrowed_by_allow_never_widened() -> None:
    declared = ("cpuset_cpus", "annotation")
    wide = Adjustment().set_cpuset_cpus("1").set_annotation("other.io/x", "1")
    chain = make_chain(
        [make_entry(Returns(wide, sets=declared), "20-b", allow=("cpuset_cpus", "annotation:a/*"))]
    )
    with pytest.raises(HookNotPermitted, match=re.escape("annotation 'other.io/x'")):
        await run(chain)
    # allow cannot give what the hook does not declare
    mem = Adjustment().set_cpuset_mems("0")
    chain = make_chain([make_entry(Returns(mem, sets=declared), "20-b", allow=("cpuset_mems",))])
    with pytest.raises(HookNotPermitted, match="cpuset_mems"):
        await run(chain)


_SCALAR = [
    lambda a, v: a.set_cpuset_cpus(str(v)),
    lambda a, v: a.set_cpu_shares(v + 2),
    lambda a, v: a.set_oom_score_adj(v % 1000),
    lambda a, v: a.set_memory_limit(v << 20),
]
_KEYED = [
    lambda a, k: a.set_annotation(f"{k}.io/x", "1"),
    lambda a, k: a.set_label(f"{k}", "1"),
    lambda a, k: a.add_device(f"/dev/{k}", f"/dev/{k}"),
    lambda a, k: a.add_mount(f"/{k}", f"/srv/{k}"),
    lambda a, k: a.set_env(k.upper(), "v"),
]
_GRANTS = [
    "cpuset_cpus",
    "cpu_shares",
    "oom_score_adj",
    "memory_limit_in_bytes",
    "annotation",
    "annotation:a*",
    "label",
    "device",
    "device:/dev/a*",
    "mount:/b*",
    "env",
]


@settings(max_examples=150, deadline=None)
@given(
    scalars=st.lists(st.tuples(st.integers(0, len(_SCALAR) - 1), st.integers(0, 99)), max_size=3),
    keyed=st.lists(
        st.tuples(
            st.integers(0, len(_KEYED) - 1), st.from_regex(r"[a-c][a-z]{0,3}", fullmatch=True)
        ),
        max_size=4,
    ),
    allow=st.one_of(st.none(), st.lists(st.sampled_from(_GRANTS), max_size=6)),
)
def test_no_adjustment_reaches_the_request_outside_its_grant(
    scalars: list[tuple[int, int]], keyed: list[tuple[int, str]], allow: list[str] | None
) -> None:
    adjustment = Adjustment()
    for i, v in scalars:
        _SCALAR[i](adjustment, v)
    for i, k in keyed:
        _KEYED[i](adjustment, k)
    settings_kw = {} if allow is None else {"allow": tuple(allow)}
    chain = make_chain([make_entry(Returns(adjustment), "50-p", **settings_kw)])
    expected_ok = all(_granted(key, allow) for key, _ in adjustment.change_items())
    try:
        merger = asyncio.run(run(chain))
    except HookNotPermitted:
        assert not expected_ok
        return
    assert expected_ok
    assert all(_granted(key, allow) for key in merger.owners)


def _granted(key: tuple[Field, str], allow: list[str] | None) -> bool:
    """The rule, restated independently of proxy.chain.permissions: without `allow` labels,
    annotations and resources; with it, exactly what it lists (globs on keys)."""
    field, name = key
    if allow is None:
        return field in (Field.LABEL, Field.ANNOTATION) or field.value in _RESOURCES
    for grant in allow:
        granted, _, pattern = grant.partition(":")
        if granted == field.value and (not pattern or fnmatch.fnmatchcase(name, pattern)):
            return True
    return False


_RESOURCES = {
    "cpuset_cpus", "cpuset_mems", "cpu_shares", "cpu_quota", "cpu_period",
    "memory_limit_in_bytes", "memory_swap_limit_in_bytes", "hugepage_limit", "unified",
    "oom_score_adj",
}  # fmt: skip


async def test_allow_grants_a_plugin_what_the_defaults_do_not() -> None:
    fuse = Adjustment().add_device("/dev/fuse", "/dev/fuse").set_env("FUSE", "1")
    chain = make_chain([make_entry(Returns(fuse), "50-p", allow=("device:/dev/fuse", "env"))])
    merger = await run(chain)
    assert merger.owners and set(merger.owners.values()) == {"50-p"}
    # and `allow` replaces the defaults: annotations are no longer granted
    chain = make_chain(
        [make_entry(Returns(Adjustment().set_annotation("a/b", "1")), "50-p", allow=("env",))]
    )
    with pytest.raises(HookNotPermitted, match="annotation 'a/b'"):
        await run(chain)


# --- validators -------------------------------------------------------------------------------


class Validator(Hook):
    def __init__(self, seen: list[dict[str, str]]) -> None:
        super().__init__()
        self.seen = seen

    async def validate_create_container(self, ctx: HookContext) -> None:
        self.seen.append(dict(ctx.owners))
        if ctx.request.config.annotations.get("a/b") == "evil":  # type: ignore[attr-defined]
            raise Reject(f"a/b=evil set by {ctx.owners['annotation ' + repr('a/b')]}")


async def test_a_validator_sees_the_final_request_and_owners_and_may_refuse() -> None:
    seen: list[dict[str, str]] = []
    setter = make_entry(Returns(Adjustment().set_annotation("a/b", "evil")), "10-setter")
    chain = make_chain([setter, make_entry(Validator(seen), "90-guard")])
    request = create_request()
    call = ChainCall(Event.CREATE_CONTAINER, POD, CONTAINER, request)
    merger = await chain.pre(call)
    with pytest.raises(HookRejected) as info:
        await chain.validate(call, merger)
    assert seen == [{"annotation 'a/b'": "10-setter"}]
    assert "'90-guard'" in str(info.value) and "set by 10-setter" in str(info.value)


# --- required hooks ---------------------------------------------------------------------------


class Down(Returns):
    """A plugin that is down: calls fail with ConnectionError."""

    connected = False


@pytest.mark.parametrize("policy", ["fail", "ignore"])
async def test_a_required_hook_that_fails_fails_the_call_whatever_its_policy(policy: str) -> None:
    entry = make_entry(
        Returns(ConnectionError("plugin not connected")), "50-p", failure_policy=policy
    )
    chain = make_chain([entry], required_hooks=("p",))
    with pytest.raises(HookRequired) as info:
        await run(chain)
    assert info.value.status == grpc.StatusCode.FAILED_PRECONDITION
    assert "'50-p' is required by the configuration" in str(info.value)


async def test_a_pod_may_require_hooks_but_not_exempt_itself_from_required_ones() -> None:
    annotated = PodView(
        id="sb1",
        uid="u1",
        name="web",
        namespace="kube-system",
        annotations={"hooks.crihook.io/required": "p"},
    )
    entry = make_entry(Returns(Adjustment().set_annotation("x/y", "1")), "50-p")
    # Exempt (kube-system) but asking for p: refused, p would not run.
    chain = make_chain([entry], exempt_namespaces=("kube-system",))
    with pytest.raises(HookRequired, match="the pod is exempt"):
        await run(chain, annotated, exempt=True)
    # Required by the configuration: it runs for the exempt pod too.
    entry = make_entry(Returns(Adjustment().set_annotation("x/y", "1")), "50-p")
    chain = make_chain([entry], exempt_namespaces=("kube-system",), required_hooks=("p",))
    merger = await run(chain, POD, exempt=True)
    assert merger.changed
    # A required hook that is not in the chain.
    chain = make_chain([], required_hooks=("missing",))
    with pytest.raises(HookRequired, match="missing"):
        await run(chain)


async def test_a_required_hook_that_is_disabled_fails_the_call() -> None:
    entry = make_entry(Returns(None), "50-p", enabled=False)
    chain = make_chain([entry], required_hooks=("p",))
    with pytest.raises(HookRequired, match="disabled"):
        await run(chain)


def test_hook_settings_carry_allow() -> None:
    assert HookSettings(name="10-a", allow=("env",)).allow == ("env",)
    assert Field.ENV.value == "env"


async def test_teardown_is_never_refused_for_a_required_hook() -> None:
    down = make_entry(Returns(ConnectionError("plugin not connected")), "50-p")
    for chain in (
        make_chain([], required_hooks=("missing",)),
        make_chain([down], required_hooks=("p",)),
    ):
        assert chain.requires(Event.CREATE_CONTAINER, POD)
        assert not chain.requires(Event.STOP_CONTAINER, POD)
        request = api_pb2.StopContainerRequest(container_id="c1")
        merger = await chain.pre(ChainCall(Event.STOP_CONTAINER, POD, CONTAINER, request))
        assert not merger.changed


def test_synchronize_repairs_outside_the_grant_are_dropped_and_counted() -> None:
    shares = [ContainerUpdate("c1", ResourceDelta(cpu_shares=2))]
    quota = [ContainerUpdate("c2", ResourceDelta(cpu_quota=0)), *shares]
    chain = make_chain([make_entry(Returns(None), "50-p", allow=("cpu_shares",))])
    assert chain.permitted_updates("50-p", shares) == shares
    assert chain.permitted_updates("50-p", quota) == ()
    assert chain.entries[0].counters["not_permitted"] == 1


async def test_a_hooks_own_exception_is_named_and_its_traceback_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    chain = make_chain([make_entry(Returns(KeyError("gpu")), "50-p", failure_policy="ignore")])
    with caplog.at_level("DEBUG", logger="crihook.proxy.chain.chain"):
        for _ in range(3):
            merger = await run(chain)
    assert "pre_create_container raised KeyError: 'gpu'" in merger.unapplied["50-p"]
    raised = [r for r in caplog.records if r.getMessage().startswith("hook 50-p: pre_")]
    assert [r.levelname for r in raised] == ["WARNING", "DEBUG", "DEBUG"]
    assert raised[0].exc_info and not raised[1].exc_info
    # a ValueError (what Adjustment's setters raise) is still a bad adjustment, and named
    chain = make_chain([make_entry(Returns(ValueError("cpuset 'x'")), "50-p")])
    with pytest.raises(HookInvalidAdjustment, match="raised ValueError: cpuset 'x'"):
        await run(chain)
