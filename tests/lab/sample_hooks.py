"""Small in-process hooks the integration tests load into a real crihook process
(`module = "tests.lab.sample_hooks:SetEnv"`). Each does one visible thing."""

from __future__ import annotations

import asyncio
from pathlib import Path

from crihook.hooks.spec import Adjustment, Hook, HookContext, Reject, ResourceDelta

__all__ = [
    "AddMount",
    "CountAnnotations",
    "RefuseSandbox",
    "SetEnv",
    "SetShares",
    "SetState",
    "ShrinkOthers",
    "WaitAtStart",
]


class SetEnv(Hook):
    """Adds env `name=value` to every container (declared: env needs a grant)."""

    sets = ("env",)

    async def pre_create_container(self, ctx: HookContext) -> Adjustment:
        return Adjustment().set_env(self.options["name"], self.options["value"])


class AddMount(Hook):
    """Mounts host path `host` at `at` in every container (a change a validator may refuse)."""

    async def pre_create_container(self, ctx: HookContext) -> Adjustment:
        return Adjustment().add_mount(self.options["at"], self.options["host"])


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


class RefuseSandbox(Hook):
    """Reserves something for every pod in pre-RunPodSandbox, then refuses the sandbox the
    runtime made when the pod carries the annotation `refuse` (setting it up "failed"), and
    releases in the failed stage. Its state `held` lists what it holds."""

    async def pre_run_pod_sandbox(self, ctx: HookContext) -> None:
        ctx.state.set("held", [*ctx.state.get("held", []), ctx.pod.uid])
        return None

    async def post_run_pod_sandbox(self, ctx: HookContext) -> None:
        if "refuse" in ctx.pod.annotations:
            raise Reject(f"cannot set up the network of pod {ctx.pod.name}")
        return None

    async def failed_run_pod_sandbox(self, ctx: HookContext) -> None:
        ctx.state.set("held", [u for u in ctx.state.get("held", []) if u != ctx.pod.uid])
        ctx.state.set("told", [*ctx.state.get("told", []), ctx.failure])


class WaitAtStart(Hook):
    """Holds crihook's start-up in its `start`: makes file `note`, then waits until file
    `until` exists."""

    async def start(self) -> None:
        Path(self.options["note"]).touch()
        while not Path(self.options["until"]).exists():
            await asyncio.sleep(0.01)

    async def pre_run_pod_sandbox(self, ctx: HookContext) -> None:
        return None
