"""The lifecycle events hooks act on, and the two stages of each."""

from __future__ import annotations

import enum

__all__ = ["CONTAINER_EVENTS", "POD_EVENTS", "Event", "Stage", "stage_method_name"]


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

    # Members are singletons: identity hashing is exact, and several times cheaper than
    # Enum's hash-by-name on the chain's per-call (event, stage) lookups.
    __hash__ = object.__hash__

    @property
    def snake(self) -> str:
        return _SNAKE[self]


class Stage(enum.Enum):
    PRE = "pre"  # before the runtime sees the call: may adjust it
    POST = "post"  # after the runtime answered OK: may only update other containers

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
}

POD_EVENTS = frozenset({Event.RUN_POD_SANDBOX, Event.STOP_POD_SANDBOX, Event.REMOVE_POD_SANDBOX})
CONTAINER_EVENTS = frozenset(set(Event) - POD_EVENTS)


def stage_method_name(event: Event, stage: Stage) -> str:
    """The method a hook implements for a stage: `pre_create_container`, ..."""
    return f"{stage.value}_{event.snake}"
