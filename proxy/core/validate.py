"""What crihook requires of the nine intercepted requests before it acts on them; pure.

The checks answer what is wrong, in words for the operator (None: nothing), for the pipeline
to refuse the call with INVALID_ARGUMENT before any hook sees it, the store records it or the
runtime gets it: the one door for bad input, so hooks can trust the values they read.

`check_wire(event, raw)`: a known top-level field sent with another wire type than the one
it is declared with. protobuf (here and in containerd) does not fail the decode: it keeps
such a field as an unknown field and reads the declared one as absent, so a `config` sent as
fixed32 reads as "no config" and a pod would be recorded under an empty id. Fields crihook's
schema does not have (a newer kubelet's) are fine.

`check_request(event, request)`: parts without which crihook cannot key or order the call,
or which containerd refuses to go without anyway ("sandbox config must include metadata",
"container config must include metadata"; containerd 1.6 does not refuse a CreateContainer
without sandbox_config.metadata, it dereferences it and crashes); never stricter than
containerd about what kubelet may leave out:

    RunPodSandbox      config.metadata with a uid (crihook orders and reconciles a pod by it)
    CreateContainer    pod_sandbox_id, config.metadata, sandbox_config.metadata
    the others         the id they act on (container_id or pod_sandbox_id)

(each call's checker is named in its row, crihook.proxy.cri.events, and written in
crihook.proxy.cri.requests)

Names, namespaces and attempts are not required: containerd accepts them empty.

`check_resources(event, request, hugepage_sizes)`: every LinuxContainerResources the call
carries holds values the kernel and runc accept (hooks.spec.limits: CFS period and quota,
shares, memory and swap limits, oom_score_adj, cpusets, hugepage sizes), each named with its
value when it does not; 0 stays "unset" where containerd reads it so:

    RunPodSandbox                config.linux.resources, config.linux.overhead
    CreateContainer              config.linux.resources, and the sandbox_config's
    UpdateContainerResources     linux
    UpdatePodSandboxResources    resources, overhead

(each call's `checked_resources`, in its row; the path is the `where` kubelet reads)
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from crihook.hooks.spec import Event
from crihook.hooks.spec.limits import resources_problem
from crihook.proxy.cri.events import EVENTS

__all__ = ["check_request", "check_resources", "check_wire"]

VARINT, FIXED64, LENGTH_DELIMITED, START_GROUP, END_GROUP, FIXED32 = range(6)
_WIRE_NAMES = ("varint", "64-bit", "length-delimited", "start group", "end group", "32-bit")
_MAX_GROUP_DEPTH = 100  # protobuf's own recursion limit

_VARINT_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT32,
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT32,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT32,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_BOOL,
        FieldDescriptor.TYPE_ENUM,
    }
)
_FIXED64_TYPES = frozenset(
    {FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64, FieldDescriptor.TYPE_DOUBLE}
)
_FIXED32_TYPES = frozenset(
    {FieldDescriptor.TYPE_FIXED32, FieldDescriptor.TYPE_SFIXED32, FieldDescriptor.TYPE_FLOAT}
)


@dataclass(frozen=True)
class _Declared:
    name: str
    wire_type: int
    also: int | None
    """A second wire type protobuf accepts: a packed repeated number also comes unpacked."""


def _declared_wire_type(field_type: int) -> int:
    """The wire type of a field of this descriptor type (FieldDescriptor.TYPE_*)."""
    if field_type == FieldDescriptor.TYPE_GROUP:
        return START_GROUP
    if field_type in _VARINT_TYPES:
        return VARINT
    if field_type in _FIXED64_TYPES:
        return FIXED64
    if field_type in _FIXED32_TYPES:
        return FIXED32
    return LENGTH_DELIMITED


def _declared(message: type[Message]) -> Mapping[int, _Declared]:
    out = {}
    for field in message.DESCRIPTOR.fields:
        scalar = _declared_wire_type(field.type)
        if field.is_repeated and scalar not in (LENGTH_DELIMITED, START_GROUP):
            out[field.number] = _Declared(field.name, LENGTH_DELIMITED, scalar)
        else:
            out[field.number] = _Declared(field.name, scalar, None)
    return MappingProxyType(out)


_FIELDS: Mapping[Event, tuple[str, Mapping[int, _Declared]]] = MappingProxyType(
    {
        event: (spec.request.DESCRIPTOR.name, _declared(spec.request))
        for event, spec in EVENTS.items()
    }
)


class _Malformed(Exception):
    pass


def check_wire(event: Event, raw: bytes) -> str | None:
    """A known top-level field of `event`'s request that `raw` carries with another wire
    type, or bytes that are not a protobuf message at all; None if neither."""
    message, fields = _FIELDS[event]
    pos = 0
    try:
        while pos < len(raw):
            start = pos
            tag, pos = _varint(raw, pos)
            number, wire_type = tag >> 3, tag & 7
            if number == 0:
                raise _Malformed(f"field number 0 at byte {start}")
            declared = fields.get(number)
            if (
                declared is not None
                and wire_type != declared.wire_type
                and wire_type != declared.also
            ):
                return (
                    f"{message} field {number} ({declared.name}) has wire type {wire_type}, "
                    f"expected {declared.wire_type} ({_WIRE_NAMES[declared.wire_type]})"
                )
            pos = _skip(raw, pos, number, wire_type, 0)
    except _Malformed as exc:
        return f"{message} is not a valid protobuf message: {exc}"
    return None


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while pos < len(data) and shift < 64:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise _Malformed(f"truncated or overlong varint at byte {pos}")


def _skip(data: bytes, pos: int, number: int, wire_type: int, depth: int) -> int:
    """The position after a field's value."""
    if wire_type == VARINT:
        return _varint(data, pos)[1]
    if wire_type == FIXED64:
        end = pos + 8
    elif wire_type == FIXED32:
        end = pos + 4
    elif wire_type == LENGTH_DELIMITED:
        length, pos = _varint(data, pos)
        end = pos + length
    elif wire_type == START_GROUP:
        if depth >= _MAX_GROUP_DEPTH:
            raise _Malformed("groups nested too deep")
        while True:
            tag, pos = _varint(data, pos)
            if tag & 7 == END_GROUP:
                if tag >> 3 != number:
                    raise _Malformed(f"group {number} ended as {tag >> 3}")
                return pos
            pos = _skip(data, pos, tag >> 3, tag & 7, depth + 1)
    else:
        raise _Malformed(f"wire type {wire_type} of field {number} at byte {pos}")
    if end > len(data):
        raise _Malformed(f"field {number} runs past the end ({end} > {len(data)} bytes)")
    return end


def check_request(event: Event, request: Message) -> str | None:
    """A part `event`'s decoded request must carry and does not; None if complete."""
    return EVENTS[event].required(request)


def check_resources(
    event: Event, request: Message, hugepage_sizes: Collection[str] = ()
) -> str | None:
    """The first resources field of `event`'s request the kernel or runc would refuse, named
    with its value; None if all are fine (or the call carries none)."""
    for where, holder, name in EVENTS[event].checked:
        parent = holder(request)
        if parent.HasField(name):
            problem = resources_problem(getattr(parent, name), where, hugepage_sizes)
            if problem is not None:
                return f"{request.DESCRIPTOR.name} {problem}"
    return None
