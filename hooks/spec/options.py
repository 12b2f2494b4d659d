"""Checks a hook's own options (`[hooks.<name>]`, or a plugin's command line) share."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

__all__ = ["reject_unknown"]


def reject_unknown(hook: str, options: Mapping[str, Any], known: Collection[str]) -> None:
    """ValueError `<hook>: unknown option(s) a, b` (sorted) when `options` has a key that is
    not in `known`: a misspelt option fails at start instead of being ignored."""
    unknown = sorted(set(options).difference(known))
    if unknown:
        raise ValueError(f"{hook}: unknown option(s) {', '.join(unknown)}")
