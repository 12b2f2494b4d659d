"""The nine intercepted CRI calls, one row each: everything crihook knows per call.

A row (`EventSpec`) says what the call carries and does: its CRI request and response types,
what it names (a new pod or container, or an existing one by id), which fields hooks may
change and where in the request the resources and the labels/annotations live, the parts it
must carry and the resources checked at the door, whether required hooks hold, whether hooks
are asked for NUMA hints, whether it waits for an update due to its container, what the
pipeline does around it, what it changes in the store, and where its secrets are.

The pipeline, the merge, the door checks, the chain, the recording's redaction and both
servers read these rows; nothing else keeps a list of events. A call with no row is not
intercepted: the servers forward it as bytes, and a Pipeline given a table without it
refuses it. Every path and getter is computed once per row, when the table is built, so a call
pays one lookup for its row and nothing more.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from google.protobuf.message import Message

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.spec.adjustment import RESOURCE_FIELDS, Field
from crihook.hooks.spec.events import HINT_EVENTS, Event
from crihook.proxy.cri import requests
from crihook.proxy.cri.methods import method_path

__all__ = [
    "ALLOWED_FIELDS",
    "EVENTS",
    "INTERCEPTED",
    "EventSpec",
    "Secret",
    "StoreEffect",
    "Target",
]


class Target(enum.Enum):
    """What the request names, and so where the pipeline finds the pod and container views."""

    NEW_POD = "new pod"  # the pod's config (RunPodSandbox)
    NEW_CONTAINER = "new container"  # its pod by id or sandbox_config, its own config
    POD = "pod"  # a pod by pod_sandbox_id
    CONTAINER = "container"  # a container by container_id, then its pod

    __hash__ = object.__hash__  # singletons, looked up on every call (as Event)


class StoreEffect(enum.Enum):
    """What the store keeps once the runtime answered OK."""

    PUT_POD = "put pod"
    PUT_CONTAINER = "put container"
    CONTAINER_RESOURCES = "container resources"
    POD_RESOURCES = "pod resources"
    RUNNING = "running"
    EXITED = "exited"
    REMOVE_CONTAINER = "remove container"
    REMOVE_POD = "remove pod"
    NOTHING = "nothing"

    __hash__ = object.__hash__


class Secret(enum.Enum):
    """What a recording redacts in a part of a request."""

    ENVS = "envs"  # every value
    ANNOTATIONS = "annotations"  # the values the redaction globs match


def _itself(message: Any) -> Any:
    return message


def _getter(path: str) -> Callable[[Any], Any]:
    """The part of a message at a dotted path ("" is the message itself)."""
    return attrgetter(path) if path else _itself


@dataclass(frozen=True, slots=True)
class EventSpec:
    """One intercepted call: what it names, what the store keeps of it and what it must
    carry; the rest defaults to what the id-only calls (stop, remove) have. The fields after
    `secrets` are computed from the others (the CRI types from the method's name, the hints
    from the hook API's `HINT_EVENTS`)."""

    event: Event
    target: Target
    store: StoreEffect
    required: Callable[[Any], str | None]
    """What is missing from the request (crihook.proxy.cri.requests), or None."""
    fields: frozenset[Field] = frozenset()
    """What hooks may change in the request at the pre stage (none at post). Empty: the call
    carries only ids, and hooks there may only update other containers."""
    resources_at: str | None = None
    """Dotted path of the LinuxContainerResources (or UpdateContainerResources' `linux`)
    hooks adjust; None: the call carries none."""
    maps_at: str | None = None
    """Dotted path of the message holding the labels and annotations hooks adjust ("": the
    request itself, which has annotations only); None: the call carries none."""
    checked_resources: tuple[str, ...] = ()
    """Dotted paths of the resources checked at the door, each only if the request carries it.
    The path is the `where` of the refusal kubelet reads: keep them as they are."""
    requires_hooks: bool = False
    """Required hooks hold here (where a pod or container is made or shaped; teardown is never
    refused for them: refusing it would only keep alive what already runs)."""
    waits_for_updates: bool = False
    """A call on a container that first waits for the update due to it (issued by another
    pod's call): kubelet and the hooks then see the resources crihook gave it."""
    starts_container: bool = False
    """The container starts: updates due to it wait until the runtime answered."""
    carries_pod_cgroup: bool = False
    """The request's sandbox config gets the cgroup parent the pod was created with."""
    undo_on_post_reject: bool = False
    """A hook refusing the call at the post stage undoes what the runtime made."""
    secrets: tuple[tuple[str, Secret], ...] = ()
    """Dotted paths of the parts a recording redacts, in order."""

    request: type[Message] = field(init=False, compare=False)
    response: type[Message] = field(init=False, compare=False)
    hints: bool = field(init=False, compare=False)
    """Hooks are asked for NUMA hints (hooks.spec.events.HINT_EVENTS decides)."""
    path: str = field(init=False, compare=False)
    """The gRPC method path: /runtime.v1.RuntimeService/<method>."""
    resources: Callable[[Any], Any] | None = field(init=False, compare=False, repr=False)
    labels: Callable[[Any], Any] | None = field(init=False, compare=False, repr=False)
    annotations: Callable[[Any], Any] | None = field(init=False, compare=False, repr=False)
    checked: tuple[tuple[str, Callable[[Any], Any], str], ...] = field(
        init=False, compare=False, repr=False
    )
    """(where, the message holding the field, the field's name) per checked resources."""
    secret_parts: tuple[tuple[Callable[[Any], Any], Secret], ...] = field(
        init=False, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        def computed(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        computed("request", getattr(api_pb2, f"{self.event.value}Request"))
        computed("response", getattr(api_pb2, f"{self.event.value}Response"))
        computed("hints", self.event in HINT_EVENTS)
        computed("path", method_path("RuntimeService", self.event.value))
        computed("resources", None if self.resources_at is None else _getter(self.resources_at))
        if self.maps_at is None:
            computed("labels", None)
            computed("annotations", None)
        elif self.maps_at:
            computed("labels", _getter(f"{self.maps_at}.labels"))
            computed("annotations", _getter(f"{self.maps_at}.annotations"))
        else:  # UpdateContainerResources: annotations only, at its top
            computed("labels", None)
            computed("annotations", _getter("annotations"))
        checked = []
        for where in self.checked_resources:
            parent, _, name = where.rpartition(".")
            checked.append((where, _getter(parent), name))
        computed("checked", tuple(checked))
        computed("secret_parts", tuple((_getter(p), kind) for p, kind in self.secrets))


_NO_OOM = RESOURCE_FIELDS - {Field.OOM_SCORE_ADJ}
_CONTAINER_FIELDS = RESOURCE_FIELDS | {
    Field.LABEL,
    Field.ANNOTATION,
    Field.DEVICE,
    Field.MOUNT,
    Field.ENV,
    Field.CDI_DEVICE,
}
_ROWS = (
    EventSpec(
        Event.RUN_POD_SANDBOX,
        Target.NEW_POD,
        fields=frozenset(_NO_OOM | {Field.CGROUP_PARENT, Field.LABEL, Field.ANNOTATION}),
        resources_at="config.linux.resources",
        maps_at="config",
        required=requests.run_pod_sandbox,
        checked_resources=("config.linux.resources", "config.linux.overhead"),
        requires_hooks=True,
        undo_on_post_reject=True,
        store=StoreEffect.PUT_POD,
        secrets=(("config.annotations", Secret.ANNOTATIONS),),
    ),
    EventSpec(
        Event.CREATE_CONTAINER,
        Target.NEW_CONTAINER,
        fields=frozenset(_CONTAINER_FIELDS),
        resources_at="config.linux.resources",
        maps_at="config",
        required=requests.create_container,
        checked_resources=(
            "config.linux.resources",
            "sandbox_config.linux.resources",
            "sandbox_config.linux.overhead",
        ),
        requires_hooks=True,
        carries_pod_cgroup=True,
        store=StoreEffect.PUT_CONTAINER,
        secrets=(
            ("config.envs", Secret.ENVS),
            ("config.annotations", Secret.ANNOTATIONS),
            ("sandbox_config.annotations", Secret.ANNOTATIONS),
        ),
    ),
    EventSpec(
        Event.START_CONTAINER,
        Target.CONTAINER,
        required=requests.container_id,
        requires_hooks=True,
        waits_for_updates=True,
        starts_container=True,
        store=StoreEffect.RUNNING,
    ),
    EventSpec(
        Event.UPDATE_CONTAINER_RESOURCES,
        Target.CONTAINER,
        fields=frozenset(RESOURCE_FIELDS | {Field.ANNOTATION}),
        resources_at="linux",
        maps_at="",  # annotations only, at the top
        required=requests.container_id,
        checked_resources=("linux",),
        requires_hooks=True,
        waits_for_updates=True,
        store=StoreEffect.CONTAINER_RESOURCES,
        secrets=(("annotations", Secret.ANNOTATIONS),),
    ),
    EventSpec(
        Event.STOP_CONTAINER,
        Target.CONTAINER,
        required=requests.container_id,
        waits_for_updates=True,
        store=StoreEffect.EXITED,
    ),
    EventSpec(
        Event.REMOVE_CONTAINER,
        Target.CONTAINER,
        required=requests.container_id,
        waits_for_updates=True,
        store=StoreEffect.REMOVE_CONTAINER,
    ),
    EventSpec(
        Event.STOP_POD_SANDBOX,
        Target.POD,
        required=requests.pod_sandbox_id,
        store=StoreEffect.NOTHING,
    ),
    EventSpec(
        Event.REMOVE_POD_SANDBOX,
        Target.POD,
        required=requests.pod_sandbox_id,
        store=StoreEffect.REMOVE_POD,
    ),
    EventSpec(
        Event.UPDATE_POD_SANDBOX_RESOURCES,
        Target.POD,
        fields=frozenset(_NO_OOM),
        resources_at="resources",
        required=requests.pod_sandbox_id,
        checked_resources=("resources", "overhead"),
        requires_hooks=True,
        store=StoreEffect.POD_RESOURCES,
    ),
)

EVENTS: Mapping[Event, EventSpec] = {row.event: row for row in _ROWS}
"""Every intercepted call's row. Pipeline, build_server and H2Server take it as an argument."""

INTERCEPTED = EVENTS  # the name readers of "what is intercepted" know
ALLOWED_FIELDS: Mapping[Event, frozenset[Field]] = {e: s.fields for e, s in EVENTS.items()}
