"""bench.pipeline_cost's scenarios build and answer: every in-process chain of bench.run runs
the bench's CreateContainer through the whole pipeline without a failure (its figures are
only printed, never asserted). Its split is only a split if the chain with the hooks' work
taken out still forwards what the hooks made of the request (canned answers), or the request
as kubelet sent it (no answers)."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

import pytest

from bench import payloads
from bench.pipeline_cost import CHOICES, StandIn, build, loop_cpu, main, take_work_out
from bench.run import SCENARIOS, Scenario
from crihook.hooks.spec import Event, Stage
from crihook.proxy.chain.chain import ChainEntry
from crihook.proxy.core.pipeline import Pipeline


def _scenario(name: str) -> Scenario:
    return next(s for s in SCENARIOS if s.name == name)


def _requests(count: int, first: int = 0) -> list[bytes]:
    base = payloads.fake_create_container_request()
    marker = payloads.NAME_MARKER.encode()
    return [base.replace(marker, f"{first + i:010d}".encode()) for i in range(count)]


def test_the_chains_that_need_no_process_besides_crihook_are_the_ones_offered() -> None:
    assert {"hooks-none", "resource-hooks", "devices"} <= set(CHOICES)
    assert "plugin-1" not in CHOICES and "hooks-4-record" not in CHOICES


@pytest.mark.parametrize("name", CHOICES)
def test_each_scenario_answers_every_create(name: str) -> None:
    # loop_cpu raises, naming the scenario, when a call does not succeed.
    assert asyncio.run(loop_cpu(_scenario(name), _requests(30))) > 0


@pytest.mark.parametrize("name", ["devices", "resource-hooks"])
def test_with_the_work_taken_out_the_chain_forwards_the_same_request(name: str) -> None:
    """Canned: byte for byte what the hooks' answers made of the same request. Nothing:
    the request as kubelet sent it."""
    request = _requests(1)[0]

    async def forwarded(answers: str | None, pipeline: Pipeline) -> bytes | None:
        if answers is not None:
            take_work_out(pipeline, answers)
        outcome = await pipeline.handle(Event.CREATE_CONTAINER, request, None, None)
        assert outcome.status is None, outcome.status
        return outcome.forwarded

    async def check() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            pipeline, store = await build(_scenario(name), Path(tmp), stand_ins=True)
            try:
                by_hooks = await forwarded(None, pipeline)
                assert by_hooks != request, "the hooks change the bench's request"
                assert await forwarded("canned", pipeline) == by_hooks
                assert await forwarded("nothing", pipeline) == request
            finally:
                await store.close()

    asyncio.run(check())


@pytest.mark.parametrize("name", ["devices", "resource-hooks"])
def test_stand_ins_keep_the_hooks_place_in_the_chain(name: str) -> None:
    """Each stand-in is seen by the chain as the hook it stands in for: the same name, order,
    subscriptions, declared fields, grants, exemption and timeout."""

    def place(entry: ChainEntry) -> tuple[Any, ...]:
        hook = entry.hook
        grants = entry.permissions.describe()
        return (entry.name, hook.subscriptions(), hook.sets, grants, entry.honours_exemption,
                entry.timeout)  # fmt: skip

    async def places(stand_ins: bool) -> list[tuple[Any, ...]]:
        with tempfile.TemporaryDirectory() as tmp:
            pipeline, store = await build(_scenario(name), Path(tmp), stand_ins=stand_ins)
            await store.close()
            assert all(isinstance(e.hook, StandIn) is stand_ins for e in pipeline.chain.entries)
            return [place(e) for e in pipeline.chain.entries]

    assert asyncio.run(places(True)) == asyncio.run(places(False))


def test_stand_ins_answer_what_they_kept_or_nothing() -> None:
    async def check() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            pipeline, store = await build(_scenario("devices"), Path(tmp), stand_ins=True)
            try:
                (entry,) = pipeline.chain.entries
                hook = entry.hook
                assert isinstance(hook, StandIn)
                await pipeline.handle(Event.CREATE_CONTAINER, _requests(1)[0], None, None)
                assert hook.kept[(Event.CREATE_CONTAINER, Stage.PRE)]
                take_work_out(pipeline, "canned")
                assert hook.answers == hook.kept
                take_work_out(pipeline, "nothing")
                assert hook.answers == {}
            finally:
                await store.close()

    asyncio.run(check())


def test_an_unknown_answer_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="answers: 'someone'"):
        asyncio.run(loop_cpu(_scenario("devices"), _requests(10), "someone"))


def test_split_prints_the_three_parts(capsys: pytest.CaptureFixture[str]) -> None:
    asyncio.run(main(["hooks-none", "devices"], calls=20, reps=1, split=True, cold_mib=1))
    out = capsys.readouterr().out
    assert "1 MiB read between calls" in out
    row = next(line for line in out.splitlines()[3:] if line.strip().startswith("devices"))
    assert len(row.split()) == 4, row  # the name and three figures


def test_split_without_hooks_none_says_why_it_has_nothing_to_split(
    capsys: pytest.CaptureFixture[str],
) -> None:
    asyncio.run(main(["devices"], calls=20, reps=1, split=True, cold_mib=0))
    assert "nothing to split without hooks-none" in capsys.readouterr().out
