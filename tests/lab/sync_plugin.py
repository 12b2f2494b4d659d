"""A plugin that repairs at Synchronize: it asks crihook to set the CPU shares of every
container of one pod. `python -m tests.lab.sync_plugin --socket PATH --pod NAME --shares N`."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from crihook.hooks import sdk
from crihook.hooks.spec import ContainerUpdate, Hook, HookContext, ResourceDelta, SyncContext

__all__ = ["SyncRepair", "main"]


class SyncRepair(Hook):
    def __init__(self, options: Mapping[str, Any]) -> None:
        self.pod = str(options["pod"])
        self.shares = int(options["shares"])

    async def synchronize(self, sync: SyncContext) -> Sequence[ContainerUpdate]:
        pods = {p.id for p in sync.pods if p.name == self.pod}
        return [
            ContainerUpdate(c.id, ResourceDelta(cpu_shares=self.shares))
            for c in sync.containers
            if c.pod_id in pods
        ]

    async def pre_create_container(self, ctx: HookContext) -> None:
        return None


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.lab.sync_plugin")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--pod", required=True)
    parser.add_argument("--shares", type=int, required=True)
    args = parser.parse_args(argv)
    sdk.run(SyncRepair({"pod": args.pod, "shares": args.shares}), args.socket)


if __name__ == "__main__":
    main()
