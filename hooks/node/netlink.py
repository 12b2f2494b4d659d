"""The seam through which hooks (`netdev`) change network interfaces: a netlink session in
the host's network namespace and, optionally, one pod's. crihook hands hooks a
:class:`PyrouteNetlink` (pyroute2) in `SyncContext.netlink`; while it records, one that notes
every question and change; a replay, one answering from the recording; tests, their own.
pyroute2 is imported by the first session, in the worker thread that opens it.

Every call blocks (netlink round trips; moving an interface waits for the kernel's RCU grace
periods, ~25 ms): the hook runs them in a worker thread, never on the event loop.

A pod's namespace is entered without forking: a short-lived thread joins it (`setns`, which
affects only the calling thread), opens the netlink socket there and exits; the socket stays
bound to that namespace. Interfaces are moved with IFLA_NET_NS_FD and renamed in the same
message, so a name never has to be free in both namespaces.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["LinkInfo", "Netlink", "NetlinkSession", "PyrouteNetlink"]

_NETLINK_ROUTE = 0
_MACVLAN_MODES = {"private": 1, "vepa": 2, "bridge": 4, "passthru": 8}
_IPVLAN_MODES = {"l2": 0, "l3": 1, "l3s": 2}
_IFF_UP = 1


@dataclass(frozen=True, slots=True)
class LinkInfo:
    index: int
    name: str
    mac: str
    mtu: int
    up: bool
    kind: str = ""
    """The link kind (`macvlan`, `veth`, ...); empty for a physical interface."""

    def to_dict(self) -> dict[str, Any]:
        """As recordings note an answer (JSON)."""
        return {
            "index": self.index,
            "name": self.name,
            "mac": self.mac,
            "mtu": self.mtu,
            "up": self.up,
            "kind": self.kind,
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> LinkInfo:
        return cls(
            int(doc["index"]),
            str(doc["name"]),
            str(doc["mac"]),
            int(doc["mtu"]),
            bool(doc["up"]),
            str(doc.get("kind", "")),
        )


class NetlinkSession(Protocol):
    """netlink in the host's namespace and in one pod's (`pod_*`, `move_*`, `create`,
    `delete`, `configure`: a session opened without a pod namespace raises for those).
    Failures raise OSError with the errno the kernel gave."""

    def host_link(self, name: str) -> LinkInfo | None: ...
    def host_links(self) -> list[LinkInfo]: ...
    def pod_link(self, name: str) -> LinkInfo | None: ...
    def pod_links(self) -> list[LinkInfo]: ...

    def move_in(self, host_index: int, name: str) -> None:
        """Move the host interface into the pod's namespace, named `name` there."""
        ...

    def move_out(self, name: str, host_name: str) -> None:
        """Move the pod's interface back to the host's namespace, named `host_name`."""
        ...

    def create(self, name: str, kind: str, parent_index: int, mode: str) -> None:
        """A macvlan or ipvlan on the host interface `parent_index`, made in the pod."""
        ...

    def delete(self, name: str) -> None: ...

    def configure(self, name: str, mtu: int | None, addresses: Sequence[str]) -> None:
        """In the pod: MTU, addresses (`a/prefix`), then up."""
        ...

    def restore(self, index: int, name: str, mtu: int, up: bool) -> None:
        """In the host: the interface `index` gets `name` (taken down to rename it), `mtu`
        and its state back."""
        ...


class Netlink(Protocol):
    def session(self, netns: str | None) -> AbstractContextManager[NetlinkSession]:
        """A session in the host's namespace and, with `netns` (a path such as
        /var/run/netns/cni-...), that one. OSError when the namespace cannot be entered."""
        ...

    def exists(self, netns: str) -> bool:
        """Whether the namespace is still there (the runtime removes it when the sandbox
        stops)."""
        ...


# --- pyroute2 ----------------------------------------------------------------------------------


class PyrouteNetlink:
    """The real host, through pyroute2's IPRoute (its synchronous API: worker threads only)."""

    def session(self, netns: str | None) -> AbstractContextManager[NetlinkSession]:
        return _session(netns)

    def exists(self, netns: str) -> bool:
        return os.path.exists(netns)


@contextlib.contextmanager
def _session(netns: str | None) -> Iterator[NetlinkSession]:
    from pyroute2 import IPRoute  # imported by the worker thread that needs it

    with contextlib.ExitStack() as stack:
        host = IPRoute()
        stack.callback(host.close)
        pod = None
        ns_fd = -1
        if netns is not None:
            ns_fd = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
            stack.callback(os.close, ns_fd)
            pod = IPRoute(use_socket=_socket_in(ns_fd))
            stack.callback(pod.close)
        host_fd = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        stack.callback(os.close, host_fd)
        yield _PyrouteSession(host, pod, ns_fd, host_fd)


def _socket_in(ns_fd: int) -> socket.socket:
    """A netlink socket bound to the namespace `ns_fd`, opened by a thread that joins it."""
    from pyroute2.netns import setns

    made: dict[str, Any] = {}

    def enter() -> None:
        try:
            setns(ns_fd, flags=0)  # this thread only; it ends right after
            made["socket"] = socket.socket(
                socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, _NETLINK_ROUTE
            )
        except OSError as exc:
            made["error"] = exc

    thread = threading.Thread(target=enter, name="crihook-netns")
    thread.start()
    thread.join()
    if "error" in made:
        error = made["error"]
        raise OSError(getattr(error, "errno", None) or errno.EINVAL, f"cannot enter: {error}")
    sock: socket.socket = made["socket"]
    return sock


