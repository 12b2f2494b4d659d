"""The lab's bridge subnet: never one the host already has an address or a route in."""

from __future__ import annotations

import os
import random
import subprocess
from collections.abc import Iterator

import pytest

from tests.lab import runtime_lab as lab


@pytest.fixture
def taken_subnet() -> Iterator[int]:
    """A veth on the host with an address in 10.88.<x>.0/24, as a killed lab's bridge has."""
    if os.geteuid() != 0:
        pytest.fail("adding a link needs root (run the tests as root)", pytrace=False)
    free = [x for x in range(200, 255) if not _has(f"10.88.{x}.")]
    x = free[0]
    name = f"chsub{os.getpid() % 100000}"
    subprocess.run(
        ["ip", "link", "add", name, "type", "veth", "peer", "name", f"{name}p"], check=True
    )
    try:
        subprocess.run(["ip", "addr", "add", f"10.88.{x}.1/24", "dev", name], check=True)
        yield x
    finally:
        subprocess.run(["ip", "link", "delete", name], check=True)


def _has(prefix: str) -> bool:
    shown = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True)
    return prefix in shown.stdout


def test_the_lab_picks_a_subnet_the_host_does_not_have(
    taken_subnet: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    def taken_first(items: list[int]) -> None:
        items.sort(key=lambda x: (x != taken_subnet, x))

    monkeypatch.setattr(random, "shuffle", taken_first)
    chosen = lab._unused_subnet()
    assert chosen != f"10.88.{taken_subnet}.0/24"
    assert chosen.startswith("10.88.") and chosen.endswith(".0/24")
