"""`hooks.spec.reject_unknown` and the message every built-in and example hook gives for an
option it does not know (pinned whole: operators grep for it)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

from crihook.hooks.cpus.options import parse_options as cpuset_options
from crihook.hooks.devices.policy import parse_policy as devices_policy
from crihook.hooks.examples.annotate import parse_options as annotate_options
from crihook.hooks.examples.guard import parse_options as guard_options
from crihook.hooks.koordinator.options import parse_options as koordinator_options
from crihook.hooks.netdev.policy import parse_policy as netdev_policy
from crihook.hooks.numa.hook import NumaHook
from crihook.hooks.oom.hook import parse_options as oom_options
from crihook.hooks.spec import reject_unknown

Parse = Callable[[Mapping[str, Any]], object]


@pytest.mark.parametrize(
    ("parse", "message"),
    [
        (netdev_policy, "netdev: unknown option(s) colour, zeta"),
        (koordinator_options, "koordinator: unknown option(s) colour, zeta"),
        (annotate_options, "annotate: unknown option(s) colour, zeta"),
        (guard_options, "guard: unknown option(s) colour, zeta"),
        (oom_options, "oom: unknown option(s) colour, zeta"),
        (cpuset_options, "cpuset: unknown option(s) colour, zeta"),
        (devices_policy, "devices: unknown option(s) colour, zeta"),
        (NumaHook, "numa: unknown option(s) colour, zeta"),
    ],
    ids=["netdev", "koordinator", "annotate", "guard", "oom", "cpuset", "devices", "numa"],
)
def test_unknown_options_message(parse: Parse, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse({"zeta": 1, "colour": "red"})  # sorted in the message
    assert str(caught.value) == message


def test_reject_unknown_passes_known_and_empty() -> None:
    reject_unknown("x", {}, ())
    reject_unknown("x", {"a": 1, "b": 2}, {"a", "b", "c"})


def test_reject_unknown_one() -> None:
    with pytest.raises(ValueError) as caught:
        reject_unknown("x", {"a": 1, "b": 2}, ("a",))
    assert str(caught.value) == "x: unknown option(s) b"
