"""What the runtime really created, against what crihook set: fields changed after crihook.

crihook rewrites CreateContainer before the runtime sees it, but the runtime can change the
container again: containerd 2.x and CRI-O run NRI plugins after crihook (a plugin may set
the same env var, annotation, cpuset or OOM score), and a runtime applies its own rules (an
OOM score restricted to its own). With `read_back = true`, after each CreateContainer that a
hook adjusted, crihook asks the runtime for the container's verbose status (one
ContainerStatus call, off the call path: kubelet already has its answer) and compares each
field a hook set with the OCI spec the runtime made:

- env var: the last `NAME=` in `process.env`;
- annotation: `annotations[key]`, when the spec has the key: containerd copies a
  container's CRI annotations into the OCI spec only where its config allows (CRI-O always
  does), so an annotation the spec lacks is not a change;
- cpuset cpus and mems: `linux.resources.cpu.cpus` / `.mems`, as CPU sets ("0-1" is "0,1");
- cpu shares, quota, period, memory limit: `linux.resources.cpu.*`, `.memory.limit`;
- OOM score: `process.oomScoreAdj`.

Other fields (devices, mounts, hugepages, unified, CDI) are not compared. A field found
different is a :class:`Change`: counted by field (``crihook_fields_changed_after_crihook``)
and noted in the container's audit in the store (``crihook state`` shows it). The pure part
is :func:`changes`; :class:`ReadBack` does the call and the bookkeeping.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.node import parse_cpu_list
from crihook.hooks.spec.adjustment import REMOVE, Field, FieldKey, describe_key
from crihook.proxy.cri.methods import method_path
from crihook.proxy.cri.runtime import Runtime, RuntimeCallFailed
from crihook.proxy.state.runtime_status import runtime_spec
from crihook.proxy.state.store import Store

__all__ = ["COMPARED", "Change", "ReadBack", "changes"]

log = logging.getLogger(__name__)

READ_TIMEOUT_SECONDS = 10.0


class Change(NamedTuple):
    """A field a hook set that the container, as the runtime made it, does not have."""

    key: FieldKey
    hook: str
    set_to: Any
    """What crihook sent (JSON-able)."""
    found: Any
    """What the runtime's OCI spec says (None: absent)."""

    @property
    def label(self) -> str:
        return describe_key(self.key)


def _resources(spec: Mapping[str, Any], part: str, name: str) -> Any:
    linux = spec.get("linux") or {}
    return ((linux.get("resources") or {}).get(part) or {}).get(name)


def _env(spec: Mapping[str, Any], name: str) -> str | None:
    found = None
    for item in (spec.get("process") or {}).get("env") or ():
        key, sep, value = str(item).partition("=")
        if sep and key == name:
            found = value
    return found


def _cpus(text: Any) -> frozenset[int] | Any:
    try:
        return frozenset(parse_cpu_list(str(text))) if text is not None else None
    except ValueError:
        return text


_UNSEEN: Any = object()  # the spec does not carry the field at all: nothing to compare

# Field -> (the value in the runtime's spec, a normal form to compare both sides in).
_READERS: dict[Field, tuple[Callable[[Mapping[str, Any], str], Any], Callable[[Any], Any]]] = {
    Field.ENV: (_env, lambda v: v.decode(errors="replace") if isinstance(v, bytes) else v),
    Field.ANNOTATION: (lambda s, k: (s.get("annotations") or {}).get(k, _UNSEEN), lambda v: v),
    Field.CPUSET_CPUS: (lambda s, _: _resources(s, "cpu", "cpus"), _cpus),
    Field.CPUSET_MEMS: (lambda s, _: _resources(s, "cpu", "mems"), _cpus),
    Field.CPU_SHARES: (lambda s, _: _resources(s, "cpu", "shares"), lambda v: v),
    Field.CPU_QUOTA: (lambda s, _: _resources(s, "cpu", "quota"), lambda v: v),
    Field.CPU_PERIOD: (lambda s, _: _resources(s, "cpu", "period"), lambda v: v),
    Field.MEMORY_LIMIT: (lambda s, _: _resources(s, "memory", "limit"), lambda v: v),
    Field.OOM_SCORE_ADJ: (lambda s, _: (s.get("process") or {}).get("oomScoreAdj"), lambda v: v),
}
COMPARED = frozenset(_READERS)
"""The fields a read-back compares."""


