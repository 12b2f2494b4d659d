"""Device nodes, host mounts, env and pooled devices for the pods the node's policy allows.

``annotations`` reads what a pod asks for (pure parsers), ``policy`` is the node's allowlist
and the check of a request against it, ``pools`` keeps who holds which pooled device and
offers NUMA hints for them, ``host`` is the seam to the host's files; ``DevicesHook``
(``hook``) is the built-in hook `devices`.
"""

from crihook.hooks.devices.annotations import (
    AnnotationError,
    ContainerAsk,
    container_ask,
    parse_device_annotation,
    parse_env_annotation,
    parse_mount_annotation,
    parse_pool_annotation,
)
from crihook.hooks.devices.hook import DevicesHook
from crihook.hooks.devices.host import DeviceNode, HostFiles, LinuxFiles
from crihook.hooks.devices.policy import DevicePolicy, check_ask, parse_policy
from crihook.hooks.devices.pools import device_hints, pick_devices

__all__ = [
    "AnnotationError",
    "ContainerAsk",
    "DeviceNode",
    "DevicePolicy",
    "DevicesHook",
    "HostFiles",
    "LinuxFiles",
    "check_ask",
    "container_ask",
    "device_hints",
    "parse_device_annotation",
    "parse_env_annotation",
    "parse_mount_annotation",
    "parse_policy",
    "parse_pool_annotation",
    "pick_devices",
]
