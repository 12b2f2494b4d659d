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
    GroupUpdate,
    Mount,
    ResourceDelta,
)
from crihook.hooks.spec.errors import Forbidden, InvalidRequest, Reject
from crihook.hooks.spec.events import Event, Stage, stage_method_name
from crihook.hooks.spec.hints import ResourceHints, TopologyHint
from crihook.hooks.spec.hook import (
    ChainHook,
    DictState,
    Hook,
    HookContext,
    HookState,
    RuntimeQueries,
    SyncContext,
    subscriptions_of,
)
from crihook.hooks.spec.options import reject_unknown
from crihook.hooks.spec.usage import PoolUsage
from crihook.hooks.spec.views import (
    ContainerKind,
    ContainerState,
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
    "ContainerState",
    "ContainerUpdate",
    "ContainerView",
    "Device",
    "DictState",
    "Event",
    "Field",
    "FieldKey",
    "Forbidden",
    "GroupUpdate",
    "Hook",
    "HookContext",
    "HookState",
    "InvalidRequest",
    "Mount",
    "PodView",
    "PoolUsage",
    "QoSClass",
    "Reject",
    "ResourceDelta",
    "ResourceHints",
    "ResourcesView",
    "RuntimeQueries",
    "Stage",
    "SyncContext",
    "TopologyHint",
    "reject_unknown",
    "stage_method_name",
    "subscriptions_of",
]
