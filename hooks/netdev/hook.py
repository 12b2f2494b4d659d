"""The built-in `netdev` hook: network interfaces in a pod's network namespace, as the pod asks
(`netdevs.crihook.io/pod`, see `annotation`) and the node allows (`policy`).

    RunPodSandbox    pre: the request checked: malformed, or a pod on the host's network →
                          INVALID_ARGUMENT; not allowed → PERMISSION_DENIED; an interface that
                          is not on the host → INVALID_ARGUMENT, one another pod has →
                          FAILED_PRECONDITION. Nothing is made yet; the plan is on disk
                          before the runtime acts.
                     post: in the sandbox's namespace (its path from the runtime's verbose
                          status), each interface moved in or created, then MTU, addresses,
                          up. A failure midway undoes everything done for the pod and refuses
                          the sandbox (crihook stops and removes it; the call fails).
                     failed: anything done for the pod undone
    StopPodSandbox   pre: moved interfaces go back to the host under their own name (MTU and
    RemovePodSandbox      state as they were), created ones are deleted, before the runtime
                          tears the namespace down
                     post: what could not be given back before is looked for on the host
                          (the kernel returns a physical interface when its namespace goes)

At start (and after a reconcile) the records are checked against the pods the runtime has: a
pod that is gone, or whose namespace is, has its moved interfaces given their names back on
the host; a set-up crihook did not see finish is kept when complete, undone otherwise.

Interfaces are reached through the node's `Netlink` seam (`SyncContext.netlink`: pyroute2 when
crihook serves, noted while it records, answered from the recording in a replay). Netlink
calls run in a worker thread. Interfaces moved into a pod are the hook's to guard:
one interface goes to one pod.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.netdev.annotation import (
    NETDEVS,
    AnnotationError,
    LinkAsk,
    parse_netdev_annotation,
)
from crihook.hooks.netdev.plan import Done, SetupError, present, repair_host, set_up, tear_down
from crihook.hooks.netdev.policy import NetdevPolicy, check_links, parse_policy
from crihook.hooks.node.netlink import LinkInfo, Netlink, PyrouteNetlink
from crihook.hooks.spec import (
    Adjustment,
    ContainerUpdate,
    Hook,
    HookContext,
    HookState,
    InvalidRequest,
    PodView,
    Reject,
    RuntimeQueries,
    SyncContext,
)

__all__ = ["NetdevHook"]

log = logging.getLogger(__name__)

_PENDING, _SANDBOX = "p:", "s:"
_T = TypeVar("_T")


class NetdevHook(Hook):
    sets: tuple[str, ...] = ()  # it changes no request: it acts on the sandbox's namespace

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(options)
        self.policy: NetdevPolicy = parse_policy(self.options)
        self._netlink: Netlink | None = None
        self._runtime: RuntimeQueries | None = None
        self._state: HookState | None = None
        self._claimed: dict[str, str] = {}
        """Host interface → the pod (`uid/attempt`) it is moved into, or is to be."""
        self._tasks: dict[str, asyncio.Task[str | None]] = {}
        """Sandbox id → its set-up, while it runs (it may outlive an abandoned call)."""

    @property
    def state(self) -> HookState:
        if self._state is None:
            raise RuntimeError("netdev: called before synchronize (crihook starts hooks so)")
        return self._state

    @property
    def netlink(self) -> Netlink:
        """The node's interfaces, as crihook hands them over (`SyncContext.netlink`)."""
        if self._netlink is None:
            raise RuntimeError("netdev: called before synchronize (crihook starts hooks so)")
        return self._netlink

    async def close(self) -> None:
        if self._tasks:  # set-ups that outlived their call finish and record what they did
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    # --- start-up ----------------------------------------------------------------------------
    async def synchronize(self, sync: SyncContext) -> Sequence[ContainerUpdate]:
        self._runtime = sync.runtime
        self._state = sync.state
        self._netlink = sync.netlink if sync.netlink is not None else PyrouteNetlink()
        by_id = {p.id: p for p in sync.pods}
        by_attempt = {_pod_key(p): p for p in sync.pods}
        for key, doc in list(sync.state.items()):
            try:
                if key.startswith(_PENDING):
                    await self._sync_pending(key, doc, by_attempt.get(key[len(_PENDING) :]))
                elif key.startswith(_SANDBOX):
                    await self._sync_sandbox(key, doc, by_id.get(key[len(_SANDBOX) :]))
                else:
                    raise KeyError(key)
            except (KeyError, TypeError, ValueError) as exc:
                log.error("netdev: unreadable state entry %s dropped (%s)", key, exc)
                sync.state.delete(key)
            except Reject as exc:  # the runtime did not answer: kept for the next time
                log.warning("netdev: %s kept as it is: %s", key, exc.reason)
        self._claimed = {}
        for key, doc in sync.state.items():
            for ask in _asks(doc):
                if ask.kind == "move":
                    self._claimed[ask.host] = _owner(key, doc)
        if self._claimed:
            log.info("netdev: %d host interface(s) in pods", len(self._claimed))
        return ()

    async def _sync_pending(self, key: str, doc: Mapping[str, Any], pod: PodView | None) -> None:
        """A plan written before RunPodSandbox whose set-up crihook did not see end: kept if
        complete in the pod's namespace, undone otherwise."""
        netns = await self._netns(pod) if pod is not None else None
        if pod is not None and netns is not None:
            await self._adopt(pod, netns, _asks(doc), _planned(doc))
        else:
            problems = await self._blocking(_undo_in, self.netlink, None, _asks(doc), _planned(doc))
            _report(problems, f"pod {doc.get('name') or key[len(_PENDING) :]}")
        self.state.delete(key)

    async def _sync_sandbox(self, key: str, doc: Mapping[str, Any], pod: PodView | None) -> None:
        netns = str(doc["netns"])
        alive = pod is not None and await asyncio.to_thread(self.netlink.exists, netns)
        if alive and pod is not None:
            if not doc.get("setting_up"):
                return  # as it was left
            if await self._adopt(pod, netns, _asks(doc), _planned(doc)):
                return  # recorded anew, under the same key
            self.state.delete(key)
            return
        done = [Done.from_dict(d) for d in doc["links"]]
        if doc.get("setting_up"):  # what it did is not recorded: whatever it planned
            problems = await self._blocking(_undo_in, self.netlink, None, _asks(doc), _planned(doc))
        else:
            problems = await self._blocking(_undo_at, self.netlink, None, done)
        _report(problems, f"pod {doc.get('name', key[len(_SANDBOX) :][:12])}")
        self.state.delete(key)

    async def _adopt(
        self, pod: PodView, netns: str, asks: Sequence[LinkAsk], moved: Mapping[str, LinkInfo]
    ) -> bool:
        """A set-up found complete in the pod's namespace is kept (recorded as done); one
        found half done is undone there. True when kept."""
        there = await self._blocking(_present_in, self.netlink, netns, asks)
        if len(there) == len(asks) and all(a.host in moved for a in asks if a.kind == "move"):
            done = [
                Done.moved(a, moved[a.host]) if a.kind == "move" else Done(a.name, a.kind, a.host)
                for a in asks
            ]
            self.state.set(_SANDBOX + pod.id, _record(pod, netns, asks, done))
            log.info("netdev: pod %s/%s has its interfaces; kept", pod.namespace, pod.name)
            return True
        done = [
            Done.moved(a, moved[a.host]) if a.kind == "move" else Done(a.name, a.kind, a.host)
            for a in asks
            if a.name in there and (a.kind != "move" or a.host in moved)
        ]
        problems = await self._blocking(_undo_at, self.netlink, netns, done)
        log.error(
            "netdev: pod %s/%s had only %s of its interfaces set up when crihook stopped; "
            "undone (it runs without them: delete the pod to have them again)",
            pod.namespace,
            pod.name,
            ", ".join(there) or "none",
        )
        _report(problems, f"pod {pod.namespace}/{pod.name}")
        return False

    # --- RunPodSandbox -----------------------------------------------------------------------
    async def pre_run_pod_sandbox(self, ctx: HookContext) -> Adjustment | None:
        raw = ctx.pod.annotations.get(NETDEVS)
        if raw is None:
            return None
        try:
            asks = parse_netdev_annotation(raw)
        except AnnotationError as exc:
            raise InvalidRequest(str(exc)) from None
        options = ctx.peek_request().config.linux.security_context.namespace_options  # type: ignore[attr-defined]
        if options.network == api_pb2.NODE:
            raise InvalidRequest(
                f"{NETDEVS}: pod {_pod(ctx.pod)} runs on the host's network (hostNetwork): "
                "interfaces are given only to pods with a network namespace of their own"
            )
        check_links(self.policy, ctx.pod.namespace, asks)
        owner = _pod_key(ctx.pod)
        self._check_claims(asks, owner)
        found = await self._blocking(_host_lookup, self.netlink, asks)
        for ask in asks:
            if ask.host not in found:
                what = "interface" if ask.kind == "move" else "parent"
                raise InvalidRequest(
                    f"{NETDEVS} {ask.entry}: {what} {ask.host} is not on this node"
                )
        self._check_claims(asks, owner)  # another pod may have asked meanwhile
        for ask in asks:
            if ask.kind == "move":
                self._claimed[ask.host] = owner
        self.state.set(
            _PENDING + owner,
            {
                "name": _pod(ctx.pod),
                "links": [a.to_dict() for a in asks],
                "moved": {a.host: _info_dict(found[a.host]) for a in asks if a.kind == "move"},
            },
        )
        return None

    async def post_run_pod_sandbox(self, ctx: HookContext) -> Adjustment | None:
        owner = _pod_key(ctx.pod)
        plan = self.state.get(_PENDING + owner)
        if plan is None:
            return None
        assert ctx.response is not None
        sandbox: str = ctx.response.pod_sandbox_id  # type: ignore[attr-defined]
        pod = _with_id(ctx.pod, sandbox)
        asks = _asks(plan)
        netns = await self._netns(pod)
        if netns is None:
            self._forget(_PENDING + owner, asks)
            raise Reject(
                f"{NETDEVS}: the runtime reports no network namespace for sandbox "
                f"{sandbox[:12]}; its interfaces cannot be set up"
            )
        record = _record(pod, netns, asks, [], setting_up=True)
        record["moved"] = plan.get("moved", {})
        self.state.set(_SANDBOX + sandbox, record)
        self.state.delete(_PENDING + owner)
        # A task: if this call is abandoned (its timeout), the set-up still ends and is recorded.
        task = asyncio.get_running_loop().create_task(
            self._set_up(sandbox, netns, asks), name=f"crihook-netdev-{sandbox[:12]}"
        )
        self._tasks[sandbox] = task
        task.add_done_callback(lambda _: self._tasks.pop(sandbox, None))
        error = await asyncio.shield(task)
        if error is not None:
            raise Reject(error)
        log.info("netdev: pod %s has %s", _pod(ctx.pod), ", ".join(_describe(a) for a in asks))
        return None

    async def _set_up(self, sandbox: str, netns: str, asks: Sequence[LinkAsk]) -> str | None:
        """The set-up, recorded; the reason when it failed (and was undone)."""
        key = _SANDBOX + sandbox
        try:
            done = await self._blocking(_set_up_in, self.netlink, netns, asks)
        except (SetupError, OSError) as exc:
            record = self.state.get(key)
            if record is not None:
                self._forget(key, _asks(record))
            if isinstance(exc, SetupError) and exc.leftovers:
                log.error("netdev: sandbox %s: %s", sandbox[:12], exc)
            return str(exc) if isinstance(exc, SetupError) else f"{NETDEVS}: {exc}"
        record = self.state.get(key)
        if record is not None:
            record = dict(record)
            record["links"] = [d.to_dict() for d in done]
            record.pop("setting_up", None)
            self.state.set(key, record)
        return None

    async def failed_run_pod_sandbox(self, ctx: HookContext) -> None:
        owner = _pod_key(ctx.pod)
        plan = self.state.get(_PENDING + owner)
        if plan is not None:
            self._forget(_PENDING + owner, _asks(plan))
        for key, doc in list(self.state.items()):
            if key.startswith(_SANDBOX) and _owner(key, doc) == owner:
                await self._undo(key, doc, f"pod {_pod(ctx.pod)} (its RunPodSandbox failed)")

    # --- StopPodSandbox, RemovePodSandbox ------------------------------------------------------
    async def pre_stop_pod_sandbox(self, ctx: HookContext) -> Adjustment | None:
        running = self._tasks.get(ctx.pod.id)
        if running is not None:  # a set-up that outlived its call: it ends first
            await asyncio.wait([running])
        record = self.state.get(_SANDBOX + ctx.pod.id)
        if record is not None:
            await self._give_back(ctx.pod, record)
        return None

    async def post_stop_pod_sandbox(self, ctx: HookContext) -> Adjustment | None:
        await self._leftovers(ctx.pod)
        return None

    async def pre_remove_pod_sandbox(self, ctx: HookContext) -> Adjustment | None:
        return await self.pre_stop_pod_sandbox(ctx)

    async def post_remove_pod_sandbox(self, ctx: HookContext) -> Adjustment | None:
        await self._leftovers(ctx.pod)
        return None

    async def _give_back(self, pod: PodView, record: Mapping[str, Any]) -> None:
        """Before the runtime tears the namespace down. What cannot be given back now stays
        recorded, for the post stage (the documented fall-back: the call goes on, the
        kernel returns a physical interface to the host with the namespace)."""
        key = _SANDBOX + pod.id
        done = [Done.from_dict(d) for d in record["links"]]
        netns = str(record["netns"])
        alive = await asyncio.to_thread(self.netlink.exists, netns)
        problems = await self._blocking(_undo_at, self.netlink, netns if alive else None, done)
        if not problems:
            self._forget(key, _asks(record))
            log.info("netdev: pod %s gave its interfaces back", _pod(pod))
            return
        log.error(
            "netdev: pod %s: %s; tried again once its namespace is gone",
            _pod(pod),
            "; ".join(problems),
        )
        self.state.set(key, {**record, "stranded": True})

    async def _leftovers(self, pod: PodView) -> None:
        key = _SANDBOX + pod.id
        record = self.state.get(key)
        if record is None:
            return
        netns = str(record["netns"])
        alive = await asyncio.to_thread(self.netlink.exists, netns)
        if alive and not record.get("stranded"):
            return  # the runtime did not stop it (a failed StopPodSandbox): it keeps them
        await self._undo(key, record, f"pod {_pod(pod)}")

    # --- helpers -----------------------------------------------------------------------------
    async def _undo(self, key: str, record: Mapping[str, Any], who: str) -> None:
        done = [Done.from_dict(d) for d in record.get("links", [])]
        netns = str(record["netns"])
        alive = await asyncio.to_thread(self.netlink.exists, netns)
        problems = await self._blocking(_undo_at, self.netlink, netns if alive else None, done)
        _report(problems, who)
        self._forget(key, _asks(record))

    def _forget(self, key: str, asks: Sequence[LinkAsk]) -> None:
        doc = self.state.get(key)
        owner = _owner(key, doc) if doc is not None else None
        self.state.delete(key)
        for ask in asks:
            if ask.kind == "move" and self._claimed.get(ask.host) in (owner, None):
                self._claimed.pop(ask.host, None)

    def _check_claims(self, asks: Sequence[LinkAsk], owner: str) -> None:
        for ask in asks:
            holder = self._claimed.get(ask.host)
            if ask.kind == "move" and holder is not None and holder != owner:
                raise Reject(
                    f"{NETDEVS} {ask.entry}: interface {ask.host} is in pod "
                    f"{self._name_of(holder)} until that pod stops"
                )

    def _name_of(self, owner: str) -> str:
        for key, doc in self.state.items():
            if _owner(key, doc) == owner and doc.get("name"):
                return str(doc["name"])
        return f"with uid {owner.split('/')[0]}"

    async def _netns(self, pod: PodView) -> str | None:
        if self._runtime is None:
            raise RuntimeError("netdev: called before synchronize (crihook starts hooks so)")
        try:
            return await self._runtime.sandbox_netns(pod.id)
        except Exception as exc:  # the runtime's error (grpc), translated for the operator
            raise Reject(
                f"{NETDEVS}: cannot ask the runtime for sandbox {pod.id[:12]}'s network "
                f"namespace: {exc}"
            ) from exc

    async def _blocking(self, fn: Callable[..., _T], *args: Any) -> _T:
        """`fn(*args)` in a worker thread; if the call is abandoned meanwhile, the thread
        still runs to its end (netlink changes are not left half made)."""
        future = asyncio.ensure_future(asyncio.to_thread(fn, *args))
        future.add_done_callback(_retrieved)
        return await asyncio.shield(future)


