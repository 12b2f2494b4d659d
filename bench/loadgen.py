"""Closed-loop gRPC load generator (one process; its CPU is not counted as crihook's).

``concurrency`` workers share one channel (one HTTP/2 connection, as kubelet has) and each
sends the next call as soon as its previous one returns. Requests are pre-encoded bytes sent
with identity serializers, so the generator does no protobuf work. After ``warmup`` seconds
the measured window opens: calls *completing* inside it are counted and their latencies kept;
at both edges of the window the generator also reads the CPU time (utime+stime, /proc/<pid>/stat)
of the processes named with ``--watch`` and its own, so CPU per call covers exactly the
window.

``--unique-marker M`` makes every request distinct (real runtimes refuse two containers with
the same name): every occurrence of the ASCII marker in the payload is replaced by a
zero-padded counter of the same width, so no length prefix changes.

``--payload`` given n times: worker w sends the (w mod n)-th. bench.run gives a CreateContainer
cell at concurrency c one request per pod for c pods, so each worker sends into a pod of its
own: crihook serializes one pod's calls (as kubelet sends them), and c workers into one pod
would measure that lock. The counter is shared: requests stay unique across workers.

``--lifecycle`` measures a pod sandbox's life instead of one call: the method is
RunPodSandbox, and each "call" is RunPodSandbox then StopPodSandbox of the sandbox it made,
timed together; RemovePodSandbox follows, untimed (its CPU is in the window's CPU per call).
``--min-count N`` keeps the window open until N calls completed (slow calls: a sandbox takes
a few hundred ms).

    python -m bench.loadgen --target unix:///run/x.sock \
        --method /runtime.v1.RuntimeService/ListContainers --payload req.bin \
        --concurrency 16 --warmup 0.5 --duration 2.5 --watch crihook=1234

Prints one JSON object on stdout (see ``summarize``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc

from bench.procfs import CLK_TCK, cpu_ticks
from crihook.api.cri.v1 import api_pb2

__all__ = ["main", "percentile", "request_factory"]


def percentile(sorted_values: list[int], pct: float) -> int:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return 0
    rank = max(1, math.ceil(pct / 100.0 * len(sorted_values)))
    return sorted_values[rank - 1]


def request_factory(
    payloads: Sequence[bytes], marker: bytes | None, start: int
) -> Callable[[int], bytes]:
    """What makes worker w's next request: the (w mod n)-th payload, its marker (if any)
    replaced by the next value of one counter all workers share."""
    count = len(payloads)
    if not marker:
        return lambda worker: payloads[worker % count]
    split = [payload.split(marker) for payload in payloads]
    if any(len(parts) < 2 for parts in split):
        raise SystemExit(f"unique marker {marker!r} does not occur in every payload")
    width = len(marker)
    counter = itertools.count(start)
    limit = 10**width

    def make(worker: int) -> bytes:
        n = next(counter)
        if n >= limit:
            raise SystemExit(f"unique counter overflowed {width} digits")
        return str(n).zfill(width).encode().join(split[worker % count])

    return make


def _system_busy_ticks() -> int:
    """Busy clock ticks of all CPUs together (first line of /proc/stat, minus idle+iowait)."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal [guest guest_nice: already in user/nice]
    return sum(values[:8]) - values[3] - values[4]


def _sample(watch: dict[str, list[int]]) -> dict[str, int]:
    ticks: dict[str, int] = {}
    for name, pids in watch.items():
        total = 0
        for pid in pids:
            # A process that went away counts as zero from then on.
            with contextlib.suppress(OSError):
                total += cpu_ticks(pid)
        ticks[name] = total
    return ticks