def changes(
    owners: Mapping[FieldKey, str], values: Mapping[FieldKey, Any], spec: Mapping[str, Any]
) -> list[Change]:
    """Each field a hook set (``owners``: key -> hook, ``values``: key -> value, as a
    Merger keeps them) whose value in the runtime's OCI ``spec`` is another, in key order.
    A removal (an env var or annotation a hook took away) is a change when it is back."""
    found: list[Change] = []
    for key, hook in owners.items():
        field, name = key
        reader = _READERS.get(field)
        if reader is None:
            continue
        read, normal = reader
        value, actual = values.get(key), read(spec, name)
        if actual is _UNSEEN:
            continue
        if value is REMOVE:
            if actual is not None:
                found.append(Change(key, hook, None, actual))
            continue
        if normal(value) != normal(actual):
            shown = value.decode(errors="replace") if isinstance(value, bytes) else value
            found.append(Change(key, hook, shown, actual))
    return sorted(found, key=lambda c: c.label)


class ReadBack:
    """Reads back adjusted containers in the background; `counts`: changes by field."""

    def __init__(self, runtime: Runtime, store: Store) -> None:
        self._status = runtime.call(method_path("RuntimeService", "ContainerStatus"))
        self.store = store
        self.counts: Counter[str] = Counter()
        """Changes found, by field (`env`, `cpuset_cpus`, ...): bounded labels."""
        self.failures = 0
        """Read-backs the runtime did not answer (nothing compared)."""
        self._tasks: set[asyncio.Task[None]] = set()

    def after_create(
        self, container_id: str, owners: Mapping[FieldKey, str], values: Mapping[FieldKey, Any]
    ) -> None:
        """Schedule the read-back of a container a hook adjusted (fields worth comparing
        only); returns at once."""
        compared = {k: h for k, h in owners.items() if k[0] in COMPARED}
        if not compared:
            return
        wanted = {k: values.get(k) for k in compared}
        task = asyncio.get_running_loop().create_task(
            self._check(container_id, compared, wanted),
            name=f"crihook-readback-{container_id[:12]}",
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Wait for the read-backs scheduled so far (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _check(
        self, container_id: str, owners: Mapping[FieldKey, str], values: Mapping[FieldKey, Any]
    ) -> None:
        request = api_pb2.ContainerStatusRequest(container_id=container_id, verbose=True)
        try:
            raw = await self._status(request.SerializeToString(), timeout=READ_TIMEOUT_SECONDS)
        except RuntimeCallFailed as exc:
            self.failures += 1
            log.info("read-back of container %s: %s", container_id[:12], exc.status.details)
            return
        status = api_pb2.ContainerStatusResponse.FromString(raw)
        spec = runtime_spec(status.info)
        if spec is None:
            self.failures += 1
            log.info("read-back of container %s: no OCI spec in its status", container_id[:12])
            return
        found = changes(owners, values, spec)
        if not found:
            return
        record = self.store.container(container_id)
        for change in found:
            self.counts[change.key[0].value] += 1
            secret = change.key[0] is Field.ENV  # env values are never logged
            log.warning(
                "container %s: %s was set%s by %s, the runtime made it %s (an NRI plugin or "
                "the runtime's own rules changed it after crihook)",
                container_id[:12],
                change.label,
                "" if secret else f" to {json.dumps(change.set_to, default=str)}",
                change.hook,
                "something else" if secret else json.dumps(change.found, default=str),
            )
            if record is not None and change.label in record.audit:
                record.audit[change.label]["runtime_made_it"] = change.found
        if record is not None:
            self.store.put_container(record)
            self.store.write_behind()
