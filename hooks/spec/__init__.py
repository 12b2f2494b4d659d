"""What a hook author imports: events and stages, read-only views, the Adjustment builder,
the Hook base class and Reject.

    from crihook.hooks.spec import Adjustment, Hook, HookContext, Reject
"""

from crihook.hooks.spec.adjustment import (
    REMOVE,
    Adjustment,
    ContainerUpdate,
    Device,
    Field,
    FieldKey,
    Mount,
    ResourceDelta,
)
from crihook.hooks.spec.errors import Reject
from crihook.hooks.spec.events import Event, Stage, stage_method_name
from crihook.hooks.spec.hook import ChainHook, Hook, HookContext, HookState, subscriptions_of
from crihook.hooks.spec.views import (
    ContainerKind,
    ContainerView,
    PodView,
    QoSClass,
    ResourcesView,
)

__all__ = [
    "REMOVE",
    "Adjustment",
    "ChainHook",
    "ContainerKind",
    "ContainerUpdate",
    "ContainerView",
    "Device",
    "Event",
    "Field",
    "FieldKey",
    "Hook",
    "HookContext",
    "HookState",
    "Mount",
    "PodView",
    "QoSClass",
    "Reject",
    "ResourceDelta",
    "ResourcesView",
    "Stage",
    "stage_method_name",
    "subscriptions_of",
]
