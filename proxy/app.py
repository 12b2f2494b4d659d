"""The composition root: builds every part from the settings and runs them.

Start-up order: store loaded from disk → hooks built (config errors stop here, exit 2) →
socket bound and serving at once (UNAVAILABLE until ready) → systemd told READY → runtime
awaited with backoff → store reconciled with the runtime → ready. Shutdown (SIGTERM/SIGINT):
stop accepting, let calls in flight finish within the grace, close hooks and channels.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import time
from typing import Any

import grpc.aio

from crihook import __version__
from crihook.proxy import sdnotify
from crihook.proxy.chain import Chain
from crihook.proxy.config import Settings
from crihook.proxy.local_hooks import load_local_hook
from crihook.proxy.passthrough import Readiness
from crihook.proxy.pipeline import Pipeline
from crihook.proxy.plugins import PluginDirectory
from crihook.proxy.runtime_client import RuntimeClient
from crihook.proxy.server import build_server
from crihook.proxy.sockets import prepare_listen_path, secure_socket
from crihook.proxy.store import Store

__all__ = ["App", "run"]

log = logging.getLogger(__name__)

# How often status.json (hooks, breakers, counters) is rewritten for `crihook state`.
STATUS_INTERVAL_SECONDS = 1.0


class App:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.readiness = Readiness()
        self.readiness.set(False, f"waiting for the runtime at {settings.runtime.endpoint}")
        self.runtime = RuntimeClient(settings.runtime)
        self.store = Store(settings.state_dir)
        self.chain = Chain(settings.chain, self.store.hook_state)
        self.pipeline = Pipeline(self.runtime, self.chain, self.store, self.readiness)
        builtin = {h.base_name for h in settings.chain.hooks}
        self.plugins = PluginDirectory(
            settings.chain.plugins_dir, self.chain, self.store.snapshot, builtin
        )
        self.store.status_provider = self.status
        self.started_at = time.time()
        self._tasks: list[asyncio.Task[Any]] = []

    def build_hooks(self) -> None:
        """Build the in-process chain; ConfigError if a hook cannot be loaded."""
        entries = []
        for hook_settings in self.settings.chain.hooks:
            hook = load_local_hook(hook_settings)
            entries.append(Chain.entry(hook, hook_settings))
        self.chain.set_builtin(entries)

    def status(self) -> dict[str, Any]:
        return {
            "version": __version__,
            "started_at": self.started_at,
            "ready": self.readiness.ready,
            "runtime": self.settings.runtime.endpoint,
            "dry_run": self.settings.chain.dry_run,
            "hooks": self.chain.status(),
            "plugins": self.plugins.status(),
            "update_failures": self.pipeline.update_failures,
        }

    async def _become_ready(self) -> None:
        while True:
            await self.runtime.wait_until_ready()
            try:
                kept, rebuilt, dropped = await self.store.reconcile(self.runtime)
                break
            except grpc.aio.AioRpcError as exc:  # the runtime went away again mid-way
                log.warning(
                    "reconciling the store failed (%s: %s); retrying",
                    exc.code().name,
                    exc.details(),
                )
                await asyncio.sleep(0.5)
        await self.store.flush()
        log.info(
            "store reconciled with the runtime: %d kept, %d rebuilt, %d dropped",
            kept,
            rebuilt,
            dropped,
        )
        # What start-up built (modules, grpc, protobuf descriptors, the store) lives as long
        # as the process: frozen, full collections stop walking it again and again.
        gc.collect()
        gc.freeze()
        self.readiness.set(True)
        sdnotify.status("serving")
        log.info("ready")

    async def _status_writer(self) -> None:
        while True:
            await asyncio.sleep(STATUS_INTERVAL_SECONDS)
            await self.store.write_status()

    async def serve(self, stop: asyncio.Event) -> None:
        settings = self.settings
        self.store.load()
        self.build_hooks()
        for entry in self.chain.entries:
            await entry.hook.start()
        path = settings.server.socket_path
        prepare_listen_path(path)
        server = build_server(self.runtime, self.pipeline, self.readiness)
        server.add_insecure_port(f"unix:{path}")
        await server.start()
        secure_socket(path, settings.server.socket_mode, settings.server.socket_group)
        log.info(
            "crihook %s listening on %s, runtime %s%s",
            __version__,
            settings.server.listen,
            settings.runtime.endpoint,
            f", images {settings.runtime.image_endpoint}"
            if settings.runtime.image_endpoint
            else "",
        )
        sdnotify.ready()
        self._tasks = [
            asyncio.create_task(self._become_ready(), name="crihook-become-ready"),
            asyncio.create_task(self.plugins.run(), name="crihook-plugin-dir"),
            asyncio.create_task(self._status_writer(), name="crihook-status-writer"),
        ]
        try:
            await stop.wait()
        finally:
            log.info(
                "stopping: letting calls in flight finish (grace %gs)",
                settings.server.shutdown_grace_seconds,
            )
            sdnotify.stopping()
            await server.stop(settings.server.shutdown_grace_seconds)
            for task in self._tasks:
                task.cancel()
            for task in self._tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await self.plugins.close()
            await self.chain.close()
            await self.store.close()
            await self.runtime.close()
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            log.info("stopped")


async def run(settings: Settings) -> int:
    """Serve until SIGTERM/SIGINT; 0 on a clean stop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    app = App(settings)
    await app.serve(stop)
    return 0