# --- what runs in the worker thread ------------------------------------------------------------


def _host_lookup(netlink: Netlink, asks: Sequence[LinkAsk]) -> dict[str, LinkInfo]:
    found = {}
    with netlink.session(None) as session:
        for ask in asks:
            info = session.host_link(ask.host)
            if info is not None:
                found[ask.host] = info
    return found


def _set_up_in(netlink: Netlink, netns: str, asks: Sequence[LinkAsk]) -> list[Done]:
    with netlink.session(netns) as session:
        return set_up(session, asks)


def _undo_at(netlink: Netlink, netns: str | None, done: Sequence[Done]) -> list[str]:
    """Undo in the pod's namespace when there is one, else repair the host."""
    with netlink.session(netns) as session:
        return tear_down(session, done) if netns is not None else repair_host(session, done)


def _undo_in(
    netlink: Netlink, netns: str | None, asks: Sequence[LinkAsk], moved: Mapping[str, LinkInfo]
) -> list[str]:
    """A plan whose set-up is unknown: undo whatever of it is there."""
    done = [
        Done.moved(a, moved[a.host]) if a.kind == "move" else Done(a.name, a.kind, a.host)
        for a in asks
        if a.kind != "move" or a.host in moved
    ]
    if netns is not None:
        with netlink.session(netns) as session:
            there = set(present(session, asks))
            return tear_down(session, [d for d in done if d.name in there]) + repair_host(
                session, [d for d in done if d.name not in there]
            )
    with netlink.session(None) as session:
        return repair_host(session, done)


