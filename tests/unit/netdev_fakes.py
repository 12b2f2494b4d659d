"""A kernel's network namespaces in memory, behind the netdev hook's Netlink seam: links move
between namespaces as the kernel moves them (down, addresses dropped, renamed on the way),
and a namespace that goes away hands its physical interfaces back to the host (renamed
`devN` when the name is taken) and takes its virtual ones with it."""

from __future__ import annotations

import contextlib
import errno
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from crihook.hooks.node.netlink import LinkInfo

__all__ = ["FakeKernel", "FakeLink", "FakeNetlink"]

HOST = "host"


@dataclass
class FakeLink:
    index: int
    name: str
    mac: str
    mtu: int = 1500
    up: bool = False
    kind: str = ""
    addresses: list[str] = field(default_factory=list)

    def info(self) -> LinkInfo:
        return LinkInfo(self.index, self.name, self.mac, self.mtu, self.up, self.kind)


class FakeKernel:
    def __init__(self) -> None:
        self.namespaces: dict[str, dict[int, FakeLink]] = {HOST: {}}
        self._index = itertools.count(2)
        self.failures: dict[tuple[str, str], int] = {}
        """(operation, link name) → errno: that call fails (once)."""
        self.calls: list[tuple[str, ...]] = []

    # --- the test's hands ----------------------------------------------------------------------
    def add(
        self, name: str, *, kind: str = "", ns: str = HOST, mtu: int = 1500, up: bool = True
    ) -> FakeLink:
        index = next(self._index)
        link = FakeLink(index, name, f"02:00:00:00:00:{index:02x}", mtu, up, kind)
        self.namespaces[ns][index] = link
        return link

    def add_netns(self, path: str) -> None:
        self.namespaces[path] = {}

    def destroy_netns(self, path: str) -> None:
        """The runtime removed the pod's namespace: physical links go home, virtual ones die."""
        for link in self.namespaces.pop(path).values():
            if link.kind in ("", "physical"):
                if self.find(HOST, link.name) is not None:
                    link.name = f"dev{link.index}"
                link.up, link.addresses = False, []
                self.namespaces[HOST][link.index] = link

    def find(self, ns: str, name: str) -> FakeLink | None:
        return next((lk for lk in self.namespaces[ns].values() if lk.name == name), None)

    def names(self, ns: str) -> list[str]:
        return sorted(lk.name for lk in self.namespaces[ns].values())

    def fail(self, operation: str, name: str, code: int = errno.EBUSY) -> None:
        self.failures[(operation, name)] = code

    def _check(self, operation: str, name: str) -> None:
        self.calls.append((operation, name))
        code = self.failures.pop((operation, name), None)
        if code is not None:
            raise OSError(code, f"{operation} {name}: injected")


class FakeNetlink:
    def __init__(self, kernel: FakeKernel) -> None:
        self.kernel = kernel
        self.sessions: list[str | None] = []

    @contextlib.contextmanager
    def session(self, netns: str | None) -> Iterator[FakeSession]:
        if netns is not None and netns not in self.kernel.namespaces:
            raise OSError(errno.ENOENT, f"no namespace {netns}")
        self.sessions.append(netns)
        yield FakeSession(self.kernel, netns)

    def exists(self, netns: str) -> bool:
        return netns in self.kernel.namespaces


class FakeSession:
    def __init__(self, kernel: FakeKernel, netns: str | None) -> None:
        self.k = kernel
        self.netns = netns

    def _pod(self) -> str:
        if self.netns is None:
            raise OSError(errno.ENOENT, "no pod namespace in this session")
        if self.netns not in self.k.namespaces:
            raise OSError(errno.ENOENT, "the namespace is gone")
        return self.netns

    def _get(self, ns: str, name: str) -> FakeLink:
        link = self.k.find(ns, name)
        if link is None:
            raise OSError(errno.ENODEV, f"no interface {name}")
        return link

    def host_link(self, name: str) -> LinkInfo | None:
        link = self.k.find(HOST, name)
        return link.info() if link else None

    def host_links(self) -> list[LinkInfo]:
        return [lk.info() for lk in self.k.namespaces[HOST].values()]

    def pod_link(self, name: str) -> LinkInfo | None:
        link = self.k.find(self._pod(), name)
        return link.info() if link else None

    def pod_links(self) -> list[LinkInfo]:
        return [lk.info() for lk in self.k.namespaces[self._pod()].values()]

    def _move(self, link: FakeLink, src: str, dst: str, name: str) -> None:
        if self.k.find(dst, name) is not None:
            raise OSError(errno.EEXIST, f"{name} exists")
        del self.k.namespaces[src][link.index]
        link.name, link.up, link.addresses = name, False, []
        self.k.namespaces[dst][link.index] = link

    def move_in(self, host_index: int, name: str) -> None:
        pod = self._pod()
        self.k._check("move_in", name)
        link = self.k.namespaces[HOST].get(host_index)
        if link is None:
            raise OSError(errno.ENODEV, f"no interface {host_index}")
        if self.k.find(pod, name) is not None and self.k.find(pod, link.name) is None:
            # As the kernel does it: moved under its own name, then the rename fails.
            self._move(link, HOST, pod, link.name)
            raise OSError(errno.EEXIST, f"{name} exists")
        self._move(link, HOST, pod, name)

    def move_out(self, name: str, host_name: str) -> None:
        pod = self._pod()
        self.k._check("move_out", name)
        self._move(self._get(pod, name), pod, HOST, host_name)

    def create(self, name: str, kind: str, parent_index: int, mode: str) -> None:
        pod = self._pod()
        self.k._check("create", name)
        if parent_index not in self.k.namespaces[HOST]:
            raise OSError(errno.ENODEV, "no parent")
        if self.k.find(pod, name) is not None:
            raise OSError(errno.EEXIST, f"{name} exists")
        self.k.add(name, kind=kind, ns=pod, up=False)

    def delete(self, name: str) -> None:
        pod = self._pod()
        self.k._check("delete", name)
        link = self._get(pod, name)
        del self.k.namespaces[pod][link.index]

    def configure(self, name: str, mtu: int | None, addresses: Sequence[str]) -> None:
        pod = self._pod()
        self.k._check("configure", name)
        link = self._get(pod, name)
        if mtu is not None:
            link.mtu = mtu
        link.addresses.extend(addresses)
        link.up = True

    def restore(self, index: int, name: str, mtu: int, up: bool) -> None:
        self.k._check("restore", name)
        link = self.k.namespaces[HOST].get(index)
        if link is None:
            raise OSError(errno.ENODEV, f"no interface {index}")
        if link.name != name and self.k.find(HOST, name) is not None:
            raise OSError(errno.EEXIST, f"{name} exists")
        link.name, link.mtu, link.up = name, mtu or link.mtu, up
