"""One plugin call in isolation: crihook's RemoteHook against the example plugin process.

    python -m bench.plugin_rtt [--calls 3000] [--plugin-env GRPC_EXPERIMENTS=] [--unary]

Starts `crihook.hooks.examples.annotate` as a separate process, connects a RemoteHook to it
the way crihook does, and makes pre-CreateContainer calls one after another with the bench's
kubelet-shaped request (a new container view per call, as the pipeline makes one). Prints
the p50/p90 round trip and the CPU per call of this process (crihook's side) and of the
plugin, from /proc. Without the proxy, the runtime and the load generator on the same two
cores, it shows what the plugin protocol itself costs.
"""

from __future__ import annotations

import os

from crihook.grpc_tuning import CLASSIC_ENDPOINTS

# This process plays crihook's side: the same grpc endpoints as `crihook serve` (cli.py).
os.environ.setdefault("GRPC_EXPERIMENTS", CLASSIC_ENDPOINTS)

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import uvloop

from bench.payloads import fake_create_container_request
from bench.procfs import cpu_seconds
from crihook.api.cri.v1 import api_pb2
from crihook.hooks.remote.client import RemoteHook
from crihook.hooks.sdk import MemoryState
from crihook.hooks.spec import Event, HookContext, Stage
from crihook.hooks.spec.views import container_view_from_config, pod_view_from_config
from crihook.proxy.config import HookSettings


async def _measure(args: argparse.Namespace, sock: Path, plugin_pid: int) -> dict[str, float]:
    hook = RemoteHook(
        HookSettings(name="50-annotate", endpoint=f"unix://{sock}", timeout_ms=2000),
        lambda: ((), (), {}),
    )
    await hook.start()
    deadline = time.monotonic() + 10
    while not hook.connected:
        if time.monotonic() > deadline:
            raise SystemExit(f"plugin did not come up: {hook.last_error}")
        await asyncio.sleep(0.02)
    if args.unary:
        hook._conn.streaming = False  # type: ignore[union-attr]  # bench-only switch
    request = api_pb2.CreateContainerRequest.FromString(fake_create_container_request())
    pod = pod_view_from_config(request.pod_sandbox_id, request.sandbox_config)

    def ctx() -> HookContext:
        container = container_view_from_config("", pod, request.config)
        return HookContext(
            Event.CREATE_CONTAINER, Stage.PRE, pod, container, request, None, MemoryState(), 2.0
        )

    for _ in range(300):  # warm-up
        await hook.call(ctx())
    latencies = []
    mine, theirs = cpu_seconds(os.getpid()), cpu_seconds(plugin_pid)
    for _ in range(args.calls):
        started = time.perf_counter()
        adjustment = await hook.call(ctx())
        latencies.append(time.perf_counter() - started)
        assert adjustment is not None
    mine, theirs = cpu_seconds(os.getpid()) - mine, cpu_seconds(plugin_pid) - theirs
    await hook.close()
    latencies.sort()
    return {
        "p50_us": statistics.median(latencies) * 1e6,
        "p90_us": latencies[int(len(latencies) * 0.9)] * 1e6,
        "crihook_cpu_us": mine / args.calls * 1e6,
        "plugin_cpu_us": theirs / args.calls * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.plugin_rtt", description=__doc__)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--unary", action="store_true", help="one unary RPC per call")
    parser.add_argument(
        "--plugin-env", action="append", default=[], metavar="KEY=VALUE",
        help="extra environment of the plugin process",
    )  # fmt: skip
    args = parser.parse_args()
    env = dict(os.environ)
    env.update(kv.split("=", 1) for kv in args.plugin_env)
    with tempfile.TemporaryDirectory(prefix="crihook-rtt-") as tmp:
        sock = Path(tmp) / "annotate.sock"
        argv = [sys.executable, "-m", "crihook.hooks.examples.annotate", "--socket", str(sock)]
        argv += ["--key", "bench.crihook.io/p", "--value", "x"]
        plugin = subprocess.Popen(argv, env=env, stderr=subprocess.DEVNULL)
        try:
            result = uvloop.run(_measure(args, sock, plugin.pid))
        finally:
            plugin.terminate()
            plugin.wait(10)
    print(" ".join(f"{k}={v:.0f}" for k, v in result.items()))


if __name__ == "__main__":
    main()
