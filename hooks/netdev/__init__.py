"""Network interfaces in a pod's network namespace: a host interface moved in, or a macvlan /
ipvlan made on a host parent, as far as the node's policy allows.

``annotation`` reads what a pod asks for (pure), ``policy`` is the node's allowlist,
``plan`` sets a pod's interfaces up and undoes it over a netlink session (all or nothing),
through the node's `Netlink` seam (`crihook.hooks.node.netlink`, handed to the hook in
`SyncContext.netlink`); ``NetdevHook`` (``hook``) is the built-in hook `netdev`.
"""

from crihook.hooks.netdev.annotation import AnnotationError, LinkAsk, parse_netdev_annotation
from crihook.hooks.netdev.hook import NetdevHook
from crihook.hooks.netdev.policy import NetdevPolicy, check_links, parse_policy

__all__ = [
    "AnnotationError",
    "LinkAsk",
    "NetdevHook",
    "NetdevPolicy",
    "check_links",
    "parse_netdev_annotation",
    "parse_policy",
]
