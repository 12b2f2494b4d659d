"""What metrics add to a call in crihook's own Python, with no sockets (so the figure is not
lost in gRPC's noise):

    python -m bench.metrics_cost

- intercepted: `Pipeline.handle` of the bench's kubelet-shaped CreateContainer (no hooks, a
  runtime answering at once, the store kept in memory) with no outcome listener, and with
  `Metrics.outcome` listening (the outcome traced and counted);
- pass-through: a grpc.aio unary behaviour that answers at once, bare and wrapped by
  `measured_handler` (timed and counted).

Each figure is the fastest of 9 reps of 5,000 calls, with and without metrics interleaved
(other processes stay out of it).
Timing lives here, never in tests.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from bench.payloads import fake_create_container_request
from crihook.api.cri.v1 import api_pb2
from crihook.hooks.spec import Event
from crihook.proxy.chain.chain import Chain
from crihook.proxy.config import ChainSettings
from crihook.proxy.core.pipeline import Pipeline
from crihook.proxy.cri.readiness import Readiness
from crihook.proxy.ops.metrics import Metrics, Sources
from crihook.proxy.state.store import Store
from crihook.proxy.wire.grpc.server import measured_handler

N, REPS = 5000, 9


_CREATED = api_pb2.CreateContainerResponse(container_id="c" * 64).SerializeToString()


class _Runtime:
    def call(self, path: str) -> Any:
        async def unary(request: bytes, *, timeout: Any = None, metadata: Any = None) -> bytes:
            return _CREATED

        return unary


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="crihook-bench-") as tmp:
        await measure(Path(tmp))


async def measure(state_dir: Path) -> None:
    store = Store(state_dir)
    store.load()
    chain = Chain(ChainSettings(), store.hook_state)
    readiness = Readiness()
    readiness.set(True)
    pipeline = Pipeline(_Runtime(), chain, store, readiness)
    metrics = Metrics(Sources(chain, store, readiness, lambda: 0, lambda: 0))
    raw = fake_create_container_request()
    store.write_behind = lambda: None  # type: ignore[method-assign]  # no disk in the figure

    async def once(listener: Any) -> float:
        pipeline.on_outcome = listener
        started = time.perf_counter()
        for _ in range(N):
            await pipeline.handle(Event.CREATE_CONTAINER, raw)
        return (time.perf_counter() - started) / N * 1e6

    off, on = [], []
    for _ in range(REPS):  # interleaved: load from other processes hits both alike
        off.append(await once(None))
        on.append(await once(metrics.outcome))
    _report("intercepted (Pipeline.handle)", min(off), min(on))

    async def behaviour(request: bytes, context: Any) -> bytes:
        return b""

    plain = grpc.unary_unary_rpc_method_handler(behaviour)
    wrapped = measured_handler(plain, "ListContainers", metrics)

    async def timed(fn: Any) -> float:
        started = time.perf_counter()
        for _ in range(N):
            await fn(b"", None)
        return (time.perf_counter() - started) / N * 1e6

    bare, measured = [], []
    for _ in range(REPS):
        bare.append(await timed(plain.unary_unary))
        measured.append(await timed(wrapped.unary_unary))
    _report("pass-through (handler)", min(bare), min(measured))


def _report(what: str, off: float, on: float) -> None:
    print(f"{what}: {off:.2f} µs, with metrics {on:.2f} µs, {on - off:+.2f} µs")


if __name__ == "__main__":
    asyncio.run(main())