def _present_in(netlink: Netlink, netns: str, asks: Sequence[LinkAsk]) -> list[str]:
    with netlink.session(netns) as session:
        return present(session, asks)


# --- records -----------------------------------------------------------------------------------


def _pod_key(pod: PodView) -> str:
    return f"{pod.uid}/{pod.attempt}"


def _owner(key: str, doc: Mapping[str, Any]) -> str:
    if key.startswith(_PENDING):
        return key[len(_PENDING) :]
    return f"{doc.get('uid', '')}/{doc.get('attempt', 0)}"


def _record(
    pod: PodView,
    netns: str,
    asks: Sequence[LinkAsk],
    done: Sequence[Done],
    *,
    setting_up: bool = False,
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "uid": pod.uid,
        "attempt": pod.attempt,
        "name": f"{pod.namespace}/{pod.name}",
        "netns": netns,
        "asked": [a.to_dict() for a in asks],
        "links": [d.to_dict() for d in done],
    }
    if setting_up:
        doc["setting_up"] = True
    return doc


def _asks(doc: Mapping[str, Any]) -> list[LinkAsk]:
    return [LinkAsk.from_dict(a) for a in doc.get("asked", doc.get("links", []))]


def _planned(doc: Mapping[str, Any]) -> dict[str, LinkInfo]:
    return {
        host: LinkInfo(
            int(i["index"]), host, str(i["mac"]), int(i["mtu"]), bool(i["up"]), str(i["kind"])
        )
        for host, i in doc.get("moved", {}).items()
    }


def _info_dict(info: LinkInfo) -> dict[str, Any]:
    return {"index": info.index, "mac": info.mac, "mtu": info.mtu, "up": info.up, "kind": info.kind}


def _with_id(pod: PodView, sandbox: str) -> PodView:
    return replace(pod, id=sandbox)


def _describe(ask: LinkAsk) -> str:
    if ask.kind == "move":
        return f"{ask.name} (moved from {ask.host})"
    return f"{ask.name} ({ask.kind} on {ask.host})"


def _retrieved(future: asyncio.Future[Any]) -> None:
    """An abandoned worker's failure is the awaiting stage's to report; never 'unretrieved'."""
    if not future.cancelled():
        future.exception()


def _report(problems: Sequence[str], who: str) -> None:
    if problems:
        log.error("netdev: %s: could not give back: %s", who, "; ".join(problems))


def _pod(pod: PodView) -> str:
    return f"{pod.namespace}/{pod.name}" if pod.name else pod.id[:12]
