"""The composition root: builds every part from the settings and runs them.

Start-up order: state directory held and socket listening, before the imports (h2 data path,
proxy/early.py: a connection waits in its backlog) → node topology read (`--sysfs-root`) →
store loaded from disk → in-process hooks built, metrics listening (`--metrics-listen`) and
hooks started (config errors stop here, exit 2, the socket removed) → socket served (bound
here on the grpc data path; UNAVAILABLE until ready) → systemd told READY → runtime
awaited with backoff → store reconciled with the runtime (container resources as the
runtime reports them where an update may not be recorded, proxy/state/unsettled.py) → every hook
synchronized (state, node facts, pods, containers) and its repairs sent → plugins loaded
(they get the same snapshot when they connect) → ready. Shutdown (SIGTERM/SIGINT):
stop accepting, let calls in flight finish within the grace, let the updates they issued go
out (briefly), close hooks and channels.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from google.protobuf.message import DecodeError

from crihook import __version__
from crihook.api.cri.v1 import api_pb2
from crihook.hooks.node import (
    Host,
    HostFiles,
    LinuxFiles,
    LinuxHost,
    LinuxPodCgroups,
    LinuxStaging,
    Netlink,
    PodCgroups,
    PyrouteNetlink,
    Staging,
    Topology,
)
from crihook.hooks.node.mounts import MountTable
from crihook.hooks.spec import ContainerState, ContainerUpdate, ContainerView, PodView
from crihook.hooks.spec.limits import node_hugepage_sizes
from crihook.proxy.chain.chain import Chain
from crihook.proxy.chain.local_hooks import host_problems, load_local_hook
from crihook.proxy.chain.merge import stamp
from crihook.proxy.chain.plugins import PluginDirectory, crihook_sockets
from crihook.proxy.config import Settings
from crihook.proxy.core.memory_trim import MemoryTrim
from crihook.proxy.core.pipeline import Pipeline
from crihook.proxy.core.placement import Placement
from crihook.proxy.core.sync import RuntimeView, Synchronizer, SyncQueries, SyncReport
from crihook.proxy.cri.handler import Serving
from crihook.proxy.cri.outcome import Outcome
from crihook.proxy.cri.readiness import Readiness
from crihook.proxy.cri.runtime import RuntimeCallFailed
from crihook.proxy.early import Claimed, claim
from crihook.proxy.ops import call_log, sdnotify
from crihook.proxy.ops.call_log import CallLog
from crihook.proxy.ops.node_doc import NODE_FILE, node_doc, read_topology, write_node_doc
from crihook.proxy.ops.watchdog import keep_alive
from crihook.proxy.sockets import owner_only, prepare_listen_path, secure_socket
from crihook.proxy.state.store import Store
from crihook.proxy.state.unsettled import UnsettledRuntime
from crihook.proxy.wire.grpc.runtime_client import RuntimeClient
from crihook.proxy.wire.h2.runtime_client import Flusher, H2RuntimeClient
from crihook.proxy.wire.h2.server import H2Server

if TYPE_CHECKING:
    from crihook.proxy.ops.metrics import Metrics
    from crihook.proxy.ops.metrics_http import MetricsServer
    from crihook.proxy.record.recorder import Recorder

__all__ = ["App", "run"]

log = logging.getLogger(__name__)

# How often status.json (hooks, breakers, counters) is rewritten for `crihook state`.
STATUS_INTERVAL_SECONDS = 1.0
# How often crihook checks that its socket is still the one it serves on.
SOCKET_CHECK_SECONDS = 1.0
# How long readiness waits for the plugins loaded at start to connect: a plugin that is up
# should see the first call; one that is down must not keep the node from starting.
PLUGIN_CONNECT_WAIT_SECONDS = 2.0
# At shutdown, how long the updates the last calls issued may take to go out.
UPDATES_DRAIN_SECONDS = 3.0


class App:
    def __init__(self, settings: Settings, node: Topology | None = None) -> None:
        self.settings = settings
        self.node = node if node is not None else read_topology(settings)
        self.readiness = Readiness()
        self.readiness.set(False, f"waiting for the runtime at {settings.runtime.endpoint}")
        self.runtime = (
            H2RuntimeClient(settings.runtime, Flusher())
            if settings.server.data_path == "h2"
            else RuntimeClient(settings.runtime)
        )
        self.store = Store(
            settings.state_dir,
            journal_in_thread(settings.state_dir),
            status_provider=self.status,
        )
        self.chain = Chain(settings.chain, self.store.hook_state)
        placement = Placement(settings.node.topology_policy, self.node.numa_nodes)
        self.memory_trim = MemoryTrim()
        self.pipeline = Pipeline(
            UnsettledRuntime(self.runtime, self.store.unsettled),
            self.chain,
            self.store,
            self.readiness,
            placement,
            node_hugepage_sizes(self.node),
            read_back=settings.runtime.read_back,
            updates_after_answer=settings.runtime.updates == "after-answer",
            after_large=self.memory_trim.after,
            describe_updates=settings.record.file is not None,  # a recording: the only reader
        )
        # The seams hooks learn the node through; noted per call while recording.
        host: Host = LinuxHost(settings.node.cgroup_root)
        files: HostFiles = LinuxFiles()
        cgroups: PodCgroups = LinuxPodCgroups(settings.node.cgroup_root)
        netlink: Netlink = PyrouteNetlink()
        staging: Staging = LinuxStaging(str(settings.node.staging_dir))
        queries: SyncQueries = RuntimeView(self.runtime)
        self.recorder: Recorder | None = None
        if settings.record.file is not None:
            # Imported only to record: start-up loads what serving needs first.
            from crihook.proxy.core.observe import (
                ObservedCgroups,
                ObservedFiles,
                ObservedHost,
                ObservedNetlink,
                ObservedQueries,
                ObservedStaging,
            )
            from crihook.proxy.record.recorder import Recorder

            host, files = ObservedHost(host), ObservedFiles(files)
            cgroups = ObservedCgroups(cgroups)
            netlink = ObservedNetlink(netlink)
            staging = ObservedStaging(staging)
            queries = ObservedQueries(queries)  # delegates what it does not observe
            self.recorder = Recorder(
                settings.record,
                self._header_line,
                self._snapshot_line,
                self.pipeline.quiesced,
                self.pipeline.next_seq,
            )
        self._files = files
        self.sync = Synchronizer(
            self.chain,
            self.store,
            queries,
            self.runtime,
            self.pipeline.updater,
            self.node,
            host,
            settings.node.topology_policy,
            settings.node.topology_scope,
            files=files,
            cgroups=cgroups,
            netlink=netlink,
            staging=staging,
            on_sync=self._record_sync if self.recorder is not None else None,
            quiesced=self.pipeline.quiesced,
        )
        self.metrics: Metrics | None = None
        if settings.server.metrics_listen is not None:
            from crihook.proxy.ops.metrics import Metrics, Sources  # prometheus_client: only then

            self.metrics = Metrics(
                Sources(
                    self.chain,
                    self.store,
                    self.readiness,
                    lambda: self.pipeline.updater.failures,
                    lambda: self.sync.failures,
                    refused_dropins=lambda: {d.value: n for d, n in self.plugins.refusals.items()},
                    changed_after=lambda: (
                        self.pipeline.read_back.counts if self.pipeline.read_back else {}
                    ),
                    update_window=lambda: self.pipeline.updater.window,
                )
            )
        # Who hears each intercepted call's outcome; with none, calls skip the tracing.
        listeners: list[Callable[[Outcome], None]] = []
        if self.recorder is not None:
            listeners.append(self.recorder.call)
        if self.metrics is not None:
            listeners.append(self.metrics.outcome)
        if call_log.log.isEnabledFor(logging.INFO):
            listeners.append(CallLog().outcome)
        # These two are built from the pipeline (the recorder takes its quiesced and next_seq,
        # the synchronizer its updater): they are told after it is made.
        self.pipeline.on_outcome = _tell_all(listeners)
        self.pipeline.on_unknown_outcome = self.sync.reconcile_soon
        builtin = {h.base_name for h in settings.chain.hooks}
        self.plugins = PluginDirectory(
            settings.chain.plugins_dir,
            self.chain,
            self._snapshot,
            builtin,
            on_sync_updates=self._plugin_sync_updates,
            on_change=self._record_plugins if self.recorder is not None else None,
            sockets=crihook_sockets(settings),
        )
        self.started_at = time.time()
        self.stopped_at: float | None = None
        """Set when the shutdown begins: the last status.json says crihook is not running."""
        self._tasks: list[asyncio.Task[Any]] = []
        self.server_lost = False
        """The server stopped serving by itself: `run` exits 1, so that crihook is restarted."""

    def build_hooks(self) -> None:
        """Build the in-process chain; ConfigError if a hook cannot be loaded."""
        entries = []
        for hook_settings in self.settings.chain.hooks:
            hook = load_local_hook(hook_settings)
            entries.append(Chain.entry(hook, hook_settings))
        self.chain.set_builtin(entries)

    def _snapshot(
        self,
    ) -> tuple[list[PodView], list[ContainerView], Mapping[str, ContainerState]]:
        pods, containers = self.store.snapshot()
        return pods, containers, self.store.container_states()

    def _restored(self, response: bytes) -> None:
        """RestorePod succeeded: the pod and its containers came back without any call
        crihook intercepts; the store and every hook learn them from the runtime."""
        try:
            sandbox_id = api_pb2.RestorePodResponse.FromString(response).pod_sandbox_id
        except DecodeError:
            sandbox_id = ""
        if not sandbox_id:
            log.error("RestorePod answered without a sandbox id: its pod stays unknown")
            return
        self.sync.restored(sandbox_id)

    async def _plugin_sync_updates(self, hook: str, updates: Sequence[ContainerUpdate]) -> None:
        permitted = self.chain.permitted_updates(hook, updates)
        await self.pipeline.updater.send(stamp(hook, permitted), {"method": "Synchronize"})

    # --- recording -----------------------------------------------------------------------
    def _header_line(self) -> dict[str, Any]:
        from crihook.proxy.record.header import header_line
        from crihook.proxy.record.recorder import device_pool_facts

        pools, facts = device_pool_facts(self.settings, self._files)
        redacted = not self.settings.record.secrets
        plugins = [entry.settings for entry in self.chain.plugins]
        return header_line(self.settings, self.node, pools, facts, time.time(), redacted, plugins)

    def _record_plugins(self) -> None:
        """The drop-ins changed the plugins in the chain: a replay stands in for them from
        here on."""
        assert self.recorder is not None
        plugins = [entry.settings for entry in self.chain.plugins]
        from crihook.proxy.record.header import plugins_line

        self.recorder.line(plugins_line(self.pipeline.next_seq(), time.time(), plugins))

    def _snapshot_line(self, seq: int) -> dict[str, Any]:
        from crihook.proxy.record.header import snapshot_line

        assert self.recorder is not None
        return snapshot_line(seq, time.time(), self.store, self.chain, self.recorder.redactor)

    def _record_sync(self, report: SyncReport) -> None:
        assert self.recorder is not None
        from crihook.proxy.record.header import sync_line

        line = sync_line(
            "sync",
            self.pipeline.next_seq(),
            time.time(),
            report.reason,
            report.pods,
            report.containers,
            report.container_states,
            report.hook_states,
            report.updates,
            report.observed,
            self.recorder.redactor,
        )
        self.recorder.line(line)

    def status(self) -> dict[str, Any]:
        return {
            "version": __version__,
            "started_at": self.started_at,
            "updated_at": time.time(),
            "running": self.stopped_at is None,
            "stopped_at": self.stopped_at,
            "ready": self.readiness.ready and self.stopped_at is None,
            "runtime": self.settings.runtime.endpoint,
            "dry_run": self.settings.chain.dry_run,
            "hooks": self.chain.status(),
            "plugins": self.plugins.status(),
            "update_failures": self.pipeline.updater.failures,
            "updates_due": self.pipeline.updater.due(),
            "synchronize_failures": self.sync.failures,
            "store": self.store.status(),
            "recording": self.recorder.status() if self.recorder is not None else None,
        }

    async def _write_node_doc(self) -> None:
        """node.json, for `crihook state --cpus`: a failure costs only the map."""
        doc = node_doc(self.settings, self.node)
        try:
            await asyncio.to_thread(write_node_doc, self.settings.state_dir, doc)
        except OSError as exc:
            log.warning(
                "cannot write %s: %s (only `crihook state --cpus` reads it)",
                self.settings.state_dir / NODE_FILE,
                exc,
            )

    async def _become_ready(self) -> None:
        while True:
            await self.runtime.wait_until_ready()
            try:
                kept, rebuilt, dropped = await self.store.reconcile(self.runtime)
                in_doubt = self.store.in_doubt
                differed = await self.sync.refresh_resources(in_doubt)
                log.info(
                    "store reconciled with the runtime: %d kept, %d rebuilt, %d dropped; "
                    "%d container(s) run with other resources than recorded (of %d asked: "
                    "updated when crihook stopped)",
                    kept,
                    rebuilt,
                    dropped,
                    differed,
                    len(in_doubt),
                )
                # The states as the reconcile just listed them: no third list call.
                await self.sync.synchronize("start", self.store.container_states())
                break
            except RuntimeCallFailed as exc:  # the runtime went away again mid-way
                log.warning(
                    "reconciling with the runtime failed (%s: %s); retrying",
                    exc.status.code.name,
                    exc.status.details,
                )
                await asyncio.sleep(0.5)
        try:
            # On disk before kubelet is served; appended, not compacted (a full node's
            # store.json is rewritten in the background, not while kubelet waits).
            await self.store.flush(compact=False)
            self.store.write_behind()  # the compaction a crash's leftover journals want
        except OSError:
            # The reconciled store is in memory; the writer keeps retrying in the background.
            log.error("serving with the state not written: %s", self.store.last_error)
            self.store.write_behind()
        await self._start_plugins()
        self._tasks.append(
            asyncio.create_task(
                self.sync.forget_removed_every(self.settings.runtime.reconcile_seconds),
                name="crihook-reconcile",
            )
        )
        # What start-up built (modules, grpc, protobuf descriptors, the store) lives as long
        # as the process: frozen, full collections stop walking it again and again. No full
        # collection first: at 1,000 containers it found nothing to free and cost 60-120 ms
        # before ready (bench/README.md, start-up).
        gc.freeze()
        self.readiness.set(True)
        sdnotify.status("serving")
        log.info("ready")

    async def _start_plugins(self) -> None:
        """Load the drop-ins now the store is reconciled, give the plugins a moment to
        connect, then keep watching the directory."""
        await self.plugins.scan()
        deadline = time.monotonic() + PLUGIN_CONNECT_WAIT_SECONDS
        while time.monotonic() < deadline and not self.plugins.all_connected():
            await asyncio.sleep(0.05)
        self._tasks.append(asyncio.create_task(self.plugins.run(), name="crihook-plugin-dir"))

    async def _status_writer(self) -> None:
        """Never ends before shutdown: write_status() counts and logs its own I/O errors;
        anything else (a bug building the status) is logged once and retried."""
        failing = False
        while True:
            await asyncio.sleep(STATUS_INTERVAL_SECONDS)
            try:
                await self.store.write_status()
            except Exception:
                self.store.status_write_failures += 1
                if not failing:
                    log.exception("building the status failed; retrying every second")
                failing = True
            else:
                failing = False

    async def _start_server(self, path: Path, listener: socket.socket | None) -> Serving:
        """The kubelet-facing server of the configured data path, listening on `path` (on
        `listener`, bound there already, for the h2 data path)."""
        settings = self.settings
        observers = {"RestorePod": self._restored}
        recorder = self.recorder if settings.record.all else None
        if isinstance(self.runtime, H2RuntimeClient):
            record = recorder.passthrough if recorder is not None else None
            h2 = H2Server(
                self.runtime,
                self.pipeline,
                self.readiness,
                settings.server.max_message_bytes,
                observers=observers,
                record=record,
                metrics=self.metrics,
            )
            await h2.start(path, listener)
            return h2
        from crihook.proxy.wire.grpc.server import build_server  # the grpc data path only

        server = build_server(
            self.runtime,
            self.pipeline,
            self.readiness,
            settings.server.max_message_bytes,
            observers=observers,
            recorder=recorder,
            metrics=self.metrics,
        )
        server.add_insecure_port(f"unix:{path}")
        await server.start()
        serving: Serving = server  # grpc.aio.Server (grpcio has no type hints)
        return serving

    async def _watch_socket(self, path: Path, inode: int, stop: asyncio.Event) -> None:
        """grpc's aio server can stop serving by itself: in grpcio 1.85 a request whose method
        name is not UTF-8 ends its main loop, and the socket file goes with the listener.
        Rather than stay up and deaf, crihook then stops and exits 1 (systemd restarts it)."""
        while True:
            await asyncio.sleep(SOCKET_CHECK_SECONDS)
            if stop.is_set():  # stopping: the server takes its socket away
                return
            try:
                same = os.stat(path).st_ino == inode  # a stat of a local path: no I/O wait
            except FileNotFoundError:
                same = False
            if not same:
                log.error(
                    "the socket %s is gone: the gRPC server no longer serves; stopping, exit 1",
                    path,
                )
                self.server_lost = True
                stop.set()
                return

    async def _start(self, listener: socket.socket | None) -> tuple[Serving, MetricsServer | None]:
        """Everything up to the server taking calls (UNAVAILABLE until ready): the store
        loaded, hooks built and started, the metrics and the kubelet socket served."""
        settings = self.settings
        self.store.load()
        self.build_hooks()
        problems = host_problems(settings.chain.hooks, settings.node.cgroup_root)
        if problems:
            raise problems[0]  # before anything is served: exit 2, naming the option
        await self._write_node_doc()
        metrics_server = None
        if self.metrics is not None:
            assert settings.server.metrics_listen is not None
            from crihook.proxy.ops.metrics_http import MetricsServer

            metrics_server = MetricsServer(
                settings.server.metrics_listen,
                self.metrics.snapshot,
                settings.server.socket_mode,
                settings.server.socket_group,
            )
            await metrics_server.start()  # ConfigError if it cannot listen: exit 2, nothing started
        for entry in self.chain.entries:
            await entry.hook.start()
        if self.recorder is not None:
            self.recorder.start()
            log.info(
                "recording intercepted calls%s to %s%s",
                " and pass-through calls" if settings.record.all else "",
                settings.record.file,
                " (secrets kept)" if settings.record.secrets else "",
            )
        path = settings.server.socket_path
        if listener is not None:
            return await self._start_server(path, listener), metrics_server
        prepare_listen_path(path)
        with owner_only():
            server = await self._start_server(path, None)
        secure_socket(path, settings.server.socket_mode, settings.server.socket_group)
        return server, metrics_server

    async def serve(self, stop: asyncio.Event, claimed: Claimed | None = None) -> None:
        """`claimed`: the state directory held and the socket listening, done before the
        imports (proxy/early.py); None: done here."""
        settings = self.settings
        claimed = claimed if claimed is not None else claim(settings)
        state_lock = claimed.state_lock  # held until the process ends
        path = settings.server.socket_path
        try:
            server, metrics_server = await self._start(claimed.listener)
        except BaseException:
            claimed.abandon()
            raise
        claimed.listener = None  # the server's now
        log.info(
            "crihook %s listening on %s (data path %s), runtime %s%s",
            __version__,
            settings.server.listen,
            settings.server.data_path,
            settings.runtime.endpoint,
            f", images {settings.runtime.image_endpoint}"
            if settings.runtime.image_endpoint
            else "",
        )
        sdnotify.ready()
        self._tasks = [
            asyncio.create_task(self._become_ready(), name="crihook-become-ready"),
            asyncio.create_task(self._status_writer(), name="crihook-status-writer"),
            asyncio.create_task(keep_alive(), name="crihook-watchdog"),
            asyncio.create_task(
                self._watch_socket(path, os.stat(path).st_ino, stop), name="crihook-socket-watch"
            ),
        ]
        try:
            await stop.wait()
        finally:
            log.info(
                "stopping: letting calls in flight finish (grace %gs)",
                settings.server.shutdown_grace_seconds,
            )
            sdnotify.stopping()
            self.stopped_at = time.time()
            await server.stop(settings.server.shutdown_grace_seconds)
            # The calls are done: what they issued goes out, briefly, before the runtime's
            # channel closes; what cannot is sent again by the next start's synchronize.
            await self.pipeline.updater.close(UPDATES_DRAIN_SECONDS)
            for task in self._tasks:
                task.cancel()
            for task in self._tasks:
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                except Exception:  # a bug: it ended early; the shutdown goes on
                    log.exception("task %s had failed", task.get_name())
            await self.sync.close()
            if self.pipeline.read_back is not None:
                await self.pipeline.read_back.close()
            await self.plugins.close()
            await self.chain.close()
            if self.recorder is not None:
                await self.recorder.close()
            await self.memory_trim.close()
            await self.store.close()
            state_lock.close()  # the store wrote its last: `crihook state` says "stopped"
            await self.runtime.close()
            if metrics_server is not None:
                await metrics_server.close()
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            log.info("stopped")


def _tell_all(
    listeners: Sequence[Callable[[Outcome], None]],
) -> Callable[[Outcome], None] | None:
    """One `on_outcome` for every listener; None when there is none."""
    if len(listeners) <= 1:
        return listeners[0] if listeners else None

    def tell(outcome: Outcome) -> None:
        for listener in listeners:
            listener(outcome)

    return tell


def journal_in_thread(state_dir: Path) -> bool:
    """Whether the store writes its hook journal lines from a worker thread: its state
    directory is on a file system that can block (network, FUSE). The mount table is read
    here, so that proxy/state touches no /proc."""
    mounts = MountTable()
    try:
        blocking = mounts.blocking_type(str(state_dir.resolve()))
    finally:
        mounts.close()
    if blocking is not None:
        log.info(
            "the state directory %s is on a %s file system: hook journal lines are written "
            "from a worker thread",
            state_dir,
            blocking,
        )
    return blocking is not None


async def run(settings: Settings, claimed: Claimed | None = None) -> int:
    """Serve until SIGTERM/SIGINT; 0 on a clean stop, 1 when the server stopped serving.
    `claimed`: the state directory and socket taken before the imports (proxy/early.py)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        app = App(settings)
    except BaseException:
        if claimed is not None:
            claimed.abandon()
        raise
    await app.serve(stop, claimed)
    # Stopped cleanly. A stop signal repeated from here to the exit (the loop's teardown,
    # the interpreter's) must not turn that into death by signal: ignored from now on.
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.remove_signal_handler(sig)
        signal.signal(sig, signal.SIG_IGN)
    return 1 if app.server_lost else 0
