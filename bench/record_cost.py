"""What recording costs crihook's event loop per call, with no sockets (so the figure is not
lost in gRPC's noise):

    python -m bench.record_cost

The outcome is that of the bench's kubelet-shaped CreateContainer (the 2.3 KB request of
bench.payloads, with its pod) through 4 annotate hooks (the hooks-4 scenario),
with a runtime answering at once. Measured, per call:

- the event loop's CPU (thread time) for `Pipeline.handle` and what follows it on the loop,
  with no listener and with a running `Recorder` (its renderer process writing a file in a
  temporary directory), interleaved; the difference is what recording costs the loop;
- `Recorder._encoded`: what the loop does for a recorded call (the `CallRecord` cut from the
  outcome, pickled and framed), and its parts;
- for reference, the whole `Outcome` pickled (what the loop did before the `CallRecord`);
- for reference, rendering the line (what the renderer process does, off the loop).

Each figure is the fastest of 9 reps. Timing lives here, never in tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import pickle
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from bench.payloads import fake_create_container_request
from bench.pipeline_cost import build
from bench.run import SCENARIOS
from crihook.hooks.spec import Event
from crihook.proxy.config import RecordSettings
from crihook.proxy.core.pipeline import Pipeline
from crihook.proxy.cri.outcome import Outcome
from crihook.proxy.record.lines import call_line, call_record, encode_line
from crihook.proxy.record.recorder import Recorder
from crihook.proxy.record.worker import _Pickler

REPS = 9


@contextlib.asynccontextmanager
async def _no_calls() -> AsyncIterator[None]:
    yield


async def _pipeline(state_dir: Path) -> tuple[Pipeline, bytes]:
    """The hooks-4 scenario's pipeline, as bench.pipeline_cost builds it, with no disk
    writes behind the calls (none in the figure)."""
    hooks_4 = next(s for s in SCENARIOS if s.name == "hooks-4")
    pipeline, store = await build(hooks_4, state_dir)
    store.write_behind = lambda: None  # type: ignore[method-assign]
    return pipeline, fake_create_container_request()  # (its pod: from its sandbox config)


def _recorder(pipeline: Pipeline, path: Path) -> Recorder:
    return Recorder(
        RecordSettings(file=path),
        lambda: {"kind": "header"},
        lambda seq: {"kind": "snapshot", "seq": seq},
        _no_calls,
        pipeline.next_seq,
    )


async def _outcome(state_dir: Path) -> tuple[Outcome, Recorder]:
    pipeline, raw = await _pipeline(state_dir)
    outcomes: list[Outcome] = []
    pipeline.on_outcome = outcomes.append
    await pipeline.handle(Event.CREATE_CONTAINER, raw, None, time.monotonic() + 2)
    return outcomes[0], _recorder(pipeline, state_dir / "unused.jsonl")


async def _loop_cpu(state_dir: Path, calls: int = 2000) -> tuple[float, float, float]:
    """The loop's CPU per call: no listener, a listener that drops the outcome (the
    pipeline's tracing alone), and the recorder (fastest of the reps)."""
    pipeline, raw = await _pipeline(state_dir)
    recorder = _recorder(pipeline, state_dir / "rec.jsonl")
    recorder.start()

    async def once(listener: Any) -> float:
        pipeline.on_outcome = listener
        started = time.thread_time()
        for _ in range(calls):
            await pipeline.handle(Event.CREATE_CONTAINER, raw, None, time.monotonic() + 2)
            await asyncio.sleep(0)  # the loop's next turn: the recorder encodes and sends
        return (time.thread_time() - started) / calls * 1e6

    off, traced, on = [], [], []
    try:
        for _ in range(REPS):
            off.append(await once(None))
            traced.append(await once(lambda outcome: None))
            on.append(await once(recorder.call))
            while recorder.backlog():  # the renderer catches up outside the figures
                await asyncio.sleep(0.05)
    finally:
        await recorder.close()
    if recorder.status()["dropped"]:
        print(f"  (the renderer fell behind: {recorder.status()['dropped']} line(s) dropped)")
    return min(off), min(traced), min(on)


def _best(fn: Callable[[], object], n: int) -> float:
    best = float("inf")
    for _ in range(REPS):
        started = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - started) / n)
    return best * 1e6


def _old_pickle(outcome: Outcome) -> bytes:
    out = io.BytesIO()
    _Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(("call", outcome))
    return out.getvalue()


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="crihook-bench-") as tmp:
        off, traced, on = await _loop_cpu(Path(tmp))
    print(
        f"event loop CPU per CreateContainer (4 hooks): {off:.1f} µs unrecorded, {on:.1f} µs "
        f"recorded: +{on - off:.1f} µs (of which +{traced - off:.1f} µs the pipeline's "
        f"tracing for any listener, +{on - traced:.1f} µs the recorder)"
    )
    with tempfile.TemporaryDirectory(prefix="crihook-bench-") as tmp:
        outcome, recorder = await _outcome(Path(tmp))
    record = call_record(outcome)
    encoded, _ = recorder._encoded(("call", outcome))
    line = encode_line(call_line(outcome, recorder.redactor))
    print(
        f"CreateContainer, 4 hooks: {len(outcome.received):,} B request, "
        f"{len(encoded):,} B frame, {len(line):,} B line; µs per call (fastest of {REPS}):"
    )
    rows = [
        (
            "on the loop: Recorder._encoded (all of it)",
            lambda: recorder._encoded(("call", outcome)),
        ),
        ("  of which: call_record(outcome)", lambda: call_record(outcome)),
        ("  of which: pickle of the CallRecord", lambda: pickle.dumps(("call", tuple(record)), 5)),
        ("before: the whole Outcome pickled", lambda: _old_pickle(outcome)),
    ]
    for name, fn in rows:
        print(f"  {_best(fn, 3000):8.1f}  {name}")
    render = _best(lambda: encode_line(call_line(record, recorder.redactor)), 300)
    print(f"  {render:8.1f}  in the renderer: the line rendered and redacted")


if __name__ == "__main__":
    asyncio.run(main())
