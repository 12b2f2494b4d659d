"""Pure conversions between the hook spec's Python types and the plugin protocol's messages.

Explicit presence survives the trip: a None in a view or a ResourceDelta is an unset
`optional` field, a scalar an Adjustment does not name stays unset (so `cpu_quota=0` and "no
cpu_quota" differ), and keyed removals travel in the `remove_*` lists. Env variables keep their
order. Adjustments read from the wire go through the Adjustment builder, so a plugin's values
are validated exactly like an in-process hook's (ValueError/TypeError on bad input).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from types import MappingProxyType
from typing import Any, cast

from crihook.api.hook.v1 import hook_pb2
from crihook.hooks.spec.adjustment import (
    REMOVE,
    Adjustment,
    ContainerUpdate,
    Field,
    ResourceDelta,
)
from crihook.hooks.spec.events import PLUGIN_STAGES, Event, Stage
from crihook.hooks.spec.views import (
    ContainerKind,
    ContainerView,
    PodView,
    QoSClass,
    ResourcesView,
)

__all__ = [
    "adjustment_from_proto",
    "adjustment_to_proto",
    "container_from_proto",
    "container_to_proto",
    "event_from_proto",
    "event_to_proto",
    "pod_from_proto",
    "pod_to_proto",
    "resources_from_proto",
    "resources_to_proto",
    "stage_from_proto",
    "stage_to_proto",
    "subscriptions_from_proto",
    "subscriptions_to_proto",
    "update_from_proto",
    "update_to_proto",
]

# --- events and stages ---------------------------------------------------------------------
# The proto enums use the Python enum member names, so the tables are built from them.
# (cast: the generated stubs type Value() as int, the message fields as the enum type.)
_EVENT_TO_PROTO: dict[Event, hook_pb2.Event] = {
    e: cast("hook_pb2.Event", hook_pb2.Event.Value(e.name)) for e in Event
}
_EVENT_FROM_PROTO: dict[int, Event] = {v: e for e, v in _EVENT_TO_PROTO.items()}
_STAGE_TO_PROTO: dict[Stage, hook_pb2.Stage] = {
    s: cast("hook_pb2.Stage", hook_pb2.Stage.Value(s.name)) for s in PLUGIN_STAGES
}
_STAGE_FROM_PROTO: dict[int, Stage] = {v: s for s, v in _STAGE_TO_PROTO.items()}


def event_to_proto(event: Event) -> hook_pb2.Event:
    return _EVENT_TO_PROTO[event]


def event_from_proto(value: int) -> Event:
    """ValueError for EVENT_UNSPECIFIED or a value this version does not know."""
    try:
        return _EVENT_FROM_PROTO[value]
    except KeyError:
        raise ValueError(f"unknown event {value}") from None


def stage_to_proto(stage: Stage) -> hook_pb2.Stage:
    return _STAGE_TO_PROTO[stage]


def stage_from_proto(value: int) -> Stage:
    try:
        return _STAGE_FROM_PROTO[value]
    except KeyError:
        raise ValueError(f"unknown stage {value}") from None


def subscriptions_to_proto(subs: Iterable[tuple[Event, Stage]]) -> list[hook_pb2.Subscription]:
    """In a stable order (event, then pre before post), so answers compare equal."""
    ordered = sorted(subs, key=lambda s: (_EVENT_TO_PROTO[s[0]], _STAGE_TO_PROTO[s[1]]))
    return [
        hook_pb2.Subscription(event=_EVENT_TO_PROTO[e], stage=_STAGE_TO_PROTO[s])
        for e, s in ordered
    ]


def subscriptions_from_proto(
    subs: Iterable[hook_pb2.Subscription],
) -> tuple[frozenset[tuple[Event, Stage]], list[hook_pb2.Subscription]]:
    """The known subscriptions, and those this version does not know (for the caller to log)."""
    known: set[tuple[Event, Stage]] = set()
    unknown: list[hook_pb2.Subscription] = []
    for sub in subs:
        event, stage = _EVENT_FROM_PROTO.get(sub.event), _STAGE_FROM_PROTO.get(sub.stage)
        if event is None or stage is None:
            unknown.append(sub)
        else:
            known.add((event, stage))
    return frozenset(known), unknown


# --- views ---------------------------------------------------------------------------------
# The view dataclasses and the proto messages use the same field names (a unit test holds
# them together), so decoding takes the fields that are present in one call (ListFields):
# absent optionals stay None, absent strings keep the view's "" default.
_OPTIONAL_RESOURCES = (
    "cpu_request_milli",
    "cpu_limit_milli",
    "memory_limit_bytes",
    "integer_cpus",
    "oom_score_adj",
    "cpu_shares",
    "cpu_quota",
    "cpu_period",
)
# A newer peer may send a class this version does not know: degrade to UNKNOWN, don't fail.
_QOS: dict[str, QoSClass] = {q.value: q for q in QoSClass}
_KIND: dict[str, ContainerKind] = {k.value: k for k in ContainerKind}


def _present(msg: Any) -> dict[str, Any]:
    return {fd.name: value for fd, value in msg.ListFields()}


def _frozen_maps(fields: dict[str, Any], *names: str) -> None:
    for name in names:
        if name in fields:
            fields[name] = MappingProxyType(dict(fields[name]))


def resources_to_proto(view: ResourcesView) -> hook_pb2.Resources:
    msg = hook_pb2.Resources(
        qos_class=view.qos_class.value,
        cpuset_cpus=view.cpuset_cpus,
        cpuset_mems=view.cpuset_mems,
        hugepage_limits=view.hugepage_limits,
    )
    for name in _OPTIONAL_RESOURCES:
        value = getattr(view, name)
        if value is not None:
            setattr(msg, name, value)
    return msg


def resources_from_proto(msg: hook_pb2.Resources) -> ResourcesView:
    fields = _present(msg)
    fields["qos_class"] = _QOS.get(fields.get("qos_class", ""), QoSClass.UNKNOWN)
    _frozen_maps(fields, "hugepage_limits")
    return ResourcesView(**fields)


def pod_to_proto(view: PodView) -> hook_pb2.Pod:
    msg = hook_pb2.Pod(
        id=view.id,
        uid=view.uid,
        name=view.name,
        namespace=view.namespace,
        attempt=view.attempt,
        labels=view.labels,
        annotations=view.annotations,
        cgroup_parent=view.cgroup_parent,
        runtime_handler=view.runtime_handler,
        qos_class=view.qos_class.value,
    )
    if view.resources is not None:
        msg.resources.CopyFrom(resources_to_proto(view.resources))
    return msg


def pod_from_proto(msg: hook_pb2.Pod) -> PodView:
    fields = _present(msg)
    fields["qos_class"] = _QOS.get(fields.get("qos_class", ""), QoSClass.UNKNOWN)
    _frozen_maps(fields, "labels", "annotations")
    if "resources" in fields:
        fields["resources"] = resources_from_proto(fields["resources"])
    return PodView(**{"id": "", "uid": "", "name": "", "namespace": "", **fields})


def container_to_proto(view: ContainerView) -> hook_pb2.Container:
    return hook_pb2.Container(
        id=view.id,
        pod_id=view.pod_id,
        name=view.name,
        attempt=view.attempt,
        image=view.image,
        labels=view.labels,
        annotations=view.annotations,
        kind=view.kind.value,
        resources=resources_to_proto(view.resources),
        cdi_devices=view.cdi_devices,
    )


def container_from_proto(msg: hook_pb2.Container) -> ContainerView:
    fields = _present(msg)
    fields["kind"] = _KIND.get(fields.get("kind", ""), ContainerKind.UNKNOWN)
    _frozen_maps(fields, "labels", "annotations")
    if "resources" in fields:
        fields["resources"] = resources_from_proto(fields["resources"])
    if "cdi_devices" in fields:
        fields["cdi_devices"] = tuple(fields["cdi_devices"])
    return ContainerView(**{"id": "", "pod_id": "", "name": "", **fields})


# --- container updates -----------------------------------------------------------------------
def update_to_proto(update: ContainerUpdate) -> hook_pb2.ContainerUpdate:
    msg = hook_pb2.ContainerUpdate(container_id=update.container_id)
    msg.resources.SetInParent()  # present even if every delta field is unset
    for name, value in update.resources.items():
        setattr(msg.resources, name, value)
    return msg


def _delta_from_proto(msg: hook_pb2.ResourceDelta) -> ResourceDelta:
    return ResourceDelta(**_present(msg))


def update_from_proto(msg: hook_pb2.ContainerUpdate) -> ContainerUpdate:
    return ContainerUpdate(msg.container_id, _delta_from_proto(msg.resources))


# --- adjustments -----------------------------------------------------------------------------
# Scalars whose Field value is also the proto field name, with the builder that validates them.
_SCALARS: dict[Field, Callable[[Adjustment, Any], Adjustment]] = {
    Field.CGROUP_PARENT: Adjustment.set_cgroup_parent,
    Field.CPUSET_CPUS: Adjustment.set_cpuset_cpus,
    Field.CPUSET_MEMS: Adjustment.set_cpuset_mems,
    Field.CPU_SHARES: Adjustment.set_cpu_shares,
    Field.CPU_QUOTA: Adjustment.set_cpu_quota,
    Field.CPU_PERIOD: Adjustment.set_cpu_period,
    Field.MEMORY_LIMIT: Adjustment.set_memory_limit,
    Field.MEMORY_SWAP_LIMIT: Adjustment.set_memory_swap_limit,
    Field.OOM_SCORE_ADJ: Adjustment.set_oom_score_adj,
}
# Keyed string maps: (set map, remove list).
_STRING_MAPS: dict[Field, tuple[str, str]] = {
    Field.LABEL: ("set_labels", "remove_labels"),
    Field.ANNOTATION: ("set_annotations", "remove_annotations"),
    Field.UNIFIED: ("set_unified", "remove_unified"),
}


def adjustment_to_proto(adj: Adjustment) -> hook_pb2.Adjustment:
    """ValueError for a REMOVE the protocol cannot carry (a scalar or a hugepage limit)."""
    msg = hook_pb2.Adjustment()
    for (field, key), value in adj.changes.items():
        _ENCODERS[field](msg, key, value)
    msg.updates.extend(update_to_proto(u) for u in adj.updates)
    return msg


# One encoder per Field, as `_DECODERS` has one decoder per proto field: (message, key, value).
_Encoder = Callable[[hook_pb2.Adjustment, str, Any], None]


def _scalar(name: str) -> _Encoder:
    def encode(msg: hook_pb2.Adjustment, key: str, value: Any) -> None:
        if value is REMOVE:
            raise ValueError(f"{name} cannot be removed, only set")
        setattr(msg, name, value)

    return encode


def _string_map(set_map: str, remove_list: str) -> _Encoder:
    def encode(msg: hook_pb2.Adjustment, key: str, value: Any) -> None:
        if value is REMOVE:
            getattr(msg, remove_list).append(key)
        else:
            getattr(msg, set_map)[key] = value

    return encode


def _hugepage_limit(msg: hook_pb2.Adjustment, key: str, value: Any) -> None:
    if value is REMOVE:
        raise ValueError(f"hugepage limit {key!r} cannot be removed, only set")
    msg.hugepage_limits[key] = value


def _device(msg: hook_pb2.Adjustment, key: str, value: Any) -> None:
    if value is REMOVE:
        msg.remove_devices.append(key)
    else:
        msg.add_devices.add(
            container_path=value.container_path,
            host_path=value.host_path,
            permissions=value.permissions,
        )


def _mount(msg: hook_pb2.Adjustment, key: str, value: Any) -> None:
    if value is REMOVE:
        msg.remove_mounts.append(key)
    else:
        msg.add_mounts.add(
            container_path=value.container_path,
            host_path=value.host_path,
            readonly=value.readonly,
            propagation=value.propagation,
            selinux_relabel=value.selinux_relabel,
        )


def _env(msg: hook_pb2.Adjustment, key: str, value: Any) -> None:
    if value is REMOVE:
        msg.remove_env.append(key)
    else:
        msg.set_env.add(name=key, value=value)


def _cdi_device(msg: hook_pb2.Adjustment, key: str, value: Any) -> None:
    (msg.remove_cdi_devices if value is REMOVE else msg.add_cdi_devices).append(key)


_ENCODERS: dict[Field, _Encoder] = {
    **{field: _scalar(field.value) for field in _SCALARS},
    **{field: _string_map(*names) for field, names in _STRING_MAPS.items()},
    Field.HUGEPAGE_LIMIT: _hugepage_limit,
    Field.DEVICE: _device,
    Field.MOUNT: _mount,
    Field.ENV: _env,
    Field.CDI_DEVICE: _cdi_device,
}


def adjustment_from_proto(msg: hook_pb2.Adjustment) -> Adjustment:
    """Rebuild through the builder: ValueError/TypeError for values it would refuse."""
    adj = Adjustment()
    for fd, value in msg.ListFields():  # only the fields present, in field-number order
        _DECODERS[fd.name](adj, value)
    return adj


def _each(apply: Callable[[Adjustment, Any], Adjustment]) -> _Decoder:
    def decode(adj: Adjustment, items: Any) -> None:
        for item in items:
            apply(adj, item)

    return decode


def _sorted_map(apply: Callable[[Adjustment, str, Any], Adjustment]) -> _Decoder:
    # Proto maps have no order; a stable one keeps logs and audits stable.
    def decode(adj: Adjustment, entries: Any) -> None:
        for key in sorted(entries):
            apply(adj, key, entries[key])

    return decode


def _update(adj: Adjustment, msg: hook_pb2.ContainerUpdate) -> Adjustment:
    update = update_from_proto(msg)
    return adj.update_container(update.container_id, update.resources)


_Decoder = Callable[[Adjustment, Any], Any]
_DECODERS: dict[str, _Decoder] = {
    **{field.value: setter for field, setter in _SCALARS.items()},
    "set_labels": _sorted_map(Adjustment.set_label),
    "remove_labels": _each(Adjustment.remove_label),
    "set_annotations": _sorted_map(Adjustment.set_annotation),
    "remove_annotations": _each(Adjustment.remove_annotation),
    "hugepage_limits": _sorted_map(Adjustment.set_hugepage_limit),
    "set_unified": _sorted_map(Adjustment.set_unified),
    "remove_unified": _each(Adjustment.remove_unified),
    "add_devices": _each(
        lambda adj, d: adj.add_device(d.container_path, d.host_path, d.permissions)
    ),
    "remove_devices": _each(Adjustment.remove_device),
    "add_mounts": _each(
        lambda adj, m: adj.add_mount(
            m.container_path,
            m.host_path,
            readonly=m.readonly,
            propagation=m.propagation or "private",
            selinux_relabel=m.selinux_relabel,
        )
    ),
    "remove_mounts": _each(Adjustment.remove_mount),
    "set_env": _each(lambda adj, env: adj.set_env(env.name, env.value)),  # order kept
    "remove_env": _each(Adjustment.remove_env),
    "add_cdi_devices": _each(Adjustment.add_cdi_device),
    "remove_cdi_devices": _each(Adjustment.remove_cdi_device),
    "updates": _each(_update),
}
