"""The hook chain with small in-process hooks: order, policy, timeouts, breaker, dry-run."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import grpc
import pytest

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.spec import (
    Adjustment,
    ContainerView,
    Event,
    Hook,
    HookContext,
    PodView,
    Reject,
    ResourceDelta,
    Stage,
)
from crihook.proxy.chain.breaker import BreakerRecord
from crihook.proxy.chain.call import ChainCall
from crihook.proxy.chain.chain import Chain, ChainEntry, is_exempt
from crihook.proxy.chain.local_hooks import LocalHook
from crihook.proxy.chain.merge import Merger
from crihook.proxy.config import ChainSettings, HookSettings
from crihook.proxy.errors import (
    HookConflict,
    HookError,
    HookInvalidAdjustment,
    HookRejected,
    HookTimeout,
    HookUnavailable,
)
from crihook.proxy.state.hook_state import HookStateStore

DEFAULT_PERMISSIONS = [
    "annotation",
    "cpu_period",
    "cpu_quota",
    "cpu_shares",
    "cpuset_cpus",
    "cpuset_mems",
    "hugepage_limit",
    "label",
    "memory_limit_in_bytes",
    "memory_swap_limit_in_bytes",
    "oom_score_adj",
    "unified",
]
POD = PodView(id="sb1", uid="u1", name="web", namespace="shop", labels={"app": "web"})
CONTAINER = ContainerView(id="", pod_id="sb1", name="app")

Answer = Callable[[HookContext], Awaitable[Any]]


async def no_change(ctx: HookContext) -> Any:
    return None


class Probe(Hook):
    """Handles pre-CreateContainer: records the call and answers with `answer`."""

    def __init__(self, name: str, calls: list[str], answer: Answer = no_change) -> None:
        super().__init__()
        self.name = name
        self.calls = calls
        self.answer = answer
        self.closed = False

    async def pre_create_container(self, ctx: HookContext) -> Any:
        self.calls.append(self.name)
        return await self.answer(ctx)

    async def close(self) -> None:
        self.closed = True


def make_entry(impl: Hook, name: str, **settings: Any) -> ChainEntry:
    return Chain.entry(LocalHook(name, impl), HookSettings(name=name, **settings))


def make_chain(entries: list[ChainEntry], **settings: Any) -> Chain:
    states: dict[str, HookStateStore] = {}

    def state_for(name: str) -> HookStateStore:
        return states.setdefault(name, HookStateStore(name, {}, lambda _: None))

    chain = Chain(ChainSettings(**settings), state_for)
    chain.set_builtin(entries)
    return chain


def create_request() -> api_pb2.CreateContainerRequest:
    return api_pb2.CreateContainerRequest(
        pod_sandbox_id="sb1",
        config=api_pb2.ContainerConfig(
            metadata=api_pb2.ContainerMetadata(name="app"),
            annotations={"k": "orig"},
            linux=api_pb2.LinuxContainerConfig(
                resources=api_pb2.LinuxContainerResources(cpu_shares=256)
            ),
        ),
    )


async def run_create(
    chain: Chain,
    request: api_pb2.CreateContainerRequest | None = None,
    deadline: float | None = None,
) -> Merger:
    request = request if request is not None else create_request()
    call = ChainCall(Event.CREATE_CONTAINER, POD, CONTAINER, request, deadline=deadline)
    return cast(Merger, await chain.pre(call))  # the Merger itself: its owners are read


def annotate(key: str, value: str) -> Answer:
    async def answer(ctx: HookContext) -> Adjustment:
        return Adjustment().set_annotation(key, value)

    return answer


def raising(exc: BaseException) -> Answer:
    async def answer(ctx: HookContext) -> Any:
        raise exc

    return answer


async def sleep_long(ctx: HookContext) -> Any:
    await asyncio.sleep(30)


def sleep_noting_cancel(cancelled: list[bool], entered: asyncio.Event | None = None) -> Answer:
    """Sleeps long; notes in `cancelled` when it is cancelled."""

    async def answer(ctx: HookContext) -> None:
        if entered is not None:
            entered.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    return answer


# --- order and what each hook sees --------------------------------------------------------


async def test_hooks_run_in_nn_then_name_order() -> None:
    calls: list[str] = []
    names = ["20-b", "10-z", "10-a", "05-q", "99-a0"]
    chain = make_chain([make_entry(Probe(n, calls), n) for n in names])
    assert [e.name for e in chain.entries] == ["05-q", "10-a", "10-z", "20-b", "99-a0"]
    await run_create(chain)
    assert calls == ["05-q", "10-a", "10-z", "20-b", "99-a0"]


async def test_builtin_and_plugins_are_ordered_together() -> None:
    calls: list[str] = []
    chain = make_chain([make_entry(Probe("30-c", calls), "30-c")])
    chain.set_plugins(
        [make_entry(Probe("10-a", calls), "10-a"), make_entry(Probe("40-d", calls), "40-d")]
    )
    await run_create(chain)
    assert calls == ["10-a", "30-c", "40-d"]


async def test_each_hook_sees_the_request_as_adjusted_so_far() -> None:
    calls: list[str] = []
    seen: dict[str, dict[str, str]] = {}

    def recorder(name: str, key: str) -> Answer:
        async def answer(ctx: HookContext) -> Adjustment:
            seen[name] = dict(ctx.request.config.annotations)  # type: ignore[attr-defined]
            return Adjustment().set_annotation(key, name)

        return answer

    chain = make_chain(
        [
            make_entry(Probe("10-a", calls, recorder("10-a", "a")), "10-a"),
            make_entry(Probe("20-b", calls, recorder("20-b", "b")), "20-b"),
            make_entry(Probe("30-c", calls, recorder("30-c", "c")), "30-c"),
        ]
    )
    request = create_request()
    merger = await run_create(chain, request)
    assert seen == {
        "10-a": {"k": "orig"},
        "20-b": {"k": "orig", "a": "10-a"},
        "30-c": {"k": "orig", "a": "10-a", "b": "20-b"},
    }
    assert dict(request.config.annotations) == {"k": "orig", "a": "10-a", "b": "20-b", "c": "30-c"}
    assert merger.request is request


async def test_a_hook_editing_its_request_copy_changes_nothing() -> None:
    async def vandal(ctx: HookContext) -> None:
        ctx.request.config.annotations["evil"] = "1"  # type: ignore[attr-defined]

    seen: list[dict[str, str]] = []

    async def reader(ctx: HookContext) -> None:
        seen.append(dict(ctx.request.config.annotations))  # type: ignore[attr-defined]

    calls: list[str] = []
    chain = make_chain(
        [
            make_entry(Probe("10-a", calls, vandal), "10-a"),
            make_entry(Probe("20-b", calls, reader), "20-b"),
        ]
    )
    request = create_request()
    merger = await run_create(chain, request)
    assert dict(request.config.annotations) == {"k": "orig"}
    assert seen == [{"k": "orig"}]
    assert not merger.changed


class PreCreateAndPostStart(Hook):
    def __init__(self, calls: list[tuple[Event, Stage]]) -> None:
        super().__init__()
        self.calls = calls

    async def pre_create_container(self, ctx: HookContext) -> None:
        self.calls.append((ctx.event, ctx.stage))

    async def post_start_container(self, ctx: HookContext) -> None:
        self.calls.append((ctx.event, ctx.stage))

    def helper_not_a_stage(self) -> None:  # not named like a stage: not a subscription
        raise AssertionError("never called")


async def test_subscriptions_follow_implemented_methods() -> None:
    calls: list[tuple[Event, Stage]] = []
    entry = make_entry(PreCreateAndPostStart(calls), "10-a")
    chain = make_chain([entry])
    assert entry.hook.subscriptions() == {
        (Event.CREATE_CONTAINER, Stage.PRE),
        (Event.START_CONTAINER, Stage.POST),
    }
    assert chain.wants(Event.CREATE_CONTAINER, Stage.PRE)
    assert chain.wants(Event.START_CONTAINER, Stage.POST)
    assert not chain.wants(Event.CREATE_CONTAINER, Stage.POST)
    assert not chain.wants(Event.REMOVE_CONTAINER, Stage.PRE)
    start = api_pb2.StartContainerRequest(container_id="c1")
    for event, stage in [
        (Event.START_CONTAINER, Stage.PRE),
        (Event.REMOVE_CONTAINER, Stage.PRE),
        (Event.START_CONTAINER, Stage.POST),
        (Event.CREATE_CONTAINER, Stage.PRE),
    ]:
        call = ChainCall(event, POD, CONTAINER, start)
        if stage is Stage.PRE:
            await chain.pre(call)
        else:
            await chain.post(call, api_pb2.StartContainerResponse())
    assert calls == [
        (Event.START_CONTAINER, Stage.POST),
        (Event.CREATE_CONTAINER, Stage.PRE),
    ]
    assert chain.status()[0]["subscriptions"] == ["post-StartContainer", "pre-CreateContainer"]


async def test_disabled_hook_is_not_called() -> None:
    calls: list[str] = []
    chain = make_chain(
        [
            make_entry(Probe("10-a", calls), "10-a", enabled=False),
            make_entry(Probe("20-b", calls), "20-b"),
        ]
    )
    await run_create(chain)
    assert calls == ["20-b"]


def test_a_base_name_used_twice_is_refused() -> None:
    calls: list[str] = []
    with pytest.raises(ValueError, match=r"used twice: a$"):
        make_chain([make_entry(Probe("x", calls), "10-a"), make_entry(Probe("y", calls), "20-a")])


async def test_conflict_between_hooks_fails_the_run() -> None:
    calls: list[str] = []
    chain = make_chain(
        [
            make_entry(Probe("10-a", calls, annotate("x", "a")), "10-a"),
            make_entry(Probe("20-b", calls, annotate("x", "b")), "20-b"),
        ]
    )
    with pytest.raises(HookConflict) as info:
        await run_create(chain)
    assert (info.value.owner, info.value.other) == ("10-a", "20-b")


async def test_precedence_setting_decides_a_conflict() -> None:
    calls: list[str] = []
    chain = make_chain(
        [
            make_entry(Probe("10-a", calls, annotate("x", "a")), "10-a"),
            make_entry(Probe("20-b", calls, annotate("x", "b")), "20-b"),
        ],
        conflict="precedence",
        precedence=("b", "a"),
    )
    request = create_request()
    await run_create(chain, request)
    assert request.config.annotations["x"] == "b"


# --- failures: timeouts, exceptions, refusals, bad answers ---------------------------------


async def test_timeout_with_fail_policy_raises_hook_timeout_and_cancels_the_hook() -> None:
    cancelled: list[bool] = []
    calls: list[str] = []
    slow = sleep_noting_cancel(cancelled)
    entry = make_entry(Probe("10-slow", calls, slow), "10-slow", timeout_ms=20)
    chain = make_chain([entry])
    with pytest.raises(HookTimeout) as info:
        await run_create(chain)
    assert info.value.hook == "10-slow"
    assert "10-slow" in str(info.value)
    assert cancelled == [True]
    assert entry.counters["failures"] == 1
    # Its own timeout, with kubelet's deadline far off: not DEADLINE_EXCEEDED, which would
    # say kubelet's deadline passed.
    assert info.value.status == grpc.StatusCode.UNAVAILABLE
    assert "within 20 ms" in str(info.value)


async def test_a_hook_timing_out_on_what_is_left_of_kubelets_deadline_is_deadline_exceeded() -> (
    None
):
    calls: list[str] = []
    entry = make_entry(Probe("10-slow", calls, sleep_long), "10-slow", timeout_ms=60_000)
    chain = make_chain([entry])
    with pytest.raises(HookTimeout) as info:
        await run_create(chain, deadline=time.monotonic() + 0.1)
    assert info.value.status == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "what was left of kubelet's deadline" in str(info.value)
    # Far off, the hook's own timeout decides, and says so.
    short = make_chain([make_entry(Probe("10-s", calls, sleep_long), "10-s", timeout_ms=30)])
    with pytest.raises(HookTimeout) as info:
        await run_create(short, deadline=time.monotonic() + 120)
    assert info.value.status == grpc.StatusCode.UNAVAILABLE


async def test_timeout_with_ignore_policy_is_skipped_and_counted() -> None:
    calls: list[str] = []
    slow = make_entry(
        Probe("10-slow", calls, sleep_long), "10-slow", timeout_ms=20, failure_policy="ignore"
    )
    after = make_entry(Probe("20-b", calls, annotate("b", "1")), "20-b")
    chain = make_chain([slow, after])
    request = create_request()
    merger = await run_create(chain, request)
    assert calls == ["10-slow", "20-b"]
    assert dict(request.config.annotations) == {"k": "orig", "b": "1"}
    assert list(merger.owners.values()) == ["20-b"]
    assert (slow.counters["calls"], slow.counters["failures"], slow.counters["ignored"]) == (
        1,
        1,
        1,
    )


async def test_a_hook_that_waits_is_resumed_with_what_it_awaited() -> None:
    loop = asyncio.get_running_loop()

    async def waits(ctx: HookContext) -> Adjustment:
        await asyncio.sleep(0)  # a bare yield
        ready = loop.create_future()
        loop.call_soon(ready.set_result, "v1")
        value = await ready
        failing = loop.create_future()
        loop.call_soon(failing.set_exception, LookupError("gone"))
        try:
            await failing
        except LookupError as exc:
            value += f"-{exc}"
        return Adjustment().set_annotation("waited", value)

    calls: list[str] = []
    chain = make_chain([make_entry(Probe("10-w", calls, waits), "10-w", timeout_ms=2000)])
    request = create_request()
    await run_create(chain, request)
    assert request.config.annotations["waited"] == "v1-gone"


async def test_a_hook_that_blocks_before_it_waits_still_times_out() -> None:
    async def busy_then_wait(ctx: HookContext) -> None:
        time.sleep(0.05)  # blocking on purpose: the budget (20 ms) is gone before it waits
        await asyncio.sleep(3600)  # never over, unless the chain's budget ends it

    calls: list[str] = []
    chain = make_chain(
        [make_entry(Probe("10-busy", calls, busy_then_wait), "10-busy", timeout_ms=20)]
    )
    with pytest.raises(HookTimeout):
        await run_create(chain)


async def test_cancelling_the_call_cancels_a_waiting_hook_without_a_verdict() -> None:
    entered = asyncio.Event()
    cancelled: list[bool] = []
    calls: list[str] = []
    waits = sleep_noting_cancel(cancelled, entered)
    entry = make_entry(Probe("10-w", calls, waits), "10-w", timeout_ms=60_000)
    task = asyncio.create_task(run_create(make_chain([entry])))
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled == [True]
    assert entry.counters["failures"] == 0 and entry.breaker.state == "closed"


class SelfBounded(LocalHook):
    """A hook that ends its own calls at ctx.timeout (as a plugin does)."""

    bounds_own_calls = True


async def test_a_hook_that_bounds_its_own_calls_gets_no_second_timer() -> None:
    async def late(ctx: HookContext) -> Adjustment:
        await asyncio.sleep(0.1)  # past the configured 20 ms: only its own bound applies
        return Adjustment().set_annotation("late", "ok")

    calls: list[str] = []
    entry = Chain.entry(
        SelfBounded("10-own", Probe("10-own", calls, late)),
        HookSettings(name="10-own", timeout_ms=20),
    )
    assert entry.bounds_own_calls
    request = create_request()
    await run_create(make_chain([entry]), request)
    assert request.config.annotations["late"] == "ok"


@pytest.mark.parametrize(
    ("exc", "error_type", "text"),
    [
        (RuntimeError("boom"), HookError, "RuntimeError: boom"),
        (KeyError("k"), HookError, "KeyError"),
        (ConnectionRefusedError("refused"), HookUnavailable, "refused"),
        (ValueError("bad cpus"), HookInvalidAdjustment, "bad cpus"),
    ],
    ids=["runtime-error", "key-error", "connection-error", "value-error"],
)
async def test_exception_with_fail_policy_names_the_hook(
    exc: Exception, error_type: type[HookError], text: str
) -> None:
    calls: list[str] = []
    chain = make_chain([make_entry(Probe("10-bug", calls, raising(exc)), "10-bug")])
    with pytest.raises(HookError) as info:
        await run_create(chain)
    assert type(info.value) is error_type
    assert info.value.hook == "10-bug"
    assert str(info.value).startswith("hook '10-bug'")
    assert text in str(info.value)


async def test_exception_with_ignore_policy_goes_on_without_the_hook() -> None:
    calls: list[str] = []
    bug = make_entry(
        Probe("10-bug", calls, raising(RuntimeError("boom"))), "10-bug", failure_policy="ignore"
    )
    chain = make_chain([bug, make_entry(Probe("20-b", calls, annotate("b", "1")), "20-b")])
    request = create_request()
    await run_create(chain, request)
    assert calls == ["10-bug", "20-b"]
    assert request.config.annotations["b"] == "1"
    assert (bug.counters["failures"], bug.counters["ignored"]) == (1, 1)


@pytest.mark.parametrize("policy", ["fail", "ignore"])
async def test_reject_fails_the_call_whatever_the_policy(policy: str) -> None:
    calls: list[str] = []
    entry = make_entry(
        Probe("10-no", calls, raising(Reject("bad annotation"))), "10-no", failure_policy=policy
    )
    chain = make_chain([entry, make_entry(Probe("20-b", calls), "20-b")])
    with pytest.raises(HookRejected) as info:
        await run_create(chain)
    assert info.value.hook == "10-no"
    assert "bad annotation" in str(info.value)
    assert calls == ["10-no"]
    assert entry.counters["rejected"] == 1
    assert entry.counters["failures"] == 0


@pytest.mark.parametrize(
    "answer",
    [{"cpuset_cpus": "1"}, "cpuset=1", 42],
    ids=["dict", "str", "int"],
)
async def test_returning_a_non_adjustment_is_invalid(answer: object) -> None:
    async def wrong(ctx: HookContext) -> object:
        return answer

    calls: list[str] = []
    chain = make_chain([make_entry(Probe("10-odd", calls, wrong), "10-odd")])
    with pytest.raises(HookInvalidAdjustment) as info:
        await run_create(chain)
    assert info.value.hook == "10-odd"
    assert type(answer).__name__ in str(info.value)


async def test_an_adjustment_the_call_cannot_carry_is_invalid() -> None:
    class EnvOnPod(Hook):
        async def pre_run_pod_sandbox(self, ctx: HookContext) -> Adjustment:
            return Adjustment().set_env("FOO", "1")

    chain = make_chain([make_entry(EnvOnPod(), "10-env")])
    request = api_pb2.RunPodSandboxRequest(config=api_pb2.PodSandboxConfig())
    with pytest.raises(HookInvalidAdjustment) as info:
        await chain.pre(ChainCall(Event.RUN_POD_SANDBOX, POD, None, request))
    assert info.value.hook == "10-env"
    assert "env 'FOO'" in str(info.value)


async def test_updates_pass_through_the_chain() -> None:
    async def update(ctx: HookContext) -> Adjustment:
        return Adjustment().update_container("other", ResourceDelta(cpuset_cpus="0-3"))

    calls: list[str] = []
    chain = make_chain([make_entry(Probe("10-a", calls, update), "10-a")])
    merger = await run_create(chain)
    assert [(h, u.container_id) for h, u, _ in merger.updates] == [("10-a", "other")]


# --- kubelet's deadline ----------------------------------------------------------------------


@pytest.mark.parametrize("offset", [0.01, -1.0], ids=["nearly-expired", "expired"])
async def test_kubelet_deadline_bounds_the_hook_timeout(offset: float) -> None:
    timeouts: list[float] = []

    async def slow(ctx: HookContext) -> None:
        timeouts.append(ctx.timeout)
        await asyncio.sleep(30)

    calls: list[str] = []
    chain = make_chain([make_entry(Probe("10-slow", calls, slow), "10-slow", timeout_ms=60_000)])
    with pytest.raises(HookTimeout):
        await run_create(chain, deadline=time.monotonic() + offset)
    assert timeouts == [0.001]


async def test_a_far_deadline_leaves_the_hook_timeout() -> None:
    timeouts: list[float] = []

    async def quick(ctx: HookContext) -> None:
        timeouts.append(ctx.timeout)

    calls: list[str] = []
    chain = make_chain([make_entry(Probe("10-a", calls, quick), "10-a", timeout_ms=250)])
    await run_create(chain, deadline=time.monotonic() + 3600)
    await run_create(chain, deadline=None)
    assert timeouts == [0.25, 0.25]


# --- the breaker ---------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Flaky(Hook):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.failing = True

    async def pre_create_container(self, ctx: HookContext) -> Adjustment:
        self.calls += 1
        if self.failing:
            raise RuntimeError("flaky")
        return Adjustment().set_annotation("flaky", "ok")


def breaker_chain(policy: str, threshold: int = 3) -> tuple[Chain, ChainEntry, Flaky, Clock]:
    hook = Flaky()
    entry = make_entry(
        hook,
        "10-flaky",
        failure_policy=policy,
        breaker_threshold=threshold,
        breaker_reset_seconds=30.0,
    )
    clock = Clock()
    entry.breaker.clock = clock
    return make_chain([entry]), entry, hook, clock


async def test_breaker_opens_after_threshold_and_fails_fast_with_fail_policy() -> None:
    chain, entry, hook, clock = breaker_chain("fail")
    for _ in range(3):
        with pytest.raises(HookError) as info:
            await run_create(chain)
        assert type(info.value) is HookError
    assert hook.calls == 3
    assert entry.breaker.state == "open"
    with pytest.raises(HookUnavailable) as unavailable:
        await run_create(chain)
    assert "circuit open" in str(unavailable.value)
    assert unavailable.value.hook == "10-flaky"
    assert hook.calls == 3
    clock.now += 29.0
    with pytest.raises(HookUnavailable):
        await run_create(chain)
    assert hook.calls == 3
    assert entry.counters["skipped"] == 2


async def test_a_breaker_is_recorded_on_the_recordings_clock_and_taken_up_on_another() -> None:
    """A rotated recording's snapshot keeps each breaker that counted failures, its reopening
    on the recording's clock (wall time); a replay's chain, on the recorded time, takes it
    up: still open until then, then one probe."""
    chain, _, _, clock = breaker_chain("ignore")
    await run_create(chain)
    assert chain.breakers(5000.0) == {"10-flaky": BreakerRecord(1, None)}  # counted, closed
    for _ in range(2):
        await run_create(chain)
    clock.now += 10.0  # 20 s of the 30 s left
    assert chain.breakers(5000.0) == {"10-flaky": BreakerRecord(3, 5020.0)}

    replayed, entry2, hook2, clock2 = breaker_chain("ignore")
    clock2.now = 5001.0  # the replay's clock: the recorded time
    replayed.restore_breakers(chain.breakers(5000.0))
    assert entry2.breaker.state == "open"
    await run_create(replayed)
    assert hook2.calls == 0 and entry2.counters["skipped"] == 1
    clock2.now = 5020.0
    await run_create(replayed)
    assert hook2.calls == 1  # the probe

    replayed.restore_breakers({})  # not in the snapshot: it had counted nothing
    assert entry2.breaker.failures == 0 and entry2.breaker.state == "closed"
    assert replayed.breakers(5020.0) == {}


async def test_breaker_probe_success_closes_it() -> None:
    chain, entry, hook, clock = breaker_chain("fail")
    for _ in range(3):
        with pytest.raises(HookError):
            await run_create(chain)
    clock.now += 30.0
    assert entry.breaker.state == "half-open"
    hook.failing = False
    request = create_request()
    await run_create(chain, request)
    assert hook.calls == 4
    assert request.config.annotations["flaky"] == "ok"
    assert entry.breaker.state == "closed"
    await run_create(chain)
    assert hook.calls == 5


async def test_breaker_probe_failure_opens_it_again() -> None:
    chain, entry, hook, clock = breaker_chain("fail")
    for _ in range(3):
        with pytest.raises(HookError):
            await run_create(chain)
    clock.now += 30.0
    with pytest.raises(HookError) as info:
        await run_create(chain)
    assert type(info.value) is HookError  # the probe was called and failed
    assert hook.calls == 4
    assert entry.breaker.state == "open"
    with pytest.raises(HookUnavailable):
        await run_create(chain)
    assert hook.calls == 4


async def test_breaker_with_ignore_policy_skips_the_hook() -> None:
    chain, entry, hook, clock = breaker_chain("ignore")
    for _ in range(3):
        await run_create(chain)
    assert hook.calls == 3
    request = create_request()
    merger = await run_create(chain, request)
    assert hook.calls == 3
    assert not merger.changed
    assert (entry.counters["skipped"], entry.counters["ignored"]) == (1, 4)
    clock.now += 30.0
    hook.failing = False
    await run_create(chain)
    assert hook.calls == 4
    assert entry.breaker.state == "closed"


async def test_success_resets_the_consecutive_failure_count() -> None:
    chain, entry, hook, _ = breaker_chain("fail")
    for failing in (True, True, False, True, True):
        hook.failing = failing
        if failing:
            with pytest.raises(HookError):
                await run_create(chain)
        else:
            await run_create(chain)
    assert entry.breaker.state == "closed"
    hook.failing = False
    await run_create(chain)
    assert hook.calls == 6


async def test_breaker_reset_in_real_time() -> None:
    hook = Flaky()
    entry = make_entry(
        hook, "10-flaky", breaker_threshold=1, breaker_reset_seconds=0.05, failure_policy="ignore"
    )
    chain = make_chain([entry])
    await run_create(chain)
    await run_create(chain)
    assert hook.calls == 1
    await asyncio.sleep(0.06)
    hook.failing = False
    await run_create(chain)
    assert hook.calls == 2
    assert entry.breaker.state == "closed"


async def test_half_open_breaker_lets_one_probe_through_among_concurrent_calls() -> None:
    """The chain docstring: "then one probe call is let through"."""
    gate = asyncio.Event()

    class Gated(Flaky):
        async def pre_create_container(self, ctx: HookContext) -> Adjustment:
            self.calls += 1
            if self.failing:
                raise RuntimeError("flaky")
            await gate.wait()
            return Adjustment()

    hook = Gated()
    entry = make_entry(hook, "10-gated", breaker_threshold=1, failure_policy="ignore")
    clock = Clock()
    entry.breaker.clock = clock
    chain = make_chain([entry])
    await run_create(chain)  # one failure: the circuit opens
    assert entry.breaker.state == "open"
    clock.now += entry.settings.breaker_reset_seconds
    hook.failing = False
    tasks = [asyncio.create_task(run_create(chain), name=f"test-concurrent-{i}") for i in range(3)]
    try:
        for _ in range(20):
            await asyncio.sleep(0)
        probes = hook.calls - 1
    finally:
        gate.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert probes == 1


# --- exemptions ----------------------------------------------------------------------------

EXEMPT_SETTINGS = ChainSettings(
    exempt_namespaces=("kube-system", "crihook"),
    exempt_labels={"crihook.io/skip": "true", "tier": "infra"},
)
EXEMPT_CASES = [
    ("namespace", PodView(id="", uid="", name="p", namespace="kube-system"), True),
    ("other-namespace", PodView(id="", uid="", name="p", namespace="crihook"), True),
    (
        "label",
        PodView(id="", uid="", name="p", namespace="shop", labels={"crihook.io/skip": "true"}),
        True,
    ),
    (
        "second-label",
        PodView(id="", uid="", name="p", namespace="shop", labels={"tier": "infra"}),
        True,
    ),
    (
        "label-other-value",
        PodView(id="", uid="", name="p", namespace="shop", labels={"crihook.io/skip": "false"}),
        False,
    ),
    (
        "label-as-annotation",
        PodView(id="", uid="", name="p", namespace="shop", annotations={"crihook.io/skip": "true"}),
        False,
    ),
    ("neither", PodView(id="", uid="", name="p", namespace="shop", labels={"app": "x"}), False),
    ("namespace-prefix", PodView(id="", uid="", name="p", namespace="kube-system2"), False),
]


@pytest.mark.parametrize(
    ("pod", "expected"), [c[1:] for c in EXEMPT_CASES], ids=[c[0] for c in EXEMPT_CASES]
)
def test_is_exempt(pod: PodView, expected: bool) -> None:
    assert is_exempt(EXEMPT_SETTINGS, pod) is expected


def test_chain_exempt_uses_its_settings() -> None:
    chain = Chain(EXEMPT_SETTINGS, lambda name: HookStateStore(name, {}, lambda _: None))
    assert chain.exempt(PodView(id="", uid="", name="p", namespace="kube-system"))
    assert not chain.exempt(POD)


# --- dry-run -------------------------------------------------------------------------------


async def test_dry_run_hook_applies_nothing_and_later_hooks_do_not_see_it() -> None:
    calls: list[str] = []
    seen: list[dict[str, str]] = []

    async def reader(ctx: HookContext) -> Adjustment:
        seen.append(dict(ctx.request.config.annotations))  # type: ignore[attr-defined]
        return Adjustment().set_annotation("b", "1")

    dry = make_entry(Probe("10-a", calls, annotate("a", "1")), "10-a", dry_run=True)
    chain = make_chain([dry, make_entry(Probe("20-b", calls, reader), "20-b")])
    request = create_request()
    merger = await run_create(chain, request)
    assert calls == ["10-a", "20-b"]
    assert seen == [{"k": "orig"}]
    assert dict(request.config.annotations) == {"k": "orig", "b": "1"}
    assert list(merger.owners.values()) == ["20-b"]
    assert dry.counters["dry_run"] == 1


async def test_dry_run_hook_may_set_what_a_later_hook_sets() -> None:
    calls: list[str] = []
    chain = make_chain(
        [
            make_entry(Probe("10-a", calls, annotate("x", "a")), "10-a", dry_run=True),
            make_entry(Probe("20-b", calls, annotate("x", "b")), "20-b"),
        ]
    )
    request = create_request()
    await run_create(chain, request)
    assert request.config.annotations["x"] == "b"


async def test_global_dry_run_adjusts_the_working_copy_for_later_hooks() -> None:
    calls: list[str] = []
    seen: list[dict[str, str]] = []

    async def reader(ctx: HookContext) -> Adjustment:
        seen.append(dict(ctx.request.config.annotations))  # type: ignore[attr-defined]
        return Adjustment().set_annotation("b", "1")

    first = make_entry(Probe("10-a", calls, annotate("a", "1")), "10-a")
    second = make_entry(Probe("20-b", calls, reader), "20-b")
    chain = make_chain([first, second], dry_run=True)
    request = create_request()
    await run_create(chain, request)
    assert seen == [{"k": "orig", "a": "1"}]
    assert dict(request.config.annotations) == {"k": "orig", "a": "1", "b": "1"}
    assert (first.counters["dry_run"], second.counters["dry_run"]) == (1, 1)
    assert all(s["dry_run"] for s in chain.status())


# --- status and close ----------------------------------------------------------------------


async def test_status_reports_settings_breaker_and_counters() -> None:
    calls: list[str] = []
    ok = make_entry(Probe("10-a", calls, annotate("a", "1")), "10-a", timeout_ms=300)
    bad = make_entry(
        Probe("20-b", calls, raising(RuntimeError("x"))), "20-b", failure_policy="ignore"
    )
    chain = make_chain([ok, bad])
    await run_create(chain)
    await run_create(chain)
    assert chain.status() == [
        {
            "name": "10-a",
            "kind": "in-process",
            "failure_policy": "fail",
            "timeout_ms": 300,
            "dry_run": False,
            "enabled": True,
            "connected": True,
            "honours_exemption": True,
            "permissions": [DEFAULT_PERMISSIONS],
            "subscriptions": ["pre-CreateContainer"],
            "breaker": "closed",
            "counters": {"calls": 2},
            "failures": {},
        },
        {
            "name": "20-b",
            "kind": "in-process",
            "failure_policy": "ignore",
            "timeout_ms": 1000,
            "dry_run": False,
            "enabled": True,
            "connected": True,
            "honours_exemption": True,
            "permissions": [DEFAULT_PERMISSIONS],
            "subscriptions": ["pre-CreateContainer"],
            "breaker": "closed",
            "counters": {"calls": 2, "failures": 2, "ignored": 2},
            "failures": {},
        },
    ]


async def test_close_closes_every_hook() -> None:
    calls: list[str] = []
    hooks = [Probe("10-a", calls), Probe("20-b", calls)]
    chain = make_chain([make_entry(h, h.name) for h in hooks])
    await chain.close()
    assert [h.closed for h in hooks] == [True, True]


# --- reasons and the exempt flag -----------------------------------------------------------


async def test_a_hooks_reason_is_traced_with_its_verdict_and_changes_nothing() -> None:
    async def explained(ctx: HookContext) -> Adjustment:
        return Adjustment().set_annotation("a", "1").because("rule A")

    async def nothing_but_why(ctx: HookContext) -> Adjustment:
        return Adjustment().because("rule B: not for this pod")

    calls: list[str] = []
    chain = make_chain(
        [
            make_entry(Probe("10-a", calls, explained), "10-a"),
            make_entry(Probe("20-b", calls, nothing_but_why), "20-b"),
            make_entry(Probe("30-c", calls), "30-c"),
        ]
    )
    request = create_request()
    trace: list[Any] = []
    merger: Any = await chain.pre(
        ChainCall(Event.CREATE_CONTAINER, POD, CONTAINER, request, trace=trace)
    )
    runs = [(t[0], t[2], t[3]) for t in trace]
    assert runs == [
        ("10-a", "adjusted", "rule A"),
        ("20-b", "nothing", "rule B: not for this pod"),
        ("30-c", "nothing", ""),
    ]
    assert dict(request.config.annotations) == {"k": "orig", "a": "1"}
    assert set(merger.owners.values()) == {"10-a"}


@pytest.mark.parametrize(("namespace", "exempt"), [("kube-system", True), ("shop", False)])
async def test_hooks_that_see_exempt_pods_are_told_they_are(namespace: str, exempt: bool) -> None:
    seen: list[bool] = []

    class Counter(Hook):
        honours_exemption = False

        async def pre_create_container(self, ctx: HookContext) -> None:
            seen.append(ctx.exempt)

    chain = make_chain([make_entry(Counter(), "10-counter")], exempt_namespaces=("kube-system",))
    pod = PodView(id="sb1", uid="u1", name="p", namespace=namespace)
    await chain.pre(
        ChainCall(
            Event.CREATE_CONTAINER, pod, CONTAINER, create_request(), exempt=chain.exempt(pod)
        )
    )
    assert seen == [exempt]
