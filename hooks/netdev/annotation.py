"""What a pod asks for in its network namespace: `netdevs.crihook.io/pod`, a JSON list.

    [{"name": "net1", "interface": "enp1s0f0v3",              move a host interface in
      "addresses": ["192.168.50.7/24"], "mtu": 9000},
     {"name": "net2", "type": "macvlan", "parent": "eth1",     create one on a host parent
      "mode": "bridge", "addresses": ["fd00::7/64"]},
     {"name": "net3", "type": "ipvlan", "parent": "eth1", "mode": "l2"}]

- `name`: the interface's name in the pod (a Linux interface name, not `lo`).
- either `interface` (a host interface, moved in and back out under its own name), or `type`
  `macvlan` (modes bridge, private, vepa, passthru; default bridge) or `ipvlan` (modes l2, l3,
  l3s; default l2) with a `parent` host interface.
- `addresses`: optional, each an address with its prefix length (IPv4 or IPv6).
- `mtu`: optional, 68..65535.

`parse_netdev_annotation` is pure: every problem raises AnnotationError naming the entry.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass
from typing import Any

from crihook.hooks.spec.errors import shown, shown_all

__all__ = [
    "MAX_LINKS",
    "NETDEVS",
    "AnnotationError",
    "LinkAsk",
    "parse_netdev_annotation",
    "valid_ifname",
]

NETDEVS = "netdevs.crihook.io/pod"
MAX_LINKS = 16
MAX_VALUE_CHARS = 16 * 1024
MAX_ADDRESSES = 16
MODES = {"macvlan": ("bridge", "private", "vepa", "passthru"), "ipvlan": ("l2", "l3", "l3s")}
_KEYS = frozenset({"name", "interface", "type", "parent", "mode", "addresses", "mtu"})
# The kernel's dev_valid_name: 1..15 bytes, not "." or "..", no '/', ':' or whitespace.
_IFNAME = re.compile(r"[!-~]{1,15}")


class AnnotationError(ValueError):
    def __init__(self, message: str, entry: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.entry = entry

    def __str__(self) -> str:
        where = f"annotation {NETDEVS}" + (f" {self.entry}" if self.entry else "")
        return f"{where}: {self.message}"


@dataclass(frozen=True, slots=True)
class LinkAsk:
    name: str
    """In the pod."""
    kind: str
    """`move`, `macvlan` or `ipvlan`."""
    host: str
    """The host interface moved in (`move`), or the parent (macvlan, ipvlan)."""
    mode: str = ""
    addresses: tuple[str, ...] = ()
    """`address/prefix`, normalized."""
    mtu: int | None = None
    entry: str = ""
    """`[0]`: where it was asked, for messages."""

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"name": self.name, "kind": self.kind, "host": self.host}
        if self.mode:
            doc["mode"] = self.mode
        if self.addresses:
            doc["addresses"] = list(self.addresses)
        if self.mtu is not None:
            doc["mtu"] = self.mtu
        if self.entry:
            doc["entry"] = self.entry
        return doc

    @classmethod
    def from_dict(cls, doc: Any) -> LinkAsk:
        return cls(
            name=str(doc["name"]),
            kind=str(doc["kind"]),
            host=str(doc["host"]),
            mode=str(doc.get("mode", "")),
            addresses=tuple(str(a) for a in doc.get("addresses", ())),
            mtu=int(doc["mtu"]) if doc.get("mtu") is not None else None,
            entry=str(doc.get("entry", "")),
        )


def valid_ifname(name: object) -> bool:
    return (
        isinstance(name, str)
        and bool(_IFNAME.fullmatch(name))
        and len(name.encode()) <= 15
        and name not in (".", "..")
        and "/" not in name
        and ":" not in name
    )


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise AnnotationError(f"{shown(key)} appears twice in one object")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise AnnotationError(f"{name} is not a JSON number")


def parse_netdev_annotation(value: object) -> tuple[LinkAsk, ...]:
    if not isinstance(value, str):
        raise AnnotationError(f"the value is not a string but {type(value).__name__}")
    if len(value) > MAX_VALUE_CHARS:
        raise AnnotationError(f"the value is longer than {MAX_VALUE_CHARS} characters")
    try:
        doc = json.loads(value, object_pairs_hook=_unique, parse_constant=_no_constant)
    except AnnotationError:
        raise
    except RecursionError:
        raise AnnotationError("the value is nested too deeply") from None
    except ValueError as exc:
        raise AnnotationError(f"the value is not JSON ({exc})") from None
    if not isinstance(doc, list) or not doc:
        raise AnnotationError('expected a non-empty JSON list like [{"name": "net1", ...}]')
    if len(doc) > MAX_LINKS:
        raise AnnotationError(f"{len(doc)} interfaces; at most {MAX_LINKS} are allowed")
    out = []
    names: set[str] = set()
    hosts: set[str] = set()
    for i, item in enumerate(doc):
        ask = _link(item, f"[{i}]")
        if ask.name in names:
            raise AnnotationError(f"name {ask.name} is given twice", ask.entry)
        names.add(ask.name)
        if ask.kind == "move":
            if ask.host in hosts:
                raise AnnotationError(f"interface {ask.host} is given twice", ask.entry)
            hosts.add(ask.host)
        out.append(ask)
    for ask in out:
        if ask.kind != "move" and ask.host in hosts:
            raise AnnotationError(
                f"parent {ask.host} is moved into the pod by another entry", ask.entry
            )
    return tuple(out)


def _link(item: Any, entry: str) -> LinkAsk:
    if not isinstance(item, dict):
        raise AnnotationError("expected an object", entry)
    unknown = sorted(set(item) - _KEYS)
    if unknown:
        raise AnnotationError(
            f"unknown key(s) {shown_all(unknown)} (known: {', '.join(sorted(_KEYS))})",
            entry,
        )
    name = item.get("name")
    if not valid_ifname(name) or name == "lo":
        raise AnnotationError(
            f"name {shown(name)} is not an interface name (1-15 visible characters, no '/' or ':', "
            "not lo)",
            entry,
        )
    assert isinstance(name, str)
    if "interface" in item:
        if "type" in item or "parent" in item or "mode" in item:
            raise AnnotationError(
                "give interface (to move one) or type and parent, not both", entry
            )
        host = item["interface"]
        kind, mode = "move", ""
        what = "interface"
    else:
        asked = item.get("type")
        if not isinstance(asked, str) or asked not in MODES:
            raise AnnotationError(
                f"type {shown(asked)}: give interface (a host interface to move in) or type "
                "macvlan or ipvlan with a parent",
                entry,
            )
        kind = asked
        host = item.get("parent")
        mode = item.get("mode", MODES[kind][0])
        if mode not in MODES[kind]:
            raise AnnotationError(
                f"mode {shown(mode)} is not a {kind} mode ({', '.join(MODES[kind])})", entry
            )
        what = "parent"
    if not valid_ifname(host) or host == "lo":
        raise AnnotationError(f"{what} {shown(host)} is not a host interface name", entry)
    assert isinstance(host, str)
    addresses = item.get("addresses", [])
    if not isinstance(addresses, list) or len(addresses) > MAX_ADDRESSES:
        raise AnnotationError(f"addresses must be a list of at most {MAX_ADDRESSES}", entry)
    normalized = []
    for address in addresses:
        if not isinstance(address, str) or "/" not in address:
            raise AnnotationError(
                f"address {shown(address)} is not an address with its prefix (10.0.0.5/24)", entry
            )
        try:
            normalized.append(str(ipaddress.ip_interface(address)))
        except ValueError:
            raise AnnotationError(
                f"address {shown(address)} is not an IPv4 or IPv6 address with its prefix length",
                entry,
            ) from None
    if len(set(normalized)) != len(normalized):
        raise AnnotationError("an address is given twice", entry)
    mtu = item.get("mtu")
    if mtu is not None and (
        isinstance(mtu, bool) or not isinstance(mtu, int) or not 68 <= mtu <= 65535
    ):
        raise AnnotationError(f"mtu {shown(mtu)} is not a whole number in 68..65535", entry)
    return LinkAsk(name, kind, host, mode, tuple(normalized), mtu, entry)
