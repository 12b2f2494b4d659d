"""kubelet's QoS-level cgroups: where Burstable and BestEffort pods' cgroups sit.

kubelet's QoS container manager makes one cgroup per QoS class below its node cgroup
(`kubepods`) and puts each Burstable and BestEffort pod's cgroup in its class's; a
Guaranteed pod's cgroup sits directly in `kubepods`. The QoS cgroup is therefore the pod
cgroup's parent, whichever driver and cgroup root kubelet runs with:

- cgroupfs: ``/kubepods/burstable/pod<uid>`` → ``kubepods/burstable``
  (``/<root>/kubepods/besteffort/pod<uid>`` with kubelet's ``--cgroup-root``);
- systemd: ``kubepods-burstable-pod<uid>.slice`` →
  ``kubepods.slice/kubepods-burstable.slice``.

Paths are relative to the cgroup v2 tree's root. Pure: nothing here touches the host.
"""

from __future__ import annotations

from dataclasses import dataclass

from crihook.hooks.node.host import pod_cgroup_path

__all__ = ["DEFAULT_QOS_CGROUPS", "QOS_BESTEFFORT", "QOS_BURSTABLE", "QosCgroup", "qos_cgroup"]

QOS_BURSTABLE = "burstable"
QOS_BESTEFFORT = "besteffort"


@dataclass(frozen=True, slots=True)
class QosCgroup:
    path: str
    """Relative to the cgroup root, e.g. ``kubepods/burstable``."""
    qos: str
    """`burstable` or `besteffort`."""


DEFAULT_QOS_CGROUPS = (
    QosCgroup("kubepods/burstable", QOS_BURSTABLE),
    QosCgroup("kubepods/besteffort", QOS_BESTEFFORT),
    QosCgroup("kubepods.slice/kubepods-burstable.slice", QOS_BURSTABLE),
    QosCgroup("kubepods.slice/kubepods-besteffort.slice", QOS_BESTEFFORT),
)
"""Where kubelet puts them with its default cgroup root, for either driver: known before
any pod is seen (a node's first pod then finds its QoS cgroup written already)."""


def qos_cgroup(cgroup_parent: str) -> QosCgroup | None:
    """The QoS cgroup a pod's cgroup sits in, from the sandbox's `cgroup_parent`; None for a
    Guaranteed pod (directly in `kubepods`), an empty parent, or a parent that is no kubelet
    pod cgroup of a QoS class."""
    try:
        relative = pod_cgroup_path(cgroup_parent)
    except ValueError:
        return None
    parent, _, _pod = relative.rpartition("/")
    if not parent:
        return None
    name = parent.rpartition("/")[2]
    stem = name.removesuffix(".slice") if name.endswith(".slice") else name
    for qos in (QOS_BURSTABLE, QOS_BESTEFFORT):
        # cgroupfs names the directory for the class; systemd's slice ends in `-<class>`.
        if stem == qos or (name.endswith(".slice") and stem.endswith(f"-{qos}")):
            return QosCgroup(parent, qos)
    return None
