from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Event(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVENT_UNSPECIFIED: _ClassVar[Event]
    RUN_POD_SANDBOX: _ClassVar[Event]
    CREATE_CONTAINER: _ClassVar[Event]
    START_CONTAINER: _ClassVar[Event]
    UPDATE_CONTAINER_RESOURCES: _ClassVar[Event]
    STOP_CONTAINER: _ClassVar[Event]
    REMOVE_CONTAINER: _ClassVar[Event]
    STOP_POD_SANDBOX: _ClassVar[Event]
    REMOVE_POD_SANDBOX: _ClassVar[Event]
    UPDATE_POD_SANDBOX_RESOURCES: _ClassVar[Event]

class Stage(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STAGE_UNSPECIFIED: _ClassVar[Stage]
    PRE: _ClassVar[Stage]
    POST: _ClassVar[Stage]
    FAILED: _ClassVar[Stage]
    VALIDATE: _ClassVar[Stage]
EVENT_UNSPECIFIED: Event
RUN_POD_SANDBOX: Event
CREATE_CONTAINER: Event
START_CONTAINER: Event
UPDATE_CONTAINER_RESOURCES: Event
STOP_CONTAINER: Event
REMOVE_CONTAINER: Event
STOP_POD_SANDBOX: Event
REMOVE_POD_SANDBOX: Event
UPDATE_POD_SANDBOX_RESOURCES: Event
STAGE_UNSPECIFIED: Stage
PRE: Stage
POST: Stage
FAILED: Stage
VALIDATE: Stage

class Subscription(_message.Message):
    __slots__ = ("event", "stage")
    EVENT_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    event: Event
    stage: Stage
    def __init__(self, event: _Optional[_Union[Event, str]] = ..., stage: _Optional[_Union[Stage, str]] = ...) -> None: ...

class ConfigureRequest(_message.Message):
    __slots__ = ("protocol_version", "crihook_version", "plugin_name", "timeout_ms")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    CRIHOOK_VERSION_FIELD_NUMBER: _ClassVar[int]
    PLUGIN_NAME_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    protocol_version: str
    crihook_version: str
    plugin_name: str
    timeout_ms: int
    def __init__(self, protocol_version: _Optional[str] = ..., crihook_version: _Optional[str] = ..., plugin_name: _Optional[str] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class ConfigureResponse(_message.Message):
    __slots__ = ("subscriptions", "plugin_version")
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    PLUGIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    subscriptions: _containers.RepeatedCompositeFieldContainer[Subscription]
    plugin_version: str
    def __init__(self, subscriptions: _Optional[_Iterable[_Union[Subscription, _Mapping]]] = ..., plugin_version: _Optional[str] = ...) -> None: ...

class Resources(_message.Message):
    __slots__ = ("qos_class", "cpu_request_milli", "cpu_limit_milli", "memory_limit_bytes", "integer_cpus", "oom_score_adj", "cpu_shares", "cpu_quota", "cpu_period", "cpuset_cpus", "cpuset_mems", "hugepage_limits")
    class HugepageLimitsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    QOS_CLASS_FIELD_NUMBER: _ClassVar[int]
    CPU_REQUEST_MILLI_FIELD_NUMBER: _ClassVar[int]
    CPU_LIMIT_MILLI_FIELD_NUMBER: _ClassVar[int]
    MEMORY_LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    INTEGER_CPUS_FIELD_NUMBER: _ClassVar[int]
    OOM_SCORE_ADJ_FIELD_NUMBER: _ClassVar[int]
    CPU_SHARES_FIELD_NUMBER: _ClassVar[int]
    CPU_QUOTA_FIELD_NUMBER: _ClassVar[int]
    CPU_PERIOD_FIELD_NUMBER: _ClassVar[int]
    CPUSET_CPUS_FIELD_NUMBER: _ClassVar[int]
    CPUSET_MEMS_FIELD_NUMBER: _ClassVar[int]
    HUGEPAGE_LIMITS_FIELD_NUMBER: _ClassVar[int]
    qos_class: str
    cpu_request_milli: int
    cpu_limit_milli: int
    memory_limit_bytes: int
    integer_cpus: int
    oom_score_adj: int
    cpu_shares: int
    cpu_quota: int
    cpu_period: int
    cpuset_cpus: str
    cpuset_mems: str
    hugepage_limits: _containers.ScalarMap[str, int]
    def __init__(self, qos_class: _Optional[str] = ..., cpu_request_milli: _Optional[int] = ..., cpu_limit_milli: _Optional[int] = ..., memory_limit_bytes: _Optional[int] = ..., integer_cpus: _Optional[int] = ..., oom_score_adj: _Optional[int] = ..., cpu_shares: _Optional[int] = ..., cpu_quota: _Optional[int] = ..., cpu_period: _Optional[int] = ..., cpuset_cpus: _Optional[str] = ..., cpuset_mems: _Optional[str] = ..., hugepage_limits: _Optional[_Mapping[str, int]] = ...) -> None: ...

class Pod(_message.Message):
    __slots__ = ("id", "uid", "name", "namespace", "attempt", "labels", "annotations", "cgroup_parent", "runtime_handler", "qos_class", "resources")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    CGROUP_PARENT_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_HANDLER_FIELD_NUMBER: _ClassVar[int]
    QOS_CLASS_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    id: str
    uid: str
    name: str
    namespace: str
    attempt: int
    labels: _containers.ScalarMap[str, str]
    annotations: _containers.ScalarMap[str, str]
    cgroup_parent: str
    runtime_handler: str
    qos_class: str
    resources: Resources
    def __init__(self, id: _Optional[str] = ..., uid: _Optional[str] = ..., name: _Optional[str] = ..., namespace: _Optional[str] = ..., attempt: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., annotations: _Optional[_Mapping[str, str]] = ..., cgroup_parent: _Optional[str] = ..., runtime_handler: _Optional[str] = ..., qos_class: _Optional[str] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ...) -> None: ...

class Container(_message.Message):
    __slots__ = ("id", "pod_id", "name", "attempt", "image", "labels", "annotations", "kind", "resources", "cdi_devices")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    POD_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    CDI_DEVICES_FIELD_NUMBER: _ClassVar[int]
    id: str
    pod_id: str
    name: str
    attempt: int
    image: str
    labels: _containers.ScalarMap[str, str]
    annotations: _containers.ScalarMap[str, str]
    kind: str
    resources: Resources
    cdi_devices: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., pod_id: _Optional[str] = ..., name: _Optional[str] = ..., attempt: _Optional[int] = ..., image: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., annotations: _Optional[_Mapping[str, str]] = ..., kind: _Optional[str] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ..., cdi_devices: _Optional[_Iterable[str]] = ...) -> None: ...

class StageRequest(_message.Message):
    __slots__ = ("seq", "event", "stage", "pod", "container", "request", "response", "timeout_ms", "failure", "owners")
    class OwnersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SEQ_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    OWNERS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    event: Event
    stage: Stage
    pod: Pod
    container: Container
    request: bytes
    response: bytes
    timeout_ms: int
    failure: str
    owners: _containers.ScalarMap[str, str]
    def __init__(self, seq: _Optional[int] = ..., event: _Optional[_Union[Event, str]] = ..., stage: _Optional[_Union[Stage, str]] = ..., pod: _Optional[_Union[Pod, _Mapping]] = ..., container: _Optional[_Union[Container, _Mapping]] = ..., request: _Optional[bytes] = ..., response: _Optional[bytes] = ..., timeout_ms: _Optional[int] = ..., failure: _Optional[str] = ..., owners: _Optional[_Mapping[str, str]] = ...) -> None: ...

class StageResponse(_message.Message):
    __slots__ = ("seq", "adjustment", "reject_reason", "error", "reject_invalid", "reject_forbidden")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ADJUSTMENT_FIELD_NUMBER: _ClassVar[int]
    REJECT_REASON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    REJECT_INVALID_FIELD_NUMBER: _ClassVar[int]
    REJECT_FORBIDDEN_FIELD_NUMBER: _ClassVar[int]
    seq: int
    adjustment: Adjustment
    reject_reason: str
    error: str
    reject_invalid: bool
    reject_forbidden: bool
    def __init__(self, seq: _Optional[int] = ..., adjustment: _Optional[_Union[Adjustment, _Mapping]] = ..., reject_reason: _Optional[str] = ..., error: _Optional[str] = ..., reject_invalid: _Optional[bool] = ..., reject_forbidden: _Optional[bool] = ...) -> None: ...

class Device(_message.Message):
    __slots__ = ("container_path", "host_path", "permissions")
    CONTAINER_PATH_FIELD_NUMBER: _ClassVar[int]
    HOST_PATH_FIELD_NUMBER: _ClassVar[int]
    PERMISSIONS_FIELD_NUMBER: _ClassVar[int]
    container_path: str
    host_path: str
    permissions: str
    def __init__(self, container_path: _Optional[str] = ..., host_path: _Optional[str] = ..., permissions: _Optional[str] = ...) -> None: ...

class Mount(_message.Message):
    __slots__ = ("container_path", "host_path", "readonly", "propagation", "selinux_relabel")
    CONTAINER_PATH_FIELD_NUMBER: _ClassVar[int]
    HOST_PATH_FIELD_NUMBER: _ClassVar[int]
    READONLY_FIELD_NUMBER: _ClassVar[int]
    PROPAGATION_FIELD_NUMBER: _ClassVar[int]
    SELINUX_RELABEL_FIELD_NUMBER: _ClassVar[int]
    container_path: str
    host_path: str
    readonly: bool
    propagation: str
    selinux_relabel: bool
    def __init__(self, container_path: _Optional[str] = ..., host_path: _Optional[str] = ..., readonly: _Optional[bool] = ..., propagation: _Optional[str] = ..., selinux_relabel: _Optional[bool] = ...) -> None: ...

class EnvVar(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: bytes
    def __init__(self, name: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...

class ResourceDelta(_message.Message):
    __slots__ = ("cpuset_cpus", "cpuset_mems", "cpu_shares", "cpu_quota", "cpu_period", "memory_limit_in_bytes", "memory_swap_limit_in_bytes")
    CPUSET_CPUS_FIELD_NUMBER: _ClassVar[int]
    CPUSET_MEMS_FIELD_NUMBER: _ClassVar[int]
    CPU_SHARES_FIELD_NUMBER: _ClassVar[int]
    CPU_QUOTA_FIELD_NUMBER: _ClassVar[int]
    CPU_PERIOD_FIELD_NUMBER: _ClassVar[int]
    MEMORY_LIMIT_IN_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_SWAP_LIMIT_IN_BYTES_FIELD_NUMBER: _ClassVar[int]
    cpuset_cpus: str
    cpuset_mems: str
    cpu_shares: int
    cpu_quota: int
    cpu_period: int
    memory_limit_in_bytes: int
    memory_swap_limit_in_bytes: int
    def __init__(self, cpuset_cpus: _Optional[str] = ..., cpuset_mems: _Optional[str] = ..., cpu_shares: _Optional[int] = ..., cpu_quota: _Optional[int] = ..., cpu_period: _Optional[int] = ..., memory_limit_in_bytes: _Optional[int] = ..., memory_swap_limit_in_bytes: _Optional[int] = ...) -> None: ...

class ContainerUpdate(_message.Message):
    __slots__ = ("container_id", "resources")
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    resources: ResourceDelta
    def __init__(self, container_id: _Optional[str] = ..., resources: _Optional[_Union[ResourceDelta, _Mapping]] = ...) -> None: ...

class Adjustment(_message.Message):
    __slots__ = ("cgroup_parent", "set_labels", "remove_labels", "set_annotations", "remove_annotations", "cpuset_cpus", "cpuset_mems", "cpu_shares", "cpu_quota", "cpu_period", "memory_limit_in_bytes", "memory_swap_limit_in_bytes", "hugepage_limits", "set_unified", "remove_unified", "oom_score_adj", "add_devices", "remove_devices", "add_mounts", "remove_mounts", "set_env", "remove_env", "add_cdi_devices", "remove_cdi_devices", "updates")
    class SetLabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class SetAnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class HugepageLimitsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class SetUnifiedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CGROUP_PARENT_FIELD_NUMBER: _ClassVar[int]
    SET_LABELS_FIELD_NUMBER: _ClassVar[int]
    REMOVE_LABELS_FIELD_NUMBER: _ClassVar[int]
    SET_ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    REMOVE_ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    CPUSET_CPUS_FIELD_NUMBER: _ClassVar[int]
    CPUSET_MEMS_FIELD_NUMBER: _ClassVar[int]
    CPU_SHARES_FIELD_NUMBER: _ClassVar[int]
    CPU_QUOTA_FIELD_NUMBER: _ClassVar[int]
    CPU_PERIOD_FIELD_NUMBER: _ClassVar[int]
    MEMORY_LIMIT_IN_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_SWAP_LIMIT_IN_BYTES_FIELD_NUMBER: _ClassVar[int]
    HUGEPAGE_LIMITS_FIELD_NUMBER: _ClassVar[int]
    SET_UNIFIED_FIELD_NUMBER: _ClassVar[int]
    REMOVE_UNIFIED_FIELD_NUMBER: _ClassVar[int]
    OOM_SCORE_ADJ_FIELD_NUMBER: _ClassVar[int]
    ADD_DEVICES_FIELD_NUMBER: _ClassVar[int]
    REMOVE_DEVICES_FIELD_NUMBER: _ClassVar[int]
    ADD_MOUNTS_FIELD_NUMBER: _ClassVar[int]
    REMOVE_MOUNTS_FIELD_NUMBER: _ClassVar[int]
    SET_ENV_FIELD_NUMBER: _ClassVar[int]
    REMOVE_ENV_FIELD_NUMBER: _ClassVar[int]
    ADD_CDI_DEVICES_FIELD_NUMBER: _ClassVar[int]
    REMOVE_CDI_DEVICES_FIELD_NUMBER: _ClassVar[int]
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    cgroup_parent: str
    set_labels: _containers.ScalarMap[str, str]
    remove_labels: _containers.RepeatedScalarFieldContainer[str]
    set_annotations: _containers.ScalarMap[str, str]
    remove_annotations: _containers.RepeatedScalarFieldContainer[str]
    cpuset_cpus: str
    cpuset_mems: str
    cpu_shares: int
    cpu_quota: int
    cpu_period: int
    memory_limit_in_bytes: int
    memory_swap_limit_in_bytes: int
    hugepage_limits: _containers.ScalarMap[str, int]
    set_unified: _containers.ScalarMap[str, str]
    remove_unified: _containers.RepeatedScalarFieldContainer[str]
    oom_score_adj: int
    add_devices: _containers.RepeatedCompositeFieldContainer[Device]
    remove_devices: _containers.RepeatedScalarFieldContainer[str]
    add_mounts: _containers.RepeatedCompositeFieldContainer[Mount]
    remove_mounts: _containers.RepeatedScalarFieldContainer[str]
    set_env: _containers.RepeatedCompositeFieldContainer[EnvVar]
    remove_env: _containers.RepeatedScalarFieldContainer[str]
    add_cdi_devices: _containers.RepeatedScalarFieldContainer[str]
    remove_cdi_devices: _containers.RepeatedScalarFieldContainer[str]
    updates: _containers.RepeatedCompositeFieldContainer[ContainerUpdate]
    def __init__(self, cgroup_parent: _Optional[str] = ..., set_labels: _Optional[_Mapping[str, str]] = ..., remove_labels: _Optional[_Iterable[str]] = ..., set_annotations: _Optional[_Mapping[str, str]] = ..., remove_annotations: _Optional[_Iterable[str]] = ..., cpuset_cpus: _Optional[str] = ..., cpuset_mems: _Optional[str] = ..., cpu_shares: _Optional[int] = ..., cpu_quota: _Optional[int] = ..., cpu_period: _Optional[int] = ..., memory_limit_in_bytes: _Optional[int] = ..., memory_swap_limit_in_bytes: _Optional[int] = ..., hugepage_limits: _Optional[_Mapping[str, int]] = ..., set_unified: _Optional[_Mapping[str, str]] = ..., remove_unified: _Optional[_Iterable[str]] = ..., oom_score_adj: _Optional[int] = ..., add_devices: _Optional[_Iterable[_Union[Device, _Mapping]]] = ..., remove_devices: _Optional[_Iterable[str]] = ..., add_mounts: _Optional[_Iterable[_Union[Mount, _Mapping]]] = ..., remove_mounts: _Optional[_Iterable[str]] = ..., set_env: _Optional[_Iterable[_Union[EnvVar, _Mapping]]] = ..., remove_env: _Optional[_Iterable[str]] = ..., add_cdi_devices: _Optional[_Iterable[str]] = ..., remove_cdi_devices: _Optional[_Iterable[str]] = ..., updates: _Optional[_Iterable[_Union[ContainerUpdate, _Mapping]]] = ...) -> None: ...

class SynchronizeRequest(_message.Message):
    __slots__ = ("pods", "containers", "container_states")
    class ContainerStatesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PODS_FIELD_NUMBER: _ClassVar[int]
    CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_STATES_FIELD_NUMBER: _ClassVar[int]
    pods: _containers.RepeatedCompositeFieldContainer[Pod]
    containers: _containers.RepeatedCompositeFieldContainer[Container]
    container_states: _containers.ScalarMap[str, str]
    def __init__(self, pods: _Optional[_Iterable[_Union[Pod, _Mapping]]] = ..., containers: _Optional[_Iterable[_Union[Container, _Mapping]]] = ..., container_states: _Optional[_Mapping[str, str]] = ...) -> None: ...

class SynchronizeResponse(_message.Message):
    __slots__ = ("updates",)
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    updates: _containers.RepeatedCompositeFieldContainer[ContainerUpdate]
    def __init__(self, updates: _Optional[_Iterable[_Union[ContainerUpdate, _Mapping]]] = ...) -> None: ...
