"""What a hook raises to refuse a request."""

from __future__ import annotations

__all__ = ["Forbidden", "InvalidRequest", "Reject", "cut", "shown", "shown_all"]


class Reject(Exception):
    """The hook refuses this request (a malformed annotation, an impossible request).

    The CRI call fails with FAILED_PRECONDITION and a message naming the hook and the reason,
    whatever the hook's failure policy: a refusal is a decision, not a failure.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class InvalidRequest(Reject):
    """The request itself is malformed for this hook (an annotation that does not parse, a
    value outside what the node allows): the CRI call fails with INVALID_ARGUMENT."""


class Forbidden(Reject):
    """The request is well formed, and the node's policy does not allow it (a device, a host
    path or an interface outside the allowlist, a namespace that may not ask): the CRI call
    fails with PERMISSION_DENIED."""


def shown(value: object) -> str:
    """A value as a refusal's message names it: its repr, `cut` (a pod's annotation may be
    long, and it is quoted back to kubelet and into the logs)."""
    return cut(repr(value))


def cut(text: str) -> str:
    """`text`, cut to 80 characters (its end kept: a closing quote or bracket)."""
    return text if len(text) <= 80 else f"{text[:76]}...{text[-1]}"


def shown_all(values: list[str]) -> str:
    """The first five of `values` as `shown`, and how many more."""
    listed = ", ".join(shown(v) for v in values[:5])
    return listed + (f" and {len(values) - 5} more" if len(values) > 5 else "")
