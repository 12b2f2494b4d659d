"""A skeleton crihook plugin: copy this folder, rename, fill in `build_adjustment`.

Keep the decision in pure functions (here `build_adjustment`) and test them with tables; the
hook class only orchestrates. See README.md in this folder for registration and testing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from crihook.hooks.spec import Adjustment, ContainerView, Hook, HookContext, PodView

__all__ = ["LABEL", "TemplateHook", "build_adjustment"]

LABEL = "example.com/template"


def build_adjustment(pod: PodView, container: ContainerView) -> Adjustment | None:
    """What to change for this container, or None to leave it alone. Pure: no I/O."""
    if pod.namespace == "kube-system":
        return None
    return Adjustment().set_label(LABEL, container.name)


class TemplateHook(Hook):
    """Handles one stage, pre-CreateContainer. Add more `async def <stage>_<event>` methods to
    subscribe to more stages (`pre_run_pod_sandbox`, `post_remove_container`, ...)."""

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(options)
        # Validate options here and raise ValueError naming the bad one: the process (or
        # crihook, for an in-process hook) refuses to start with a clear message.

    async def pre_create_container(self, ctx: HookContext) -> Adjustment | None:
        if ctx.container is None:  # crihook always sends one for CreateContainer
            return None
        return build_adjustment(ctx.pod, ctx.container)
