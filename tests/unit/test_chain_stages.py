"""The built-in hook contract in the chain: the failed and hints stages, which hooks ran, what
was not applied, exemption per hook, refusals as INVALID_ARGUMENT, and the typo guard."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.sdk import MemoryState
from crihook.hooks.spec import (
    Adjustment,
    Event,
    Hook,
    HookContext,
    InvalidRequest,
    PodView,
    Reject,
    ResourceHints,
    Stage,
    TopologyHint,
    subscriptions_of,
)
from crihook.proxy.chain.call import ChainCall
from crihook.proxy.chain.chain import Chain
from crihook.proxy.chain.local_hooks import load_local_hook
from crihook.proxy.config import HookSettings
from crihook.proxy.errors import (
    ConfigError,
    HookError,
    HookInvalidRequest,
    HookRejected,
    HookTimeout,
)
from tests.unit.test_chain import CONTAINER, POD, create_request, make_chain, make_entry

EXEMPT_POD = PodView(id="sb2", uid="u2", name="agent", namespace="kube-system")


class Reserving(Hook):
    """Reserves in pre, releases in failed; notes every stage it sees."""

    def __init__(self, log: list[tuple[str, str, str]], *, pre: Any = None, exempt: bool = True):
        super().__init__()
        self.log = log
        self.pre = pre
        self.honours_exemption = exempt
        self.name = ""

    async def pre_create_container(self, ctx: HookContext) -> Adjustment | None:
        self.log.append((self.name, "pre", ctx.pod.name))
        if isinstance(self.pre, BaseException):
            raise self.pre
        if self.pre == "sleep":
            await asyncio.sleep(30)
        return self.pre if isinstance(self.pre, Adjustment) else None

    async def failed_create_container(self, ctx: HookContext) -> None:
        self.log.append((self.name, "failed", ctx.failure))


def reserving(log: list[tuple[str, str, str]], name: str, **kw: Any) -> Any:
    settings = kw.pop("settings", {})
    hook = Reserving(log, **kw)
    hook.name = name
    return make_entry(hook, name, **settings)


async def run(chain: Chain, pod: PodView = POD, **kw: Any) -> Any:
    return await chain.pre(
        ChainCall(Event.CREATE_CONTAINER, pod, CONTAINER, create_request(), **kw)
    )


# --- which hooks ran, and the failed stage ----------------------------------------------------


async def test_ran_names_every_hook_called_even_when_the_chain_fails() -> None:
    log: list[tuple[str, str, str]] = []
    chain = make_chain(
        [
            reserving(log, "10-a", pre=Adjustment().set_annotation("a", "1")),
            reserving(log, "20-b", pre=Reject("no room")),
            reserving(log, "30-c"),
        ]
    )
    ran: list[str] = []
    with pytest.raises(HookRejected):
        await run(chain, ran=ran)
    assert ran == ["10-a", "20-b"]
    await chain.failed(
        ChainCall(Event.CREATE_CONTAINER, POD, CONTAINER, create_request(), ran=ran),
        "hook 20-b rejected",
    )
    assert log == [
        ("10-a", "pre", "web"),
        ("20-b", "pre", "web"),
        ("10-a", "failed", "hook 20-b rejected"),
        ("20-b", "failed", "hook 20-b rejected"),
    ]


async def test_failed_stage_errors_and_timeouts_are_counted_not_raised() -> None:
    class Broken(Hook):
        async def pre_create_container(self, ctx: HookContext) -> None:
            return None

        async def failed_create_container(self, ctx: HookContext) -> None:
            raise RuntimeError("cannot release")

    class Hung(Broken):
        async def failed_create_container(self, ctx: HookContext) -> None:
            await asyncio.sleep(30)

    log: list[tuple[str, str, str]] = []
    chain = make_chain(
        [
            make_entry(Broken(), "10-broken"),
            make_entry(Hung(), "20-hung", timeout_ms=50),
            reserving(log, "30-ok"),
        ]
    )
    ran = ["10-broken", "20-hung", "30-ok"]
    await chain.failed(
        ChainCall(Event.CREATE_CONTAINER, POD, CONTAINER, create_request(), ran=ran),
        "runtime said no",
    )
    counters = {e.name: e.counters for e in chain.entries}
    assert counters["10-broken"]["failed_stage_errors"] == 1
    assert counters["20-hung"]["failed_stage_errors"] == 1
    assert log == [("30-ok", "failed", "runtime said no")]


async def test_unapplied_names_dry_run_and_ignored_failures() -> None:
    log: list[tuple[str, str, str]] = []
    chain = make_chain(
        [
            reserving(
                log,
                "10-dry",
                pre=Adjustment().set_annotation("a", "1"),
                settings={"dry_run": True},
            ),
            reserving(
                log,
                "20-slow",
                pre="sleep",
                settings={"failure_policy": "ignore", "timeout_ms": 20},
            ),
            reserving(log, "30-ok", pre=Adjustment().set_annotation("c", "3")),
        ]
    )
    merger = await run(chain)
    assert sorted(merger.unapplied) == ["10-dry", "20-slow"]
    assert merger.unapplied["10-dry"].startswith("dry-run")
    assert "failure_policy=ignore" in merger.unapplied["20-slow"]
    assert [d for d, _ in merger.owners] and "30-ok" not in merger.unapplied


# --- exemption per hook -----------------------------------------------------------------------


async def test_exempt_pods_skip_only_hooks_that_honour_the_exemption() -> None:
    log: list[tuple[str, str, str]] = []
    chain = make_chain(
        [reserving(log, "10-plain"), reserving(log, "20-accounting", exempt=False)],
        exempt_namespaces=("kube-system",),
    )
    assert chain.exempt(EXEMPT_POD)
    await run(chain, EXEMPT_POD, exempt=True)
    assert log == [("20-accounting", "pre", "agent")]
    assert chain.wants(Event.CREATE_CONTAINER, Stage.PRE, exempt=True)
    assert not make_chain([reserving(log, "10-plain")]).wants(
        Event.CREATE_CONTAINER, Stage.PRE, exempt=True
    )


# --- refusals ---------------------------------------------------------------------------------


async def test_invalid_request_is_invalid_argument_whatever_the_policy() -> None:
    log: list[tuple[str, str, str]] = []
    chain = make_chain(
        [
            reserving(
                log,
                "10-a",
                pre=InvalidRequest("annotation x: 'abc' is not an integer"),
                settings={"failure_policy": "ignore"},
            )
        ]
    )
    with pytest.raises(HookInvalidRequest) as info:
        await run(chain)
    assert info.value.status == grpc.StatusCode.INVALID_ARGUMENT
    assert "10-a" in str(info.value) and "'abc' is not an integer" in str(info.value)


# --- hints ------------------------------------------------------------------------------------


class Hinting(Hook):
    def __init__(self, answer: Any) -> None:
        super().__init__()
        self.answer = answer

    async def hints_create_container(self, ctx: HookContext) -> ResourceHints | None:
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer  # type: ignore[no-any-return]

    async def pre_create_container(self, ctx: HookContext) -> None:
        return None


async def test_hints_are_collected_in_chain_order() -> None:
    cpu = {"cpu": [TopologyHint(frozenset({0}), True)]}
    memory = {"memory": None}
    chain = make_chain(
        [
            make_entry(Hinting(memory), "30-numa"),
            make_entry(Hinting(None), "25-quiet"),
            make_entry(Hinting(cpu), "20-cpuset"),
        ]
    )
    offered = await chain.hints(ChainCall(Event.CREATE_CONTAINER, POD, CONTAINER, create_request()))
    assert offered == [("20-cpuset", cpu), ("30-numa", memory)]


@pytest.mark.parametrize(
    ("answer", "policy", "raises"),
    [
        (["cpu"], "fail", HookError),
        ({"cpu": ["not a hint"]}, "fail", HookError),
        ({"cpu": ["not a hint"]}, "ignore", None),
        (TimeoutError(), "fail", HookTimeout),
        (RuntimeError("bug"), "ignore", None),
    ],
    ids=["not-a-mapping", "not-hints", "not-hints-ignored", "timeout", "bug-ignored"],
)
async def test_bad_hints_follow_the_failure_policy(
    answer: Any, policy: str, raises: type[Exception] | None
) -> None:
    chain = make_chain([make_entry(Hinting(answer), "20-h", failure_policy=policy)])
    if raises is None:
        offered = await chain.hints(
            ChainCall(Event.CREATE_CONTAINER, POD, CONTAINER, create_request())
        )
        assert offered == []
        assert chain.entries[0].counters["ignored"] == 1
    else:
        with pytest.raises(raises):
            await chain.hints(ChainCall(Event.CREATE_CONTAINER, POD, CONTAINER, create_request()))


async def test_affinity_reaches_the_pre_stage() -> None:
    seen: list[Any] = []

    class Reader(Hook):
        async def pre_create_container(self, ctx: HookContext) -> None:
            seen.append(ctx.affinity)

    chain = make_chain([make_entry(Reader(), "10-r")])
    hint = TopologyHint(frozenset({1}), True)
    await run(chain, affinity=hint)
    assert seen == [hint]


# --- the typo guard ---------------------------------------------------------------------------


class Typo(Hook):
    async def pre_create_contianer(self, ctx: HookContext) -> None:
        return None


class NotAsync(Hook):
    def post_start_container(self, ctx: HookContext) -> None:
        return None


class HintsForStart(Hook):
    async def hints_start_container(self, ctx: HookContext) -> None:
        return None


@pytest.mark.parametrize(
    ("cls", "named"),
    [
        (Typo, "pre_create_contianer"),
        (NotAsync, "post_start_container"),
        (HintsForStart, "hints_start_container"),
    ],
    ids=["typo", "not-async", "hints-where-none"],
)
def test_a_method_named_like_a_stage_that_is_none_is_a_load_error(
    cls: type[Hook], named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        subscriptions_of(cls())
    settings = HookSettings(name="10-typo", module=f"{__name__}:{cls.__name__}")
    with pytest.raises(ConfigError) as info:
        load_local_hook(settings)
    assert named in str(info.value) and "[hooks.typo]" in str(info.value)


def test_builtin_hooks_load_by_bare_name_with_their_stages() -> None:
    hook = load_local_hook(HookSettings(name="20-cpuset"))
    assert hook.honours_exemption is False
    assert (Event.CREATE_CONTAINER, Stage.HINTS) in hook.subscriptions()
    assert (Event.CREATE_CONTAINER, Stage.FAILED) in hook.subscriptions()
    oom = load_local_hook(HookSettings(name="40-oom"))
    assert oom.honours_exemption is True


def test_unknown_builtin_name_lists_the_builtin_ones() -> None:
    with pytest.raises(ConfigError) as info:
        load_local_hook(HookSettings(name="20-cpusets"))
    assert "cpuset" in str(info.value) and "numa" in str(info.value)


def test_failed_stage_context_carries_the_failure_and_a_copy_of_the_request() -> None:
    request = api_pb2.CreateContainerRequest(pod_sandbox_id="x")
    ctx = HookContext(
        Event.CREATE_CONTAINER,
        Stage.FAILED,
        POD,
        CONTAINER,
        request,
        None,
        MemoryState(),
        1.0,
        failure="why",
    )
    ctx.request.pod_sandbox_id = "changed"  # type: ignore[attr-defined]
    assert request.pod_sandbox_id == "x" and ctx.failure == "why"
