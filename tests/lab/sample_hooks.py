"""Small in-process hooks the integration tests load into a real crihook process
(`module = "tests.lab.sample_hooks:SetEnv"`). Each does one visible thing."""

from __future__ import annotations

from crihook.hooks.spec import Adjustment, Hook, HookContext, ResourceDelta

__all__ = ["CountAnnotations", "SetEnv", "SetShares", "SetState", "ShrinkOthers"]


class SetEnv(Hook):
    """Adds env `name=value` to every container."""

    async def pre_create_container(self, ctx: HookContext) -> Adjustment:
        return Adjustment().set_env(self.options["name"], self.options["value"])


class SetShares(Hook):
    """Sets cpu_shares (seen in the host cgroup)."""

    async def pre_create_container(self, ctx: HookContext) -> Adjustment:
        return Adjustment().set_cpu_shares(int(self.options["shares"]))


class CountAnnotations(Hook):
    """Sets annotation `order.<me>` to how many `order.*` annotations the request already
    carries: proves chain order and that each hook sees the request as adjusted so far."""

    async def pre_create_container(self, ctx: HookContext) -> Adjustment:
        seen = sum(1 for k in ctx.request.config.annotations if k.startswith("order."))
        return Adjustment().set_annotation(f"order.{self.options['me']}", str(seen))


class SetState(Hook):
    """Records every container it saw created in its persisted state."""

    async def pre_create_container(self, ctx: HookContext) -> None:
        assert ctx.container is not None
        seen = ctx.state.get("seen", [])
        ctx.state.set("seen", [*seen, f"{ctx.pod.name}/{ctx.container.name}"])
        return None


class ShrinkOthers(Hook):
    """When a container named `trigger` is created, asks crihook to update every other
    container of the pod it has seen (cpu_shares), and one container that does not exist."""

    async def pre_create_container(self, ctx: HookContext) -> Adjustment | None:
        assert ctx.container is not None
        seen = ctx.state.get("containers", [])
        if ctx.container.name != "trigger":
            return None
        adj = Adjustment()
        for cid in seen:
            adj.update_container(cid, ResourceDelta(cpu_shares=int(self.options["shares"])))
        adj.update_container("0" * 64, ResourceDelta(cpu_shares=3))
        return adj

    async def post_create_container(self, ctx: HookContext) -> None:
        assert ctx.response is not None
        seen = ctx.state.get("containers", [])
        ctx.state.set("containers", [*seen, ctx.response.container_id])
        return None
