"""The hook contract: what a hook implements and what it is given.

A hook is a class with async methods named for the stages it handles:

    class Pin(Hook):
        async def pre_create_container(self, ctx: HookContext) -> Adjustment | None: ...
        async def failed_create_container(self, ctx: HookContext) -> None: ...
        async def post_remove_container(self, ctx: HookContext) -> Adjustment | None: ...

Its subscriptions follow from what it implements; a method named like a stage that is none
(`pre_create_contianer`) is a load error. Pre stages may return an Adjustment to the call and
updates to other containers; post stages run after the runtime answered OK and may return only
updates (a `Reject` there is logged, except in post-RunPodSandbox: a hook that cannot set the
new sandbox up refuses it, crihook stops and removes it and the call fails); a failed stage
tells a hook whose pre stage ran that the call failed, or that its adjustment was not
applied, so it can release what it took (its answer is ignored). A hook
never blocks the event loop: blocking work goes to a thread (`asyncio.to_thread`). Shared node
resources (CPUs, devices) are the hook's to guard.

Start-up: crihook reconciles its store with the runtime, then calls every hook's
`synchronize` with its persisted state, the node facts and the pods and containers the runtime
has, before the first call is served; the same call repeats when crihook learns of pods it
missed (a reconcile after a call with an unknown outcome).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from google.protobuf.message import Message

from crihook.hooks.spec.adjustment import Adjustment, ContainerUpdate
from crihook.hooks.spec.events import Event, Stage, stage_of_method
from crihook.hooks.spec.hints import ResourceHints, TopologyHint
from crihook.hooks.spec.usage import PoolUsage
from crihook.hooks.spec.views import ContainerState, ContainerView, PodView

if TYPE_CHECKING:  # the node layer is below the built-in hooks, not below the spec
    from crihook.hooks.node.cgroups import PodCgroups
    from crihook.hooks.node.files import HostFiles
    from crihook.hooks.node.host import Host
    from crihook.hooks.node.netlink import Netlink
    from crihook.hooks.node.staging import Staging
    from crihook.hooks.node.topology import Topology

__all__ = [
    "ChainHook",
    "DictState",
    "Hook",
    "HookContext",
    "HookState",
    "RuntimeQueries",
    "SyncContext",
    "subscriptions_of",
]


class HookState(Protocol):
    """A hook's private, persisted key-value namespace (JSON values). Survives restarts."""

    def get(self, key: str, default: Any = None) -> Any: ...
    def set(self, key: str, value: Any) -> None: ...
    def delete(self, key: str) -> None: ...
    def items(self) -> Iterator[tuple[str, Any]]: ...


class DictState:
    """A HookState held in a dict and never persisted: an SDK plugin's state (it lasts as
    long as the process), or a copy of a hook's state read from disk."""

    def __init__(self, data: Mapping[str, Any] | None = None) -> None:
        self._data: dict[str, Any] = dict(data or {})

    def get(self, key: str, default: Any = None) -> Any:
        return self._data.get(key, default)

    def set(self, key: str, value: Any) -> None:
        self._data[key] = value

    def delete(self, key: str) -> None:
        self._data.pop(key, None)

    def items(self) -> Iterator[tuple[str, Any]]:
        return iter(list(self._data.items()))


class RuntimeQueries(Protocol):
    """What a hook may ask the runtime on the call path, through crihook (so a replay can
    answer from a recording)."""

    async def container_states(self, pod_id: str) -> Mapping[str, ContainerState]:
        """The state of every container of a pod sandbox, by container id."""
        ...

    async def sandbox_netns(self, pod_id: str) -> str | None:
        """The path of a pod sandbox's network namespace (from the runtime's verbose status),
        None for a pod on the host's network."""
        ...

    async def oom_score_adj(self, container_id: str) -> int | None:
        """The oom_score_adj the runtime gave a container when it created it (ContainerStatus;
        containerd with `restrict_oom_score_adj` raises a score below its own to its own);
        None when the runtime does not say."""
        ...


