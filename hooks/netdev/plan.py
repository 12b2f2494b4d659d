"""Setting a pod's interfaces up and undoing it, over a netlink session: all or nothing.

`set_up` makes each interface in turn (move it in or create it, then MTU, addresses, up);
when a step fails, everything done so far for the pod is undone before SetupError is raised.
`tear_down` undoes what `set_up` did, in reverse: a moved interface goes back to the host
under its own name with its MTU and state; a created one is deleted. `repair_host` is for a
pod whose namespace is gone: the kernel hands a physical interface back to the host under the
name it had in the pod (or `devN` when that is taken), so it is found by its index and MAC
address and given its name back; virtual ones went with the namespace. `present` says what of
a request is in a pod's namespace now (for a restart that finds a set-up half done).

These run in a worker thread (the calls block); they are pure over the session otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from crihook.hooks.netdev.annotation import NETDEVS, LinkAsk
from crihook.hooks.node.netlink import LinkInfo, NetlinkSession

__all__ = ["Done", "SetupError", "present", "repair_host", "set_up", "tear_down"]

# Kinds of interfaces that take (or may take) the MAC address of the interface below them.
_UPPER = frozenset({"macvlan", "macvtap", "ipvlan", "ipvtap", "vlan", "bond", "bridge", "team"})


@dataclass(frozen=True, slots=True)
class Done:
    """One interface set up in a pod, with what is needed to undo it."""

    name: str
    kind: str
    """`move`, `macvlan`, `ipvlan`."""
    host: str
    """Moved: its name on the host. Created: its parent."""
    index: int = 0
    mac: str = ""
    mtu: int = 0
    up: bool = False
    """Moved: the host interface's index, MAC, MTU and state before it was moved."""

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"name": self.name, "kind": self.kind, "host": self.host}
        if self.kind == "move":
            doc.update(index=self.index, mac=self.mac, mtu=self.mtu, up=self.up)
        return doc

    @classmethod
    def from_dict(cls, doc: Any) -> Done:
        return cls(
            name=str(doc["name"]),
            kind=str(doc["kind"]),
            host=str(doc["host"]),
            index=int(doc.get("index", 0)),
            mac=str(doc.get("mac", "")),
            mtu=int(doc.get("mtu", 0)),
            up=bool(doc.get("up", False)),
        )

    @classmethod
    def moved(cls, ask: LinkAsk, info: LinkInfo) -> Done:
        return cls(ask.name, "move", ask.host, info.index, info.mac, info.mtu, info.up)


class SetupError(Exception):
    """Setting a pod's interfaces up failed; what was done is undone (`leftovers`: what
    could not be undone)."""

    def __init__(self, message: str, leftovers: Sequence[str] = ()) -> None:
        if leftovers:
            message += f"; could not undo: {'; '.join(leftovers)}"
        super().__init__(message)
        self.leftovers = tuple(leftovers)


def set_up(session: NetlinkSession, links: Sequence[LinkAsk]) -> list[Done]:
    """Every interface of `links` in the session's pod; SetupError (everything undone)
    naming the entry and the step that failed."""
    done: list[Done] = []
    for link in links:
        step = "looking it up"
        info: LinkInfo | None = None
        try:
            info = session.host_link(link.host)
            if info is None:
                what = "interface" if link.kind == "move" else "parent"
                raise SetupError(
                    f"{NETDEVS} {link.entry}: {what} {link.host} is not on the host (any more)",
                    tear_down(session, done),
                )
            if link.kind == "move":
                step = f"moving {link.host} into the pod as {link.name}"
                session.move_in(info.index, link.name)
                done.append(Done.moved(link, info))
            else:
                step = f"creating {link.kind} {link.name} on {link.host}"
                session.create(link.name, link.kind, info.index, link.mode)
                done.append(Done(link.name, link.kind, link.host))
            step = f"configuring {link.name}"
            session.configure(link.name, link.mtu, link.addresses)
        except OSError as exc:
            if (
                link.kind == "move"
                and info is not None
                and not any(d.host == link.host for d in done)
            ):
                # The kernel moves first and renames in the pod after: a name taken there
                # fails the rename with the interface already moved, under its host name.
                stray = _moved_there(session, info)
                if stray is not None:
                    done.append(Done.moved(replace(link, name=stray.name), info))
            raise SetupError(
                f"{NETDEVS} {link.entry}: {step}: {exc.strerror or exc}", tear_down(session, done)
            ) from exc
    return done


def _moved_there(session: NetlinkSession, info: LinkInfo) -> LinkInfo | None:
    """The host interface `info` if it is in the pod now (same index and MAC address)."""
    try:
        links = session.pod_links()
    except OSError:
        return None
    return next((x for x in links if x.index == info.index and x.mac == info.mac), None)


def tear_down(session: NetlinkSession, done: Sequence[Done]) -> list[str]:
    """Undo `done` in reverse. Returns what could not be undone (empty: everything). An
    interface no longer in the pod is not a failure: a moved one is looked for on the host."""
    problems = []
    for item in reversed(done):
        try:
            if session.pod_link(item.name) is None:
                if item.kind == "move":
                    problems.extend(repair_host(session, [item]))
                continue
            if item.kind == "move":
                session.move_out(item.name, item.host)
                back = session.host_link(item.host)
                if back is not None:
                    session.restore(back.index, item.host, item.mtu, item.up)
            else:
                session.delete(item.name)
        except OSError as exc:
            problems.append(f"{item.name} ({_what(item)}): {exc.strerror or exc}")
    return problems


def repair_host(session: NetlinkSession, done: Sequence[Done]) -> list[str]:
    """Moved interfaces whose pod namespace is gone (or that left it): each one on the host
    gets its name, MTU and state back. Returns what could not be repaired; a virtual
    interface that went with its namespace is no failure."""
    moved = [d for d in done if d.kind == "move"]
    if not moved:
        return []
    problems = []
    links = session.host_links()
    for item in moved:
        found = [link for link in links if link.mac == item.mac and link.index == item.index]
        if not found:  # a new index: the one with its MAC that is not an upper device
            found = [link for link in links if link.mac == item.mac and link.kind not in _UPPER]
        if len(found) != 1:
            if found:
                names = ", ".join(link.name for link in found)
                problems.append(f"{item.host}: several host interfaces have its MAC ({names})")
            continue  # not on the host: a virtual interface, gone with the namespace
        link = found[0]
        if link.name == item.host and link.mtu == item.mtu and link.up == item.up:
            continue
        try:
            session.restore(link.index, item.host, item.mtu, item.up)
        except OSError as exc:
            problems.append(f"{item.host} (now {link.name}): {exc.strerror or exc}")
    return problems


def present(session: NetlinkSession, links: Sequence[LinkAsk]) -> list[str]:
    """The names of `links` that are in the session's pod now."""
    names = {link.name for link in session.pod_links()}
    return [link.name for link in links if link.name in names]


def _what(item: Done) -> str:
    return f"moved from {item.host}" if item.kind == "move" else f"{item.kind} on {item.host}"
