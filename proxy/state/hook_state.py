"""One hook's private key-value state, and the JSON encoder the store writes it with.

Each value is encoded once, when a hook sets it; the store's journal lines and state files
join those encodings (proxy/state/store.py), and its record snapshots use the same encoder.
"""

from __future__ import annotations

import json
import json.encoder
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = ["HookStateStore", "encode_key", "encode_value"]


class HookStateStore:
    """One hook's private key-value namespace (JSON values), persisted with the store. Each
    value is encoded once, when it is set: the journal line and the compaction join the
    encodings instead of encoding the state again."""

    def __init__(self, name: str, data: dict[str, Any], on_change: Any) -> None:
        self.name = name
        self._data = data
        self._json: dict[str, str] = {}
        """Key → its value's JSON; a key missing here (loaded from disk) is encoded lazily."""
        self._on_change = on_change

    def get(self, key: str, default: Any = None) -> Any:
        return self._data.get(key, default)

    def set(self, key: str, value: Any) -> None:
        # Encoded here: what cannot be persisted is refused at the hook's call site.
        encoded = encode_value(value)
        self._data[key] = value
        self._json[key] = encoded
        self._on_change(self.name, key)

    def delete(self, key: str) -> None:
        if key in self._data:
            del self._data[key]
            self._json.pop(key, None)
            self._on_change(self.name, key)

    def items(self) -> Iterator[tuple[str, Any]]:
        return iter(list(self._data.items()))

    def to_dict(self) -> dict[str, Any]:
        return dict(self._data)

    def encoded(self) -> bytes:
        """The whole state as a JSON object (keys sorted), for its state file."""
        pairs = ",".join(f"{encode_key(k)}:{self._value(k)}" for k in sorted(self._data))
        return f"{{{pairs}}}".encode()

    def changes(self, keys: Iterable[str]) -> str:
        """A journal entry for `keys`, as JSON: their values now (`set`), and those no
        longer set (`delete`)."""
        present = sorted(k for k in keys if k in self._data)
        gone = sorted(k for k in keys if k not in self._data)
        parts = []
        if present:
            values = ",".join(f"{encode_key(k)}:{self._value(k)}" for k in present)
            parts.append(f'"set":{{{values}}}')
        if gone:
            parts.append(f'"delete":{encode_value(gone)}')
        return f"{{{','.join(parts)}}}"

    def _value(self, key: str) -> str:
        encoded = self._json.get(key)
        if encoded is None:
            encoded = self._json[key] = encode_value(self._data[key])
        return encoded


def _value_encoder() -> Callable[[Any], str]:
    """JSON with sorted keys and no spaces, as json.JSONEncoder(sort_keys=True, separators=
    (",", ":")).encode gives it. Made once: json.dumps with options builds an encoder on
    every call, and JSONEncoder.encode its C encoder; a call that reserves something encodes
    a value or two (~2.6 µs each that way, ~1.6 µs with the C encoder kept)."""
    fallback = json.JSONEncoder(sort_keys=True, separators=(",", ":"))
    make = getattr(json.encoder, "c_make_encoder", None)  # not in the typing stubs
    if make is None:  # an interpreter without the C accelerator
        return fallback.encode
    # No circular-reference markers: a value that contains itself exceeds the recursion
    # limit instead (RecursionError, refused at the hook's call site all the same).
    chunks = make(
        None, fallback.default, json.encoder.encode_basestring_ascii, None, ":", ",", True,
        False, True,
    )  # fmt: skip

    def encode(value: Any) -> str:
        if isinstance(value, str):
            return json.encoder.encode_basestring_ascii(value)
        return "".join(chunks(value, 0))

    return encode


encode_value = _value_encoder()
encode_key = json.encoder.encode_basestring_ascii  # json.dumps(a str), without its overhead
