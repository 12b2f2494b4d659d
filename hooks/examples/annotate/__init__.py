"""An example hook: add one configured annotation to every container it sees created.

In-process (the chain loads `crihook.hooks.examples.annotate:AnnotateHook` with options
{"key": ..., "value": ...}) or as a plugin process:

    python -m crihook.hooks.examples.annotate --socket /run/crihook/plugins/annotate.sock \\
        --key example.com/annotated --value "true"

`delay_ms` (sleep before answering) and `fail` (raise) exist for fault tests.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from crihook.hooks.spec import Adjustment, Hook, HookContext, reject_unknown

__all__ = ["AnnotateHook", "AnnotateOptions", "build_adjustment", "parse_options"]

# A Kubernetes annotation key: an optional DNS-subdomain prefix and a name.
_KEY = re.compile(
    r"^(?:[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)


@dataclass(frozen=True)
class AnnotateOptions:
    key: str
    value: str
    delay_ms: int = 0
    fail: bool = False


def parse_options(options: Mapping[str, Any]) -> AnnotateOptions:
    """Validate the hook's options; ValueError says which one is wrong and why."""
    reject_unknown("annotate", options, {"key", "value", "delay_ms", "fail"})
    key = options.get("key")
    if key is None:
        raise ValueError("annotate: option 'key' is required (the annotation to add)")
    if not isinstance(key, str) or not _KEY.match(key):
        raise ValueError(
            f"annotate: option 'key' {key!r} is not an annotation key like example.com/name"
        )
    value = options.get("value")
    if value is None:
        raise ValueError("annotate: option 'value' is required (the annotation's value)")
    if not isinstance(value, str):
        raise ValueError(f"annotate: option 'value' must be a string, not {value!r}")
    delay_ms = options.get("delay_ms", 0)
    if isinstance(delay_ms, bool) or not isinstance(delay_ms, int) or delay_ms < 0:
        raise ValueError(f"annotate: option 'delay_ms' must be an integer >= 0, not {delay_ms!r}")
    fail = options.get("fail", False)
    if not isinstance(fail, bool):
        raise ValueError(f"annotate: option 'fail' must be true or false, not {fail!r}")
    return AnnotateOptions(key, value, delay_ms, fail)


def build_adjustment(options: AnnotateOptions) -> Adjustment:
    return Adjustment().set_annotation(options.key, options.value)


class AnnotateHook(Hook):
    """Adds the configured annotation in pre-CreateContainer."""

    sets = ("annotation",)

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(options)
        self.config = parse_options(self.options)

    async def pre_create_container(self, ctx: HookContext) -> Adjustment | None:
        if self.config.delay_ms:
            await asyncio.sleep(self.config.delay_ms / 1000)
        if self.config.fail:
            raise RuntimeError("annotate: failing on purpose (fail option set)")
        return build_adjustment(self.config)
