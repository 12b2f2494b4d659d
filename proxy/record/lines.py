"""The lines of a recording (`crihook serve --record FILE`), one JSON object each.

    {"kind": "header", "format": 1, "crihook": "0.1.0", "config": {...}, "node": {...}}
    {"kind": "sync", "seq": 1, "reason": "start", "pods": [...], "containers": [...],
     "container_states": {...}, "hook_states": {...}, "updates": [...], "observed": [...]}
    {"kind": "call", "seq": 2, "time": ..., "method": "CreateContainer", "pod": "ns/name",
     "container": "app", "request": {"b64": ..., "json": {...}}, "forwarded": "unchanged",
     "response": {...}, "status": null, "hooks": [...], "updates": [...], "observed": [...]}
    {"kind": "plugins", "seq": 9, "plugins": [{"name": "50-annotate", ...}]}
    {"kind": "snapshot", ..., "breakers": {"60-p": {"failures": 3, "open_until": ...}}}
                                   after a rotation: the state the next calls start from
    {"kind": "passthrough", ...}   --record-all: a unary call no hook sees
    {"kind": "gap", "dropped": 3}  lines the disk did not take

- `header` opens every file and every crihook process's part of one: crihook's version, the
  effective configuration (a config document `settings_from_toml` reads back), the node
  facts the hooks use (the sysfs topology with memory per NUMA node, the device pools) and
  the plugins in the chain then (their drop-ins' settings, `plugin_docs`).
- `plugins`: the plugins in the chain from then on (`seq`: among the calls), each time the
  drop-in directory changes them. A replay stands in for each, with its recorded answers.
- `call`: the request as received and as forwarded (`"unchanged"`: kubelet's bytes; null: not
  forwarded) as exact protobuf bytes (base64) and readable: the request rendered whole, the
  forwarded one as its `changes` (field path → new value; rendering it whole again would
  cost a recording as much as the call itself); the runtime's answer
  or the status the call ended with (`origin`: crihook, runtime or kubelet); each hook's
  verdict, adjustment (or hints) and time; the updates issued to other containers; what hooks
  asked the node and the runtime (`observed`), so a replay can answer the same way.
- `seq` is the order in which calls entered the chain (lines are written as calls end).

Redacted lines (the default) carry the bytes of the redacted message (see `redact`).

This module is a leaf (base, cri, `redact` and `render` only): the renderer process
(`record.worker`) loads it and nothing heavier. The lines crihook builds from its settings,
chain and store (`header`, `plugins`, `sync`, `snapshot`) are in `record.header`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from google.protobuf.message import DecodeError, Message

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.spec import (
    Adjustment,
    ContainerView,
    Event,
    PodView,
    ResourceDelta,
    Stage,
    TopologyHint,
)
from crihook.hooks.spec.adjustment import Field, describe_key, parse_key
from crihook.proxy.cri.events import INTERCEPTED
from crihook.proxy.cri.outcome import HookRun, Metadata, Observation, Outcome, SentUpdate, Status
from crihook.proxy.cri.values import from_jsonable, jsonable
from crihook.proxy.record.redact import REDACTED, Redactor
from crihook.proxy.record.render import changes, render

__all__ = [
    "FORMAT",
    "UNCHANGED",
    "AdjustmentRecord",
    "CallRecord",
    "adjustment_of",
    "call_line",
    "call_record",
    "container_label",
    "encode_line",
    "forwarded_doc",
    "hook_docs",
    "message_doc",
    "metadata_doc",
    "observation_docs",
    "passthrough_line",
    "pod_label",
    "status_doc",
    "update_docs",
]

FORMAT = 1
UNCHANGED = "unchanged"


def message_doc(
    raw: bytes,
    message_type: type[Message] | None,
    redactor: Redactor,
    event: Event | None = None,
) -> dict[str, Any]:
    """`{"b64", "json"}` of a message (`json` null when it does not decode); redacted (the
    intercepted request of `event` where its secrets are, any other message throughout)."""
    return _message(raw, message_type, redactor, event)[0]


def forwarded_doc(
    received: Message | None,
    forwarded: bytes,
    message_type: type[Message],
    redactor: Redactor,
    event: Event,
) -> dict[str, Any]:
    """A request as forwarded with changes: its bytes, and where it differs from the request
    as received (`changes`, see `render.changes`); redacted as the request is."""
    doc, message = _message(forwarded, message_type, redactor, event, rendered=False)
    if message is not None:
        doc["changes"] = changes(received, message) if received is not None else render(message)
    return doc


def _message(
    raw: bytes,
    message_type: type[Message] | None,
    redactor: Redactor,
    event: Event | None,
    rendered: bool = True,
) -> tuple[dict[str, Any], Message | None]:
    if message_type is None:
        return {"b64": _b64(raw), "json": None}, None
    try:
        message = message_type.FromString(raw)
    except DecodeError as exc:
        return {"b64": _b64(raw), "json": None, "error": str(exc)}, None
    redacted = redactor.request(event, message) if event else redactor.message(message)
    if redacted:
        raw = message.SerializeToString()
    doc: dict[str, Any] = {"b64": _b64(raw)}
    if rendered:
        doc["json"] = render(message)
    return doc, message


def status_doc(status: Status | None, origin: str = "") -> dict[str, Any] | None:
    if status is None:
        return None
    doc: dict[str, Any] = {"code": status.code.name, "message": status.details}
    if origin:
        doc["origin"] = origin
    if status.trailers:
        doc["trailers"] = metadata_doc(status.trailers)
    return doc


def metadata_doc(metadata: Metadata | None) -> list[list[Any]]:
    return [[k, {"base64": _b64(v)} if isinstance(v, bytes) else v] for k, v in metadata or ()]


def pod_label(pod: PodView | None) -> str:
    if pod is None:
        return ""
    return f"{pod.namespace}/{pod.name}" if pod.name else pod.id


def container_label(container: ContainerView | None) -> str:
    if container is None:
        return ""
    return container.name or container.id


class CallRecord(NamedTuple):
    """What a call line is rendered from: an `Outcome` cut down to plain values (strings,
    bytes, numbers and the hooks' answers), so that the event loop hands the renderer a small
    pickle, not the views and enums the call carried. (It crosses as a plain tuple,
    `tuple(record)`, and is remade with `CallRecord._make`: named tuples pickle slower.)"""

    seq: int
    started: float
    elapsed: float
    method: str
    pod: str
    pod_id: str
    container: str
    container_id: str
    timeout: float | None
    metadata: Metadata | None
    ready: bool
    received: bytes
    forwarded: bytes | str | None
    """The bytes forwarded with changes, `UNCHANGED`, or None (never forwarded)."""
    response: bytes | None
    status: Status | None
    status_origin: str
    hooks: tuple[tuple[Any, ...], ...]
    """Per hook run: hook, stage (its value), verdict, detail, answer, seconds; an
    Adjustment answer as its changes, updates and group updates (described) in three more
    fields (answer None): `(hook, stage, verdict, detail, None, seconds, changes, updates,
    groups)`."""
    updates: Sequence[SentUpdate]
    observed: Sequence[Observation]


class AdjustmentRecord(NamedTuple):
    """An Adjustment as a call record carries it: its changes and updates, as they are
    (pickling the Adjustment itself costs twice as much)."""

    changes: tuple[tuple[Any, Any], ...]
    updates: tuple[Any, ...]
    groups: tuple[dict[str, Any], ...] = ()
    """Each GroupUpdate as it describes itself (the hook's state it reads changes later)."""


def _run_record(run: tuple[Any, ...]) -> tuple[Any, ...]:
    hook, stage, verdict, detail, answer, seconds = run
    if type(answer) is Adjustment:
        changes = tuple(answer.change_items())
        groups = _group_docs(answer)
        return (hook, stage.value, verdict, detail, None, seconds, changes, answer.updates, groups)
    return (hook, stage.value, verdict, detail, answer, seconds)


def _group_docs(answer: Adjustment) -> tuple[dict[str, Any], ...]:
    return tuple({"group": g.key, **g.describe()} for g in answer.groups)


def _run_of(run: tuple[Any, ...]) -> HookRun:
    if len(run) == 9:
        *fields, changes, updates, groups = run
        fields[4] = AdjustmentRecord(changes, updates, groups)
        run = tuple(fields)
    hook, stage, verdict, detail, answer, seconds = run
    return HookRun(hook, Stage(stage), verdict, detail, answer, seconds)


def call_record(outcome: Outcome) -> CallRecord:
    """The call's `CallRecord` (on the event loop: cheap, no rendering)."""
    pod, container = outcome.pod, outcome.container
    forwarded = outcome.forwarded
    return CallRecord(
        outcome.seq,
        outcome.started,
        outcome.elapsed,
        outcome.event.value,
        pod_label(pod),
        pod.id if pod else "",
        container_label(container),
        container.id if container else "",
        outcome.timeout,
        outcome.metadata,
        outcome.ready,
        outcome.received,
        UNCHANGED if forwarded is not None and forwarded is outcome.received else forwarded,
        outcome.response,
        outcome.status,
        outcome.status_origin,
        tuple([_run_record(run) for run in outcome.trace or ()]),
        outcome.updates,
        outcome.observed or (),
    )


def call_line(outcome: Outcome | CallRecord, redactor: Redactor) -> dict[str, Any]:
    """The line of one intercepted call."""
    call = outcome if isinstance(outcome, CallRecord) else call_record(outcome)
    event = Event(call.method)
    spec = INTERCEPTED[event]
    line: dict[str, Any] = {
        "kind": "call",
        "seq": call.seq,
        "time": round(call.started, 6),
        "elapsed_ms": round(call.elapsed * 1000, 3),
        "method": call.method,
        "pod": call.pod,
        "pod_id": call.pod_id,
        "container": call.container,
        "container_id": call.container_id,
        "timeout": None if call.timeout is None else round(call.timeout, 3),
    }
    if call.metadata:
        line["metadata"] = metadata_doc(call.metadata)
    if not call.ready:
        line["ready"] = False
    line["request"], received = _message(call.received, spec.request, redactor, event)
    if isinstance(call.forwarded, bytes):
        line["forwarded"] = forwarded_doc(received, call.forwarded, spec.request, redactor, event)
    else:  # None (not forwarded) or UNCHANGED
        line["forwarded"] = call.forwarded
    line["response"] = (
        None if call.response is None else message_doc(call.response, spec.response, redactor)
    )
    line["status"] = status_doc(call.status, call.status_origin)
    line["hooks"] = hook_docs([_run_of(run) for run in call.hooks], redactor)
    line["updates"] = update_docs(call.updates)
    line["observed"] = observation_docs(call.observed)
    return line


def passthrough_line(
    seq: int,
    path: str,
    request: bytes,
    response: bytes | None,
    status: Status | None,
    started: float,
    redactor: Redactor,
) -> dict[str, Any]:
    """A unary call forwarded as bytes, no hook involved (`--record-all`)."""
    name = path.rsplit("/", 1)[-1]
    request_type = getattr(api_pb2, f"{name}Request", None)
    response_type = getattr(api_pb2, f"{name}Response", None)
    return {
        "kind": "passthrough",
        "seq": seq,
        "time": round(started, 6),
        "method": path,
        "request": message_doc(request, request_type, redactor),
        "response": None if response is None else message_doc(response, response_type, redactor),
        "status": status_doc(status, "runtime" if status else ""),
    }


def hook_docs(runs: Sequence[HookRun], redactor: Redactor) -> list[dict[str, Any]]:
    out = []
    for run in runs:
        doc: dict[str, Any] = {"hook": run.hook, "stage": run.stage.value, "verdict": run.verdict}
        if run.detail:
            doc["detail"] = run.detail
        if run.answer is not None:
            doc["answer"] = _answer(run.answer, redactor)
        doc["ms"] = round(run.seconds * 1000, 3)
        out.append(doc)
    return out


def _answer(answer: Any, redactor: Redactor) -> Any:
    if isinstance(answer, Adjustment):
        answer = AdjustmentRecord(tuple(answer.change_items()), answer.updates, _group_docs(answer))
    if isinstance(answer, AdjustmentRecord):
        changes: dict[str, Any] = {}
        for key, value in answer.changes:
            shown = jsonable(value)
            if key[0] is Field.ENV:
                shown = redactor.env_value(shown)
            elif key[0] is Field.ANNOTATION and redactor.enabled and isinstance(shown, str):
                shown = REDACTED if redactor.secret(key[1], shown) else shown
            changes[describe_key(key)] = shown
        doc: dict[str, Any] = {"set": changes}
        if answer.updates:
            doc["updates"] = [
                {"container_id": u.container_id, "resources": dict(u.resources.items())}
                for u in answer.updates
            ]
        if answer.groups:
            doc["update_groups"] = list(answer.groups)
        return doc
    if isinstance(answer, Mapping):  # hints: resource → TopologyHints
        return {str(resource): _hints(hints) for resource, hints in answer.items()}
    return repr(answer)


def adjustment_of(doc: Mapping[str, Any]) -> Adjustment:
    """The Adjustment a hook's recorded answer (`{"set": {...}, "updates": [...]}`) stands
    for: the reverse of the rendering above (for a replay standing in for a plugin). A
    redacted value comes back as `<redacted>` (the replay redacts what it forwards the same
    way before comparing). ValueError/TypeError for an answer no Adjustment renders to."""
    adjustment = Adjustment()
    changes = doc.get("set", {})
    if not isinstance(changes, Mapping):
        raise TypeError(f"set: {changes!r} is not an object")
    for text, shown in changes.items():
        key = parse_key(text)
        adjustment.set_raw(key, from_jsonable(key, shown))
    for update in doc.get("updates", ()):
        if not isinstance(update, Mapping) or not isinstance(update.get("resources"), Mapping):
            raise TypeError(f"update {update!r} has no resources")
        resources = ResourceDelta(**update["resources"])
        adjustment.update_container(str(update.get("container_id", "")), resources)
    return adjustment


def _hints(hints: Sequence[TopologyHint] | None) -> Any:
    if hints is None:
        return None
    return [
        {"numa": None if h.numa is None else sorted(h.numa), "preferred": h.preferred}
        for h in hints
    ]


def update_docs(updates: Sequence[SentUpdate]) -> list[dict[str, Any]]:
    return [
        {
            "container_id": u.container_id,
            "resources": dict(u.resources),
            "changed": dict(u.changed),
            "hooks": list(u.hooks),
            "status": status_doc(u.status),
        }
        for u in updates
    ]


def observation_docs(observed: Iterable[Observation]) -> list[dict[str, Any]]:
    out = []
    for o in observed:
        doc: dict[str, Any] = {"seam": o.seam, "op": o.op, "args": list(o.args)}
        if o.error is not None:
            doc["error"] = o.error
        else:
            doc["result"] = o.result
        out.append(doc)
    return out


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str, check_circular=False)
"""(Lines are trees built here: no cycle to look for, and the look costs a third of the
encoding.)"""


def encode_line(line: dict[str, Any]) -> bytes:
    """One line of a recording, as written."""
    return _ENCODER.encode(line).encode() + b"\n"
