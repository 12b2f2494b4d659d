"""crihook's core recording in process, as `crihook serve --record` wires it, without sockets:
the pipeline and a chain built from a config document, the synchronizer, the seams wrapped
to note what hooks ask and change (a kernel in memory behind netlink), and the lines written
as the recorder writes them. For record → replay round trips in the unit tests; the same
thing through a real crihook process is in tests/integration/test_record_replay.py.

Plugins are in-process hooks put in the chain's plugin entries with a drop-in's settings
(`set_plugins`): the chain treats them as it treats `RemoteHook`s, and the recording notes
them as it notes drop-ins.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.spec import ContainerState, Event, Hook
from crihook.proxy.chain.chain import Chain
from crihook.proxy.chain.local_hooks import LocalHook, load_local_hook
from crihook.proxy.config import HookSettings, Settings, settings_from_toml
from crihook.proxy.core.observe import ObservedHost, ObservedNetlink, ObservedQueries
from crihook.proxy.core.pipeline import Pipeline
from crihook.proxy.core.sync import Synchronizer, SyncReport
from crihook.proxy.cri.outcome import Outcome
from crihook.proxy.cri.readiness import Readiness
from crihook.proxy.record.header import header_line, plugins_line, snapshot_line, sync_line
from crihook.proxy.record.lines import call_line, encode_line
from crihook.proxy.record.redact import Redactor
from crihook.proxy.state.store import Store
from tests.lab.kubelet_encoding import ContainerSpec, PodSpec, container_config, sandbox_config
from tests.unit.hook_harness import NODE_MEMORY, SMALL, FakeHost, topology_of
from tests.unit.netdev_fakes import FakeKernel, FakeNetlink

__all__ = ["TOPOLOGY", "RecordingNode"]

TOPOLOGY = topology_of(SMALL)


class _Runtime:
    """The runtime: sandboxes get ids and network namespaces (in the kernel in memory),
    which go when a sandbox stops; every other call succeeds."""

    def __init__(self, kernel: FakeKernel) -> None:
        self.kernel = kernel
        self.netns: dict[str, str] = {}
        self._next = 0

    def call(self, path: str) -> Any:
        method = path.rsplit("/", 1)[-1]

        async def call(request: bytes, **options: Any) -> bytes:
            if method == "RunPodSandbox":
                self._next += 1
                sandbox = f"{self._next:064x}"
                self.netns[sandbox] = f"/var/run/netns/cni-{self._next}"
                self.kernel.add_netns(self.netns[sandbox])
                return api_pb2.RunPodSandboxResponse(pod_sandbox_id=sandbox).SerializeToString()
            if method == "CreateContainer":
                self._next += 1
                container = f"c{self._next:063x}"
                return api_pb2.CreateContainerResponse(container_id=container).SerializeToString()
            if method == "StopPodSandbox":
                sandbox = api_pb2.StopPodSandboxRequest.FromString(request).pod_sandbox_id
                path = self.netns.get(sandbox)
                if path is not None and path in self.kernel.namespaces:
                    self.kernel.destroy_netns(path)
            return b""

        return call

    # RuntimeQueries, and what the synchronizer asks
    async def container_states(self, pod_id: str) -> Mapping[str, ContainerState]:
        return {}

    async def sandbox_netns(self, pod_id: str) -> str | None:
        return self.netns.get(pod_id)

    async def oom_score_adj(self, container_id: str) -> int | None:
        return None

    async def all_container_states(self) -> dict[str, ContainerState]:
        return {}

    async def resources(self, container_id: str) -> api_pb2.LinuxContainerResources | None:
        return None


class RecordingNode:
    """`await RecordingNode(dir, config).start()`, calls, then `write(path)`."""

    def __init__(
        self,
        workdir: Path,
        config: Mapping[str, Any],
        plugins: Sequence[tuple[HookSettings, Hook]] = (),
    ) -> None:
        self.settings: Settings = settings_from_toml(config)
        self.kernel = FakeKernel()
        self.runtime = _Runtime(self.kernel)
        self.store = Store(workdir / "state")
        self.chain = Chain(self.settings.chain, self.store.hook_state)
        readiness = Readiness()
        readiness.set(True)
        self.pipeline = Pipeline(self.runtime, self.chain, self.store, readiness)
        self.redactor = Redactor(self.settings.record.redact_annotations)
        self._plugins = list(plugins)
        settings = [h for h, _ in self._plugins]
        header = header_line(self.settings, TOPOLOGY, [], [], time.time(), True, settings)
        self.lines: list[dict[str, Any]] = [header]
        self.pipeline.on_outcome = self._call
        self.sync = Synchronizer(
            self.chain,
            self.store,
            ObservedQueries(self.runtime),
            None,
            self.pipeline.updater,
            TOPOLOGY,
            ObservedHost(FakeHost()),  # type: ignore[arg-type]
            netlink=ObservedNetlink(FakeNetlink(self.kernel)),
        )
        self.sync.on_sync = self._sync

    async def start(self) -> RecordingNode:
        self.store.load()
        self.chain.set_builtin(
            [Chain.entry(load_local_hook(h), h) for h in self.settings.chain.hooks]
        )
        self.chain.set_plugins(
            [Chain.entry(LocalHook(h.name, hook), h) for h, hook in self._plugins]
        )
        for entry in self.chain.entries:
            await entry.hook.start()
        await self.sync.synchronize("start")
        return self

    def set_plugins(self, plugins: Sequence[tuple[HookSettings, Hook]]) -> None:
        """The drop-in directory changed: these plugins from now on (a `plugins` line)."""
        self._plugins = list(plugins)
        self.chain.set_plugins(
            [Chain.entry(LocalHook(h.name, hook), h) for h, hook in self._plugins]
        )
        line = plugins_line(self.pipeline.next_seq(), time.time(), [h for h, _ in self._plugins])
        self.lines.append(line)

    def rotate(self) -> None:
        """The file is rotated here: a new part starts, from a header and crihook's snapshot."""
        now = time.time()
        plugins = [h for h, _ in self._plugins]
        self.lines.append(header_line(self.settings, TOPOLOGY, [], [], now, True, plugins))
        seq = self.pipeline.next_seq()
        self.lines.append(snapshot_line(seq, now, self.store, self.chain, self.redactor))

    def _call(self, outcome: Outcome) -> None:
        self.lines.append(call_line(outcome, self.redactor))

    def _sync(self, report: SyncReport) -> None:
        line = sync_line(
            "sync", self.pipeline.next_seq(), time.time(), report.reason, report.pods,
            report.containers, report.container_states, report.hook_states, report.updates,
            report.observed, self.redactor,
        )  # fmt: skip
        self.lines.append(line)

    # --- what kubelet sends ------------------------------------------------------------------
    async def run_pod(self, spec: PodSpec) -> Outcome:
        request = api_pb2.RunPodSandboxRequest(config=sandbox_config(spec))
        return await self.pipeline.handle(Event.RUN_POD_SANDBOX, request.SerializeToString())

    async def create(self, spec: PodSpec, sandbox: str, container: ContainerSpec) -> Outcome:
        request = api_pb2.CreateContainerRequest(
            pod_sandbox_id=sandbox,
            config=container_config(spec, container, node_memory=NODE_MEMORY),
            sandbox_config=sandbox_config(spec),
        )
        return await self.pipeline.handle(Event.CREATE_CONTAINER, request.SerializeToString())

    async def stop_pod(self, sandbox: str) -> None:
        for event, message in (
            (Event.STOP_POD_SANDBOX, api_pb2.StopPodSandboxRequest(pod_sandbox_id=sandbox)),
            (Event.REMOVE_POD_SANDBOX, api_pb2.RemovePodSandboxRequest(pod_sandbox_id=sandbox)),
        ):
            outcome = await self.pipeline.handle(event, message.SerializeToString())
            assert outcome.status is None, outcome.status

    async def close(self, path: Path) -> Path:
        """Close the hooks and the store; the recording written to `path`."""
        await self.chain.close()
        await self.store.close()
        path.write_bytes(b"".join(encode_line(line) for line in self.lines))
        return path
