"""The node's policy for the `netdev` hook (`[hooks.netdev]`), and the check of a pod's
request against it.

    [hooks.netdev]
    namespaces = ["net-*"]          # who may ask at all (globs; default: nobody)
    interfaces = ["enp1s0f0v*"]     # host interfaces pods may have moved in (globs)
    parents = ["eth1"]              # host interfaces pods may hang a macvlan/ipvlan on
    max_links = 4                   # interfaces per pod (default 4)

Every list defaults to empty: the default policy allows nothing. A refusal names the entry:
not allowed → Forbidden (PERMISSION_DENIED).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from crihook.hooks.netdev.annotation import MAX_LINKS, NETDEVS, LinkAsk
from crihook.hooks.node.globs import GlobSet
from crihook.hooks.spec import Forbidden
from crihook.hooks.spec.options import reject_unknown

__all__ = ["NetdevPolicy", "check_links", "parse_policy"]

_KEYS = frozenset({"namespaces", "interfaces", "parents", "max_links"})


@dataclass(frozen=True)
class NetdevPolicy:
    namespaces: GlobSet = field(default_factory=GlobSet)
    interfaces: GlobSet = field(default_factory=GlobSet)
    parents: GlobSet = field(default_factory=GlobSet)
    max_links: int = 4


def parse_policy(options: Mapping[str, Any]) -> NetdevPolicy:
    """`[hooks.netdev]` as a NetdevPolicy; ValueError naming the option."""
    reject_unknown("netdev", options, _KEYS)
    globs = {}
    for key in ("namespaces", "interfaces", "parents"):
        value = options.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"netdev: {key} must be a list of strings (globs)")
        try:
            globs[key] = GlobSet.of_names(value)
        except ValueError as exc:
            raise ValueError(f"netdev: {key}: {exc}") from None
    max_links = options.get("max_links", 4)
    if isinstance(max_links, bool) or not isinstance(max_links, int):
        raise ValueError(f"netdev: max_links {max_links!r} is not a whole number")
    if not 1 <= max_links <= MAX_LINKS:
        raise ValueError(f"netdev: max_links {max_links} is not in 1..{MAX_LINKS}")
    return NetdevPolicy(globs["namespaces"], globs["interfaces"], globs["parents"], max_links)


def check_links(policy: NetdevPolicy, namespace: str, links: Sequence[LinkAsk]) -> None:
    """Forbidden naming the first entry the policy does not allow."""
    if not policy.namespaces.matches(namespace):
        raise Forbidden(
            f"namespace {namespace!r} may not ask for network interfaces ({NETDEVS}): "
            f"[hooks.netdev] namespaces allows {policy.namespaces.describe()}"
        )
    if len(links) > policy.max_links:
        raise Forbidden(
            f"{NETDEVS}: {len(links)} interfaces asked, at most {policy.max_links} per pod "
            "([hooks.netdev] max_links)"
        )
    for link in links:
        if link.kind == "move" and not policy.interfaces.matches(link.host):
            raise Forbidden(
                f"{NETDEVS} {link.entry}: interface {link.host} may not be moved into a pod "
                f"([hooks.netdev] interfaces allows {policy.interfaces.describe()})"
            )
        if link.kind != "move" and not policy.parents.matches(link.host):
            raise Forbidden(
                f"{NETDEVS} {link.entry}: {link.kind} on {link.host} is not allowed "
                f"([hooks.netdev] parents allows {policy.parents.describe()})"
            )
