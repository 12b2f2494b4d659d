"""What metrics add to a call in crihook's own Python, with no sockets (so the figure is not
lost in gRPC's noise):

    python -m bench.metrics_cost

- intercepted: `Pipeline.handle` of a StartContainer (no hooks, a runtime answering at once)
  with no outcome listener, and with `Metrics.outcome` listening (the outcome traced and
  counted);
- pass-through: a grpc.aio unary behaviour that answers at once, bare and wrapped by
  `measured_handler` (timed and counted).

Each figure is the fastest of 7 reps of 20,000 calls (other processes stay out of it).
Timing lives here, never in tests.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.spec import Event
from crihook.proxy.chain import Chain
from crihook.proxy.config import ChainSettings
from crihook.proxy.metrics import Metrics, Sources, measured_handler
from crihook.proxy.passthrough import Readiness
from crihook.proxy.pipeline import Pipeline
from crihook.proxy.store import Store

N, REPS = 20000, 7


class _Runtime:
    def call(self, path: str) -> Any:
        async def unary(request: bytes, *, timeout: Any = None, metadata: Any = None) -> bytes:
            return b""

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
    raw = api_pb2.StartContainerRequest(container_id="c" * 64).SerializeToString()

    async def run(listener: Any) -> float:
        pipeline.on_outcome = listener
        best = []
        for _ in range(REPS):
            t = time.perf_counter()
            for _ in range(N):
                await pipeline.handle(Event.START_CONTAINER, raw)
            best.append((time.perf_counter() - t) / N * 1e6)
        return min(best)

    off = min(await run(None), await run(None))
    on = min(await run(metrics.outcome), await run(metrics.outcome))
    print(
        f"intercepted (Pipeline.handle): {off:.2f} µs, with metrics {on:.2f} µs, +{on - off:.2f} µs"
    )

    async def behaviour(request: bytes, context: Any) -> bytes:
        return b""

    plain = grpc.unary_unary_rpc_method_handler(behaviour)
    wrapped = measured_handler(plain, "ListContainers", metrics)

    async def timeit(fn: Any) -> float:
        best = []
        for _ in range(REPS):
            t = time.perf_counter()
            for _ in range(N):
                await fn(b"", None)
            best.append((time.perf_counter() - t) / N * 1e6)
        return min(best)

    a = await timeit(plain.unary_unary)
    b = await timeit(wrapped.unary_unary)
    print(f"pass-through (handler): {a:.2f} µs, measured {b:.2f} µs, +{b - a:.2f} µs")


if __name__ == "__main__":
    asyncio.run(main())
