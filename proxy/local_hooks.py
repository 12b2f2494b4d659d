"""In-process hooks: load the configured classes and present them to the chain."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Coroutine
from typing import Any

from crihook.hooks.spec import (
    Adjustment,
    Event,
    Hook,
    HookContext,
    Stage,
    stage_method_name,
    subscriptions_of,
)
from crihook.proxy.config import HookSettings
from crihook.proxy.errors import ConfigError

__all__ = ["BUILTIN_HOOKS", "LocalHook", "load_local_hook"]

# Hooks shipped with crihook, by base name; others are configured with `module = "pkg.mod:Cls"`.
BUILTIN_HOOKS: dict[str, str] = {
    "annotate": "crihook.hooks.examples.annotate:AnnotateHook",
}

StageMethod = Callable[[HookContext], Coroutine[Any, Any, Adjustment | None]]


class LocalHook:
    """An in-process hook behind the same interface as an out-of-process one."""

    connected = True

    def __init__(self, name: str, impl: Hook) -> None:
        self.name = name
        self.impl = impl
        self._subs = subscriptions_of(impl)
        self._methods: dict[tuple[Event, Stage], StageMethod] = {
            (e, s): getattr(impl, stage_method_name(e, s)) for e, s in self._subs
        }

    def subscriptions(self) -> frozenset[tuple[Event, Stage]]:
        return self._subs

    def call(self, ctx: HookContext) -> Coroutine[Any, Any, Adjustment | None]:
        # The stage method's own coroutine: no wrapper coroutine around it.
        return self._methods[(ctx.event, ctx.stage)](ctx)

    async def start(self) -> None:
        await self.impl.start()

    async def close(self) -> None:
        await self.impl.close()


def load_local_hook(settings: HookSettings) -> LocalHook:
    """Import and build the hook class; every problem is a ConfigError naming the hook."""
    section = f"[hooks.{settings.base_name}]"
    target = settings.module or BUILTIN_HOOKS.get(settings.base_name)
    if target is None:
        raise ConfigError(
            section, f'no built-in hook {settings.base_name!r} and no module = "pkg.mod:Class"'
        )
    module_name, _, class_name = target.partition(":")
    try:
        cls: Any = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{section} module", f"cannot load {target}: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, Hook)):
        raise ConfigError(f"{section} module", f"{target} is not a crihook.hooks.spec.Hook")
    try:
        impl = cls(settings.options)
    except (ValueError, TypeError, KeyError) as exc:
        raise ConfigError(section, str(exc)) from None
    hook = LocalHook(settings.name, impl)
    if not hook.subscriptions():
        raise ConfigError(section, f"{target} implements no stage method (pre_/post_...)")
    return hook
