"""bench.pipeline_cost's scenarios build and answer: every in-process chain of bench.run runs
the bench's CreateContainer through the whole pipeline without a failure (its figures are
only printed, never asserted)."""

from __future__ import annotations

import asyncio

import pytest

from bench import payloads
from bench.pipeline_cost import CHOICES, loop_cpu
from bench.run import SCENARIOS


def test_the_chains_that_need_no_process_besides_crihook_are_the_ones_offered() -> None:
    assert {"hooks-none", "resource-hooks", "devices"} <= set(CHOICES)
    assert "plugin-1" not in CHOICES and "hooks-4-record" not in CHOICES


@pytest.mark.parametrize("name", CHOICES)
def test_each_scenario_answers_every_create(name: str) -> None:
    scenario = next(s for s in SCENARIOS if s.name == name)
    base = payloads.fake_create_container_request()
    marker = payloads.NAME_MARKER.encode()
    requests = [base.replace(marker, f"{i:010d}".encode()) for i in range(30)]
    # loop_cpu raises, naming the scenario, when a call does not succeed.
    assert asyncio.run(loop_cpu(scenario, requests)) > 0
