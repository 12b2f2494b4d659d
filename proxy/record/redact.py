"""What a recording leaves out unless `--record-secrets`: env values, the values of annotations
whose name matches `[record] redact_annotations` or whose value matches `redact_values`
(globs, case-insensitive), the runtime's verbose `info` (it repeats the container's config,
env included) and ExecSync output.

Applied to a decoded message in place, before it is re-encoded for the recording: the bytes a
recording keeps for a redacted call are those of the redacted message, and a replay redacts
what it would forward the same way before comparing.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from crihook.hooks.spec import Event
from crihook.proxy.cri.events import EVENTS, Secret

__all__ = ["REDACTED", "Redactor"]

REDACTED = "<redacted>"
_REDACTED_BYTES = REDACTED.encode()
_OUTPUT_FIELDS = frozenset({"stdout", "stderr"})
"""ExecSyncResponse: a command's output."""
_CACHED = 4096
"""Annotation verdicts kept (kubelet sends a pod's annotations again and again)."""


class Redactor:
    """`names`, `values`: globs for annotation names and values. `enabled=False` keeps
    everything."""

    def __init__(
        self, names: Sequence[str], values: Sequence[str] = (), enabled: bool = True
    ) -> None:
        self.enabled = enabled
        self._names = _compile(names)
        self._values = _compile(values)
        self._verdicts: dict[tuple[str, str], bool] = {}

    def secret(self, key: str, value: str) -> bool:
        """An annotation whose value is redacted."""
        verdict = self._verdicts.get((key, value))
        if verdict is None:
            key_low, value_low = key.lower(), value.lower()
            verdict = any(m(key_low) for m in self._names) or any(
                m(value_low) for m in self._values
            )
            if len(self._verdicts) >= _CACHED:
                self._verdicts.clear()
            self._verdicts[(key, value)] = verdict
        return verdict

    def request(self, event: Event, message: Any) -> bool:
        """Redact an intercepted request in place (only where its secrets are: env values,
        annotations, as its row says); whether anything changed. Cheaper than `message`."""
        if not self.enabled:
            return False
        changed = False
        for part, kind in EVENTS[event].secret_parts:  # each evaluated: all are redacted
            if kind is Secret.ENVS:
                changed = self._envs(part(message)) or changed
            else:
                changed = self._annotations(part(message)) or changed
        return changed

    def _envs(self, envs: Any) -> bool:
        changed = False
        for kv in envs:
            if kv.value and kv.value != _REDACTED_BYTES:
                kv.value = _REDACTED_BYTES
                changed = True
        return changed

    def _annotations(self, annotations: Any) -> bool:
        secret = [k for k in annotations if (v := annotations[k]) != REDACTED and self.secret(k, v)]
        for key in secret:
            annotations[key] = REDACTED
        return bool(secret)

    def annotations(self, annotations: Mapping[str, str]) -> dict[str, str]:
        """A copy with the secret values replaced."""
        if not self.enabled:
            return dict(annotations)
        return {k: REDACTED if self.secret(k, v) else v for k, v in annotations.items()}

    def message(self, message: Message) -> bool:
        """Redact `message` in place; whether anything changed."""
        if not self.enabled:
            return False
        return self._walk(message)

    def _walk(self, message: Message) -> bool:
        changed = False
        for field, value in message.ListFields():
            entry = field.message_type
            name = field.name
            if entry is not None and entry.GetOptions().map_entry:
                if entry.fields_by_name["value"].message_type is not None:
                    for item in value.values():
                        changed |= self._walk(item)
                elif name == "annotations":
                    changed |= self._annotations(value)
                elif name == "info":
                    for key in [k for k, v in value.items() if v != REDACTED]:
                        value[key] = REDACTED
                        changed = True
            elif entry is not None and field.is_repeated:
                if name == "envs" and entry.name == "KeyValue":
                    changed |= self._envs(value)
                else:
                    for item in value:
                        changed |= self._walk(item)
            elif entry is not None:
                changed |= self._walk(value)
            elif name in _OUTPUT_FIELDS and field.type == FieldDescriptor.TYPE_BYTES:
                setattr(message, name, _REDACTED_BYTES)
                changed = True
        return changed

    def env_value(self, value: Any) -> Any:
        return REDACTED if self.enabled and value else value


def _compile(patterns: Sequence[str]) -> list[Callable[[str], bool]]:
    """A test per glob, on lower-cased text: `*word*`, `word*` and `*word` as plain string
    tests (most patterns are these, and they are several times faster than a regex)."""
    tests: list[Callable[[str], bool]] = []
    for pattern in patterns:
        low = pattern.lower()
        core = low.strip("*")
        if core and not any(c in core for c in "*?[") and low != core:
            if low.startswith("*") and low.endswith("*"):
                tests.append(_contains(core))
            elif low.endswith("*"):
                tests.append(_starts(core))
            else:
                tests.append(_ends(core))
        else:
            tests.append(_glob(re.compile(fnmatch.translate(low), re.DOTALL)))
    return tests


def _contains(part: str) -> Callable[[str], bool]:
    return lambda text: part in text


def _starts(prefix: str) -> Callable[[str], bool]:
    return lambda text: text.startswith(prefix)


def _ends(suffix: str) -> Callable[[str], bool]:
    return lambda text: text.endswith(suffix)


def _glob(pattern: re.Pattern[str]) -> Callable[[str], bool]:
    return lambda text: pattern.match(text) is not None
