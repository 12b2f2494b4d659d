"""What permission checks and one in-process validator add to a CreateContainer, in the chain
itself (no sockets, so the figures are not lost in gRPC's noise).

    python -m bench.chain [--calls 20000] [--reps 5]

Runs the pre stage and the validate stage of the hook chain on the bench's kubelet-shaped
CreateContainerRequest (bench/payloads.py: labels, annotations, envs, 3 mounts, resources,
the full sandbox config), decoded afresh for every call as the pipeline does, in these
chains:

- ``no hooks``: the decode and the pod and container views (what the pipeline does for the
  store with no hook at all);
- ``annotate``: one in-process hook adding an annotation, with the default grants;
- ``annotate, allow glob``: the same hook narrowed by ``allow = ["annotation:bench.io/*"]``;
- ``annotate, allow glob + a validator``: plus a validator that reads the final request
  and touches no file (the validate stage's own cost);
- ``annotate, allow glob + guard``: the guard example validator instead (privileged check,
  and the three host paths resolved in a worker thread and matched);

Each chain is timed ``--reps`` times over ``--calls`` calls; a chain's figure is its fastest
rep's median, which keeps other processes on the machine out of it. Timing lives here, never
in tests.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.payloads import fake_create_container_request
from crihook.api.cri.v1 import api_pb2
from crihook.hooks.examples.annotate import AnnotateHook
from crihook.hooks.examples.guard import GuardHook
from crihook.hooks.spec import Event, Hook, HookContext, Reject, Stage
from crihook.hooks.spec.views import container_view_from_config, pod_view_from_config
from crihook.proxy.chain.call import ChainCall
from crihook.proxy.chain.chain import Chain, ChainEntry
from crihook.proxy.chain.local_hooks import LocalHook
from crihook.proxy.config import ChainSettings, HookSettings
from crihook.proxy.state.hook_state import HookStateStore

REQUEST = fake_create_container_request()
ANNOTATE = {"key": "bench.io/a", "value": "x"}


def _chain(entries: list[ChainEntry]) -> Chain:
    states: dict[str, HookStateStore] = {}

    def state_for(name: str) -> HookStateStore:
        return states.setdefault(name, HookStateStore(name, {}, lambda _: None))

    chain = Chain(ChainSettings(), state_for)
    chain.set_builtin(entries)
    return chain


def _entry(name: str, hook: Any, allow: tuple[str, ...] | None = None) -> ChainEntry:
    return Chain.entry(LocalHook(name, hook), HookSettings(name=name, allow=allow))


class PrivilegedValidator(Hook):
    """A validator that reads the final request and touches no file: the validate stage's
    own cost, apart from guard's host-path resolution."""

    async def validate_create_container(self, ctx: HookContext) -> None:
        if ctx.request.config.linux.security_context.privileged:  # type: ignore[attr-defined]
            raise Reject("privileged")


CHAINS: dict[str, Callable[[], Chain | None]] = {
    "no hooks": lambda: None,
    "annotate": lambda: _chain([_entry("10-annotate", AnnotateHook(ANNOTATE))]),
    "annotate, allow glob": lambda: _chain(
        [_entry("10-annotate", AnnotateHook(ANNOTATE), ("annotation:bench.io/*",))]
    ),
    "annotate, allow glob + a validator": lambda: _chain(
        [
            _entry("10-annotate", AnnotateHook(ANNOTATE), ("annotation:bench.io/*",)),
            _entry("90-check", PrivilegedValidator()),
        ]
    ),
    "annotate, allow glob + guard": lambda: _chain(
        [
            _entry("10-annotate", AnnotateHook(ANNOTATE), ("annotation:bench.io/*",)),
            _entry("90-guard", GuardHook({"host_paths": ["/var/lib/kubelet/*", "/tmp/*"]})),
        ]
    ),
}


async def _one(chain: Chain | None) -> int:
    start = time.perf_counter_ns()
    request = api_pb2.CreateContainerRequest.FromString(REQUEST)
    # the pipeline builds the views for the store whether hooks run or not
    pod = pod_view_from_config(request.pod_sandbox_id, request.sandbox_config)
    container = container_view_from_config("", pod, request.config)
    if chain is not None:
        event = Event.CREATE_CONTAINER
        call = ChainCall(event, pod, container, request)
        merger = await chain.pre(call)
        if chain.wants(event, Stage.VALIDATE):  # as the pipeline: only with a validator
            await chain.validate(call, merger)
        assert merger.changed
    return time.perf_counter_ns() - start


async def _measure(chain: Chain | None, calls: int) -> list[int]:
    for _ in range(min(calls, 500)):  # warm-up
        await _one(chain)
    return [await _one(chain) for _ in range(calls)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    best: dict[str, float] = {}
    for _ in range(args.reps):
        for name, make in CHAINS.items():  # interleaved, so drift hits every chain alike
            times = asyncio.run(_measure(make(), args.calls))
            p50 = statistics.median(times) / 1000
            best[name] = min(best.get(name, p50), p50)
    base = best["no hooks"]
    print(f"CreateContainer through the chain, {args.calls} calls x {args.reps} reps (best p50)\n")
    print("| chain | p50 µs/call | added vs no hooks | added vs the row above |")
    print("| --- | ---: | ---: | ---: |")
    previous = base
    for name, p50 in best.items():
        print(f"| {name} | {p50:,.1f} | +{p50 - base:,.1f} | +{p50 - previous:,.1f} |")
        previous = p50
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
