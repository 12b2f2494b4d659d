"""In-process hooks: load the configured classes and present them to the chain."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from crihook.hooks.builtin import BUILTIN_HOOKS
from crihook.hooks.node import cgroup_version
from crihook.hooks.spec import (
    Adjustment,
    ContainerUpdate,
    Event,
    Hook,
    HookContext,
    PoolUsage,
    ResourceHints,
    Stage,
    SyncContext,
    stage_method_name,
    subscriptions_of,
)
from crihook.proxy.config import HookSettings
from crihook.proxy.errors import ConfigError

__all__ = ["LocalHook", "host_problems", "load_local_hook"]

StageMethod = Callable[[HookContext], Coroutine[Any, Any, Adjustment | ResourceHints | None]]


class LocalHook:
    """An in-process hook behind the same interface as an out-of-process one."""

    connected = True
    bounds_own_calls = False

    def __init__(self, name: str, impl: Hook) -> None:
        self.name = name
        self.impl = impl
        self.honours_exemption = bool(impl.honours_exemption)
        self.sets = impl.sets
        self._subs = subscriptions_of(impl)
        self._methods: dict[tuple[Event, Stage], StageMethod] = {
            (e, s): getattr(impl, stage_method_name(e, s)) for e, s in self._subs
        }

    def subscriptions(self) -> frozenset[tuple[Event, Stage]]:
        return self._subs

    def call(self, ctx: HookContext) -> Coroutine[Any, Any, Adjustment | ResourceHints | None]:
        # The stage method's own coroutine: no wrapper coroutine around it.
        return self._methods[(ctx.event, ctx.stage)](ctx)

    async def start(self) -> None:
        await self.impl.start()

    async def synchronize(self, sync: SyncContext) -> Sequence[ContainerUpdate]:
        return tuple(await self.impl.synchronize(sync) or ())

    async def close(self) -> None:
        await self.impl.close()

    def usage(self) -> Sequence[PoolUsage]:
        """The hook's pool figures (`Hook.usage`), for metrics."""
        return self.impl.usage()

    def failures(self) -> dict[str, int]:
        """The hook's own failure counts (`Hook.failures`), for status and metrics."""
        return dict(self.impl.failures())


def load_local_hook(settings: HookSettings) -> LocalHook:
    """Import and build the hook class; every problem is a ConfigError naming the hook."""
    section = f"[hooks.{settings.base_name}]"
    builtin = BUILTIN_HOOKS.get(settings.base_name)
    target = settings.module or (builtin.target if builtin else None)
    if target is None:
        known = ", ".join(sorted(BUILTIN_HOOKS))
        raise ConfigError(
            section,
            f"no built-in hook {settings.base_name!r} (built-in: {known}) and no "
            'module = "pkg.mod:Class"',
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
    try:
        hook = LocalHook(settings.name, impl)
    except ValueError as exc:  # a method named like a stage that is none
        raise ConfigError(section, f"{target}: {exc}") from None
    if not hook.subscriptions():
        raise ConfigError(section, f"{target} implements no stage method (pre_/post_...)")
    return hook


def host_problems(hooks: Sequence[HookSettings], cgroup_root: Path) -> list[ConfigError]:
    """The built-in hooks' options checked against this host (their `HostCheck`): one
    ConfigError per option the host cannot do, naming it. `serve` refuses to start on the
    first, `crihook check` lists them all."""
    checks = []
    for hook in hooks:
        builtin = BUILTIN_HOOKS.get(hook.base_name)
        check = builtin.host_checker() if builtin is not None and not hook.module else None
        if check is not None:
            checks.append((hook, check))
    if not checks:
        return []  # no file system look-up for a chain that does not care
    version = cgroup_version(cgroup_root)
    return [
        ConfigError(f"[hooks.{hook.base_name}] {option}", problem)
        for hook, check in checks
        for option, problem in check(hook.options, version)
    ]