def _oserror(exc: BaseException, what: str) -> OSError:
    code = getattr(exc, "code", None) or getattr(exc, "errno", None) or errno.EIO
    return OSError(code, f"{what}: {os.strerror(code)}")


class _PyrouteSession:
    def __init__(self, host: Any, pod: Any, ns_fd: int, host_fd: int) -> None:
        from pyroute2.netlink.exceptions import NetlinkError  # (as IPRoute: in the worker)

        self._failures: tuple[type[Exception], ...] = (NetlinkError, OSError)
        self._host = host
        self._pod = pod
        self._ns_fd = ns_fd
        self._host_fd = host_fd

    def _in_pod(self) -> Any:
        if self._pod is None:
            raise OSError(errno.ENOENT, "no pod network namespace in this session")
        return self._pod

    @staticmethod
    def _info(msg: Any) -> LinkInfo:
        return LinkInfo(
            index=int(msg["index"]),
            name=str(msg.get("ifname")),
            mac=str(msg.get("address") or ""),
            mtu=int(msg.get("mtu") or 0),
            up=bool(int(msg["flags"]) & _IFF_UP),
            kind=str(msg.get(("linkinfo", "kind")) or ""),
        )

    def _find(self, ipr: Any, name: str) -> LinkInfo | None:
        try:
            found = ipr.link_lookup(ifname=name)
            if not found:
                return None
            return self._info(ipr.link("get", index=found[0])[0])
        except self._failures as exc:
            if getattr(exc, "code", None) == errno.ENODEV:
                return None
            raise _oserror(exc, f"looking up {name}") from exc

    def _all(self, ipr: Any) -> list[LinkInfo]:
        try:
            return [self._info(m) for m in ipr.link("dump")]
        except self._failures as exc:
            raise _oserror(exc, "listing interfaces") from exc

    def host_link(self, name: str) -> LinkInfo | None:
        return self._find(self._host, name)

    def host_links(self) -> list[LinkInfo]:
        return self._all(self._host)

    def pod_link(self, name: str) -> LinkInfo | None:
        return self._find(self._in_pod(), name)

    def pod_links(self) -> list[LinkInfo]:
        return self._all(self._in_pod())

    def _index(self, ipr: Any, name: str) -> int:
        info = self._find(ipr, name)
        if info is None:
            raise OSError(errno.ENODEV, f"no interface {name}")
        return info.index

    def move_in(self, host_index: int, name: str) -> None:
        self._in_pod()
        try:
            self._host.link("set", index=host_index, net_ns_fd=self._ns_fd, ifname=name)
        except self._failures as exc:
            raise _oserror(exc, f"moving interface {host_index} in as {name}") from exc

    def move_out(self, name: str, host_name: str) -> None:
        pod = self._in_pod()
        index = self._index(pod, name)
        try:
            pod.link("set", index=index, state="down")
            pod.link("set", index=index, net_ns_fd=self._host_fd, ifname=host_name)
        except self._failures as exc:
            raise _oserror(exc, f"moving {name} back as {host_name}") from exc

    def create(self, name: str, kind: str, parent_index: int, mode: str) -> None:
        self._in_pod()
        extra: dict[str, Any] = (
            {"macvlan_mode": _MACVLAN_MODES[mode]}
            if kind == "macvlan"
            else {"ipvlan_mode": _IPVLAN_MODES[mode]}
        )
        try:
            self._host.link(
                "add", ifname=name, kind=kind, link=parent_index, net_ns_fd=self._ns_fd, **extra
            )
        except self._failures as exc:
            raise _oserror(exc, f"creating {kind} {name}") from exc

    def delete(self, name: str) -> None:
        pod = self._in_pod()
        index = self._index(pod, name)
        try:
            pod.link("del", index=index)
        except self._failures as exc:
            raise _oserror(exc, f"deleting {name}") from exc

    def configure(self, name: str, mtu: int | None, addresses: Sequence[str]) -> None:
        pod = self._in_pod()
        index = self._index(pod, name)
        try:
            if mtu is not None:
                pod.link("set", index=index, mtu=mtu)
            for address in addresses:
                ip, _, prefix = address.partition("/")
                pod.addr("add", index=index, address=ip, prefixlen=int(prefix))
            pod.link("set", index=index, state="up")
        except self._failures as exc:
            raise _oserror(exc, f"configuring {name}") from exc

    def restore(self, index: int, name: str, mtu: int, up: bool) -> None:
        host = self._host
        try:
            info = self._info(host.link("get", index=index)[0])
            if info.name != name:
                host.link("set", index=index, state="down")
                host.link("set", index=index, ifname=name)
            if mtu and info.mtu != mtu:
                host.link("set", index=index, mtu=mtu)
            host.link("set", index=index, state="up" if up else "down")
        except self._failures as exc:
            raise _oserror(exc, f"restoring {name}") from exc