async def run(args: argparse.Namespace) -> dict[str, object]:
    payloads = [Path(path).read_bytes() for path in args.payload] or [b""]
    make_request = request_factory(
        payloads, args.unique_marker.encode() if args.unique_marker else None, args.start_index
    )
    watch: dict[str, list[int]] = {}
    for item in args.watch:
        name, _, pid = item.partition("=")
        watch.setdefault(name, []).append(int(pid))

    channel = grpc.aio.insecure_channel(args.target)
    try:
        await asyncio.wait_for(channel.channel_ready(), timeout=args.connect_timeout)
        call = channel.unary_unary(
            args.method,
            request_serializer=None,
            response_deserializer=None,
            _registered_method=True,
        )
        service = args.method.rsplit("/", 1)[0]
        stop_call = channel.unary_unary(f"{service}/StopPodSandbox", _registered_method=True)
        remove_call = channel.unary_unary(f"{service}/RemovePodSandbox", _registered_method=True)

        async def end_of_life(response: bytes) -> None:
            """StopPodSandbox (timed by the caller), then RemovePodSandbox (after the clock)."""
            sandbox = api_pb2.RunPodSandboxResponse.FromString(response).pod_sandbox_id
            request = api_pb2.StopPodSandboxRequest(pod_sandbox_id=sandbox).SerializeToString()
            await stop_call(request, timeout=timeout)

        async def remove(response: bytes) -> None:
            sandbox = api_pb2.RunPodSandboxResponse.FromString(response).pod_sandbox_id
            request = api_pb2.RemovePodSandboxRequest(pod_sandbox_id=sandbox)
            await remove_call(request.SerializeToString(), timeout=timeout)

        latencies: list[int] = []
        errors: Counter[str] = Counter()
        warmup_errors: Counter[str] = Counter()
        first_error: list[str] = []
        measuring = False
        stopping = False
        timeout = args.timeout
        clock = time.perf_counter_ns

        async def worker(index: int) -> None:
            while not stopping:
                request = make_request(index)
                started = clock()
                code = None
                response = None
                try:
                    response = await call(request, timeout=timeout)
                    if args.lifecycle:
                        await end_of_life(response)
                except grpc.aio.AioRpcError as exc:
                    code = exc.code().name
                    if not first_error:
                        first_error.append(f"{code}: {exc.details()}")
                elapsed = clock() - started
                if args.lifecycle and response is not None:
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        await remove(response)
                if measuring:
                    if code is None:
                        latencies.append(elapsed)
                    else:
                        errors[code] += 1
                elif code is not None:
                    warmup_errors[code] += 1

        workers = [
            asyncio.create_task(worker(i), name=f"loadgen-worker-{i}")
            for i in range(args.concurrency)
        ]
        await asyncio.sleep(args.warmup)
        before = _sample(watch)
        busy_before = _system_busy_ticks()
        own_before = os.times()
        window_start = clock()
        measuring = True
        await asyncio.sleep(args.duration)
        while len(latencies) + sum(errors.values()) < args.min_count:
            await asyncio.sleep(0.01)
        measuring = False
        window_end = clock()
        own_after = os.times()
        busy_after = _system_busy_ticks()
        after = _sample(watch)
        stopping = True
        await asyncio.gather(*workers)
    finally:
        await channel.close()

    window_s = (window_end - window_start) / 1e9
    latencies.sort()
    count = len(latencies)
    error_count = sum(errors.values())
    calls = count + error_count
    own_cpu = (own_after.user - own_before.user) + (own_after.system - own_before.system)
    return {
        "target": args.target,
        "method": args.method,
        "concurrency": args.concurrency,
        "request_bytes": max(len(payload) for payload in payloads),
        "payloads": len(payloads),
        "window_s": window_s,
        "count": count,
        "errors": error_count,
        "error_codes": dict(errors),
        "warmup_errors": sum(warmup_errors.values()),
        "first_error": first_error[0] if first_error else None,
        "rps": count / window_s if window_s else 0.0,
        "latency_us": {
            "p50": percentile(latencies, 50) / 1000,
            "p90": percentile(latencies, 90) / 1000,
            "p99": percentile(latencies, 99) / 1000,
            "mean": (sum(latencies) / count / 1000) if count else 0.0,
            "min": latencies[0] / 1000 if count else 0.0,
            "max": latencies[-1] / 1000 if count else 0.0,
        },
        # CPU seconds of each watched group over the window, and per call (µs).
        "cpu_s": {name: (after[name] - before[name]) / CLK_TCK for name in watch},
        "cpu_us_per_call": {
            name: ((after[name] - before[name]) / CLK_TCK * 1e6 / calls) if calls else None
            for name in watch
        },
        "loadgen_cpu_us_per_call": (own_cpu * 1e6 / calls) if calls else None,
        # Whole machine, all processes: busy CPUs (cores) during the window. What the watched
        # processes and the load generator do not account for is someone else's load.
        "system_busy_cores": (busy_after - busy_before) / CLK_TCK / window_s,
        "other_busy_cores": (
            (busy_after - busy_before) / CLK_TCK
            - own_cpu
            - sum(after[name] - before[name] for name in watch) / CLK_TCK
        )
        / window_s,
        "clk_tck": CLK_TCK,
    }


def command(
    target: str,
    method: str,
    payloads: Sequence[str],
    concurrency: int,
    warmup: float,
    duration: float,
    *,
    marker: str | None = None,
    start: int = 0,
) -> list[str]:
    """The command line that runs this load generator (from the repository's root) with
    these options (`payloads`: files, worker w sends the (w mod n)-th); callers add what else
    they need (`--watch`, `--lifecycle`)."""
    argv = [
        sys.executable, "-m", "bench.loadgen", "--target", target, "--method", method,
        *(arg for path in payloads for arg in ("--payload", path)),
        "--concurrency", str(concurrency), "--warmup", str(warmup), "--duration", str(duration),
    ]  # fmt: skip
    if marker:
        argv += ["--unique-marker", marker, "--start-index", str(start)]
    return argv


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.loadgen", description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True, help="gRPC target, e.g. unix:///tmp/x.sock")
    p.add_argument("--method", required=True, help="full method path /pkg.Service/Method")
    p.add_argument(
        "--payload",
        action="append",
        default=[],
        help="file with the encoded request (default: empty message); repeat it to give the "
        "workers different requests: worker w sends the (w mod n)-th (a pod per worker)",
    )
    p.add_argument("--unique-marker", help="ASCII marker in the payload replaced by a counter")
    p.add_argument("--start-index", type=int, default=0, help="first value of the counter")
    p.add_argument("--concurrency", "-c", type=int, default=1)
    p.add_argument("--warmup", type=float, default=0.5, help="seconds before measuring")
    p.add_argument("--duration", type=float, default=2.5, help="measured seconds")
    p.add_argument("--timeout", type=float, default=30.0, help="per-call deadline, seconds")
    p.add_argument(
        "--lifecycle",
        action="store_true",
        help="RunPodSandbox then StopPodSandbox timed as one call (RemovePodSandbox untimed)",
    )
    p.add_argument("--min-count", type=int, default=0, help="measure at least this many calls")
    p.add_argument("--connect-timeout", type=float, default=10.0)
    p.add_argument(
        "--watch",
        action="append",
        default=[],
        metavar="NAME=PID",
        help="sample this pid's CPU over the window; repeat a NAME to sum several pids",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency, but stay usable without
        result = asyncio.run(run(args))
    else:
        result = uvloop.run(run(args))
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