@dataclass(frozen=True)
class SyncContext:
    """What a hook is given before the first call, and again after crihook reconciled pods
    it had missed: everything it needs to rebuild and check its allocations."""

    state: HookState
    """The hook's persisted state, as the last crihook left it."""
    node: Topology
    host: Host
    runtime: RuntimeQueries
    pods: Sequence[PodView]
    containers: Sequence[ContainerView]
    """Resources as the runtime reports them now (ContainerStatus), where it reports them."""
    container_states: Mapping[str, ContainerState]
    reason: str = "start"
    """`start`, or `reconcile` when crihook learnt of pods and containers it had missed, or
    found some the runtime no longer has (removed without crihook)."""
    topology_policy: str = "none"
    """The node's topology policy (`[node] topology_policy`)."""
    topology_scope: str = "container"
    """`container`, or `pod`: pods with pod-level resources get one NUMA-aligned bubble."""
    files: HostFiles | None = None
    """The host's files (where a path leads, which device node is there), for hooks that
    check paths on the call path; None: the hook uses the real host's."""
    staging: Staging | None = None
    """Where checked host paths are pinned for the runtime (bind mounts and device nodes on
    root-only staging paths; a replay notes them and makes none); None: the hook uses the real
    host's, under /run/crihook/mounts."""
    cgroups: PodCgroups | None = None
    """Pods' own cgroups, for hooks that write a pod's limits (a replay's notes the writes
    and makes none); None: the hook writes no cgroup."""
    netlink: Netlink | None = None
    """The node's network interfaces (netlink sessions in the host's and a pod's network
    namespace), for hooks that move or make interfaces (a replay notes the changes and makes
    none); None: the hook uses the real host's."""
    exempt: Callable[[PodView], bool] = lambda pod: False
    """Whether crihook's configuration exempts a pod (`HookContext.exempt` on calls), for
    hooks that act on the pods they are given here."""


class HookContext:
    """What one hook call sees. Read-only by contract; `request` is the hook's own copy of
    the CRI request as adjusted by earlier hooks (decoded on first use)."""

    __slots__ = (
        "_request",
        "_request_copy",
        "affinity",
        "container",
        "event",
        "exempt",
        "failure",
        "owners",
        "pod",
        "response",
        "stage",
        "state",
        "timeout",
    )

    def __init__(
        self,
        event: Event,
        stage: Stage,
        pod: PodView,
        container: ContainerView | None,
        request: Message,
        response: Message | None,
        state: HookState,
        timeout: float,
        *,
        affinity: TopologyHint | None = None,
        failure: str = "",
        owners: Mapping[str, str] | None = None,
        exempt: bool = False,
    ) -> None:
        self.event = event
        self.stage = stage
        self.pod = pod
        self.container = container
        self._request = request
        self._request_copy: Message | None = None
        self.response = response
        self.state = state
        self.timeout = timeout
        """Seconds this call may take (the hook's timeout or kubelet's remaining deadline)."""
        self.affinity = affinity
        """The NUMA placement the topology policy chose from every hook's hints (pre stage of
        CreateContainer and RunPodSandbox); None when no hook offered hints."""
        self.failure = failure
        """Failed stage: why the call failed or the adjustment was not applied."""
        self.owners: Mapping[str, str] = owners or {}
        """Validate stage: each field the hooks set (`cpuset_cpus`, `annotation 'a/b'`) →
        the hook that set it. What kubelet sent itself has no owner."""
        self.exempt = exempt
        """The pod is exempt by crihook's configuration (`exempt_namespaces`,
        `exempt_labels`). Only hooks that do not honour the exemption are called for such a
        pod: they place and count it, and leave the rest of what they do undone."""

    @property
    def request(self) -> Message:
        if self._request_copy is None:
            copy = type(self._request)()
            copy.CopyFrom(self._request)
            self._request_copy = copy
        return self._request_copy

    def peek_request(self) -> Message:
        """The request as adjusted so far, without the copy `request` makes: to read only
        (changing it would change what the runtime gets, behind the merge). For a built-in
        hook that reads a field on every call; a hook that may change what it reads takes
        `request`."""
        return self._request

    def request_bytes(self) -> bytes:
        """The request as adjusted so far, serialized: what an out-of-process plugin is sent
        (no decoded copy is made)."""
        data: bytes = self._request.SerializeToString()
        return data


