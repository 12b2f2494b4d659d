"""The lifecycle events hooks act on, and the stages of each.

hints  (CreateContainer, RunPodSandbox) NUMA placements a resource hook could make; merged
       under the node's topology policy before the pre stage (in-process hooks)
pre    before the runtime sees the call: may adjust it
validate after every pre stage, before anything is forwarded: sees the final request and
       who set each field; may only refuse the call
post   after the runtime answered OK: may only update other containers
failed the call failed after this hook's pre stage ran (the runtime refused it, a later
       hook failed it, the state could not be written ahead, kubelet gave up), or the
       hook's adjustment was not applied (dry-run, failure_policy=ignore): release what
       the pre stage took
"""

from __future__ import annotations

import enum

__all__ = [
    "HINT_EVENTS",
    "PLUGIN_STAGES",
    "Event",
    "Stage",
    "stage_method_name",
    "stage_of_method",
]


class Event(enum.Enum):
    """An intercepted CRI call; the value is the CRI method name."""

    RUN_POD_SANDBOX = "RunPodSandbox"
    CREATE_CONTAINER = "CreateContainer"
    START_CONTAINER = "StartContainer"
    UPDATE_CONTAINER_RESOURCES = "UpdateContainerResources"
    STOP_CONTAINER = "StopContainer"
    REMOVE_CONTAINER = "RemoveContainer"
    STOP_POD_SANDBOX = "StopPodSandbox"
    REMOVE_POD_SANDBOX = "RemovePodSandbox"
    UPDATE_POD_SANDBOX_RESOURCES = "UpdatePodSandboxResources"

    # Members are singletons: identity hashing is exact, and several times cheaper than
    # Enum's hash-by-name on the chain's per-call (event, stage) lookups.
    __hash__ = object.__hash__

    @property
    def snake(self) -> str:
        return _SNAKE[self]


class Stage(enum.Enum):
    HINTS = "hints"  # NUMA hints, before pre (in-process hooks)
    PRE = "pre"  # before the runtime sees the call: may adjust it
    VALIDATE = "validate"  # after every pre stage: may only refuse the call
    POST = "post"  # after the runtime answered OK: may only update other containers
    FAILED = "failed"  # the call failed, or this hook's adjustment was not applied

    __hash__ = object.__hash__  # as Event


_SNAKE = {
    Event.RUN_POD_SANDBOX: "run_pod_sandbox",
    Event.CREATE_CONTAINER: "create_container",
    Event.START_CONTAINER: "start_container",
    Event.UPDATE_CONTAINER_RESOURCES: "update_container_resources",
    Event.STOP_CONTAINER: "stop_container",
    Event.REMOVE_CONTAINER: "remove_container",
    Event.STOP_POD_SANDBOX: "stop_pod_sandbox",
    Event.REMOVE_POD_SANDBOX: "remove_pod_sandbox",
    Event.UPDATE_POD_SANDBOX_RESOURCES: "update_pod_sandbox_resources",
}


def stage_method_name(event: Event, stage: Stage) -> str:
    """The method a hook implements for a stage: `pre_create_container`, ..."""
    return f"{stage.value}_{event.snake}"


# Topology hints are asked where something is placed: a container, or a pod's bubble.
HINT_EVENTS = frozenset({Event.CREATE_CONTAINER, Event.RUN_POD_SANDBOX})
# The stages the plugin protocol carries (hints stay in-process for now).
PLUGIN_STAGES = (Stage.PRE, Stage.VALIDATE, Stage.POST, Stage.FAILED)

_BY_METHOD = {
    stage_method_name(e, s): (e, s)
    for e in Event
    for s in Stage
    if s is not Stage.HINTS or e in HINT_EVENTS
}
_STAGE_PREFIXES = tuple(f"{s.value}_" for s in Stage)


def stage_of_method(name: str) -> tuple[Event, Stage] | None:
    """The (event, stage) a method name implements; None for a name that is no stage.

    Raises ValueError for a name that looks like a stage (`pre_…`, `post_…`, `failed_…`,
    `hints_…`) but is none: a typo must not silently drop a stage."""
    found = _BY_METHOD.get(name)
    if found is None and name.startswith(_STAGE_PREFIXES):
        raise ValueError(f"{name!r} looks like a stage method but is none (a typo?)")
    return found