class Hook:
    """Base class of in-process hooks (and of SDK plugins). `options` are the hook's own
    settings from `[hooks.<name>]` (or the plugin's command line)."""

    sets: tuple[str, ...] | None = None
    """What the hook sets, as `allow` grants (`"cpuset_cpus"`, `"annotation:example.com/*"`):
    a built-in hook declares it, and crihook refuses anything else it returns. None: the
    defaults for hooks that declare nothing (labels, annotations, container resources)."""

    honours_exemption: bool = True
    """False for node-wide accounting hooks (cpuset, numa): they place and count the
    containers of exempt pods too, or an exempt container would run on another pod's
    exclusive CPUs. Exempt pods still never wait on a hook that honours the exemption."""

    version: str = ""
    """The hook's own version: an SDK plugin reports it to crihook in its Configure answer
    (`plugin_version`). Empty: none given."""

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.options: Mapping[str, Any] = dict(options or {})

    async def start(self) -> None:
        """Called once at start-up, before synchronize (open files, check options, ...)."""

    async def synchronize(self, sync: SyncContext) -> Sequence[ContainerUpdate] | None:
        """Rebuild and check what the hook keeps against the runtime; called after the store
        was reconciled, before the first call, and after crihook learnt of missed pods.
        Returned updates (repairs) are sent to the runtime."""
        return None

    async def close(self) -> None:
        """Called once at shutdown."""

    def usage(self) -> Sequence[PoolUsage]:
        """The node pools the hook keeps, for crihook's metrics (see `hooks.spec.usage`):
        asked on the event loop when metrics are scraped; quick, never blocking. None by
        default."""
        return ()

    def failures(self) -> Mapping[str, int]:
        """Work the hook does beside the calls that failed and is tried again later (a
        failure on a call is the chain's to count), by what it was, counted since start: for
        `crihook state` and the `crihook_hook_failures` metric. Asked on the event loop;
        quick, never blocking. None by default."""
        return {}


def subscriptions_of(hook: object) -> frozenset[tuple[Event, Stage]]:
    """The (event, stage) pairs a hook implements, from its methods.

    ValueError names a method that looks like a stage but is none, or a stage method that is
    not `async def`."""
    subs = set()
    for name in dir(hook):
        found = stage_of_method(name)
        if found is None:
            continue
        if not inspect.iscoroutinefunction(getattr(hook, name)):
            raise ValueError(f"stage method {name!r} must be `async def`")
        subs.add(found)
    return frozenset(subs)


@runtime_checkable
class ChainHook(Protocol):
    """How the chain sees a hook, in-process or out-of-process alike."""

    @property
    def name(self) -> str: ...
    @property
    def connected(self) -> bool:
        """False: down; its calls fail and its failure policy applies."""
        ...

    @property
    def bounds_own_calls(self) -> bool:
        """True: `call` itself ends by `ctx.timeout`, so the chain sets no timer."""
        ...

    @property
    def honours_exemption(self) -> bool:
        """False: called for exempt pods too (node-wide accounting)."""
        ...

    @property
    def sets(self) -> tuple[str, ...] | None:
        """What the hook declares it sets (grants), None: undeclared."""
        ...

    def subscriptions(self) -> frozenset[tuple[Event, Stage]]: ...
    async def call(self, ctx: HookContext) -> Adjustment | ResourceHints | None: ...
    async def start(self) -> None: ...
    async def synchronize(self, sync: SyncContext) -> Sequence[ContainerUpdate]: ...
    async def close(self) -> None: ...
