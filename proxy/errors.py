"""crihook's expected errors, and the gRPC status each one becomes.

    CrihookError                      base; never raised itself
    ├── ConfigError                   a bad setting or flag; exit 2 at start
    ├── SocketInUseError              the listen socket is served by a live process
    ├── StateDirInUseError            another live crihook holds the state directory
    ├── RuntimeUnavailable            the runtime cannot be reached (UNAVAILABLE)
    ├── StateWriteError               crihook cannot persist what a hook reserved, so the call is
    │                                 not forwarded (RESOURCE_EXHAUSTED: disk full or quota;
    │                                 UNAVAILABLE: any other I/O error)
    ├── HookError                     a hook failed; carries the hook's name
    │   ├── HookTimeout               the hook did not answer within its timeout (UNAVAILABLE),
    │   │                             or within what was left of kubelet's deadline
    │   │                             (DEADLINE_EXCEEDED: kubelet's deadline passed)
    │   ├── HookUnavailable           the plugin cannot be reached (UNAVAILABLE)
    │   ├── HookRejected              the hook refused the request (FAILED_PRECONDITION)
    │   │   ├── HookInvalidRequest    the hook found the request malformed (INVALID_ARGUMENT)
    │   │   └── HookForbidden         the node's policy does not allow what the request asks
    │   │                             (PERMISSION_DENIED)
    │   ├── HookInvalidAdjustment     the hook returned something this call cannot carry (INTERNAL)
    │   └── HookNotPermitted          the hook set a field it is not granted (PERMISSION_DENIED)
    ├── HookRequired                  a required hook did not run successfully
    │                                 (FAILED_PRECONDITION, whatever its failure policy)
    ├── HookConflict                  two hooks set the same field (FAILED_PRECONDITION)
    └── TopologyRejected              the topology policy cannot place the container or pod
                                      (FAILED_PRECONDITION)

Expected errors carry a message a node operator can act on: what failed, for which pod or
container, which hook, and what to do. Anything else is a bug and surfaces as INTERNAL.
"""

from __future__ import annotations

import errno
from pathlib import Path

import grpc

__all__ = [
    "ConfigError",
    "CrihookError",
    "HookConflict",
    "HookError",
    "HookForbidden",
    "HookInvalidAdjustment",
    "HookInvalidRequest",
    "HookNotPermitted",
    "HookRejected",
    "HookRequired",
    "HookTimeout",
    "HookUnavailable",
    "RuntimeUnavailable",
    "SocketInUseError",
    "StateDirInUseError",
    "StateWriteError",
]


class CrihookError(Exception):
    """Base of every expected crihook error."""

    status: grpc.StatusCode = grpc.StatusCode.INTERNAL


class ConfigError(CrihookError):
    """A setting is wrong; the message names the setting and what is wrong with it."""

    def __init__(self, setting: str, problem: str) -> None:
        super().__init__(f"{setting}: {problem}")
        self.setting = setting
        self.problem = problem


class SocketInUseError(CrihookError):
    """Another live process already serves on the listen socket."""


class StateDirInUseError(CrihookError):
    """Another live crihook holds the state directory (proxy/state/directory.py): two would
    overwrite each other's store and hook states."""


class RuntimeUnavailable(CrihookError):
    status = grpc.StatusCode.UNAVAILABLE


class StateWriteError(CrihookError):
    """The state directory refused a write that had to happen before the call is forwarded
    (a hook's reservation). Nothing reached the runtime; kubelet retries the call."""

    def __init__(self, state_dir: Path, error: OSError) -> None:
        reason = error.strerror or str(error)
        super().__init__(
            f"cannot write its state to {state_dir} ({reason}); the call was not forwarded"
        )
        self.state_dir = state_dir
        self.error = error
        self.status = (
            grpc.StatusCode.RESOURCE_EXHAUSTED
            if error.errno in (errno.ENOSPC, errno.EDQUOT)
            else grpc.StatusCode.UNAVAILABLE
        )


class HookError(CrihookError):
    """A hook failed. The message always starts with the hook's name."""

    def __init__(self, hook: str, message: str) -> None:
        super().__init__(f"hook {hook!r}: {message}")
        self.hook = hook


class HookTimeout(HookError):
    """The hook did not answer in time. Its own `timeout_ms` ran out: UNAVAILABLE (the
    caller's deadline is far off; DEADLINE_EXCEEDED would tell kubelet its own deadline
    passed). The time it had was what was left of kubelet's deadline (`kubelet_deadline`):
    DEADLINE_EXCEEDED, as the runtime or grpc would say."""

    def __init__(self, hook: str, message: str, kubelet_deadline: bool = False) -> None:
        super().__init__(hook, message)
        self.kubelet_deadline = kubelet_deadline
        self.status = (
            grpc.StatusCode.DEADLINE_EXCEEDED if kubelet_deadline else grpc.StatusCode.UNAVAILABLE
        )


class HookUnavailable(HookError):
    status = grpc.StatusCode.UNAVAILABLE


class HookRejected(HookError):
    status = grpc.StatusCode.FAILED_PRECONDITION


class HookInvalidRequest(HookRejected):
    status = grpc.StatusCode.INVALID_ARGUMENT


class HookForbidden(HookRejected):
    """The hook refused what the request asks for: the node's policy does not allow it (a
    device or host path outside the allowlist, a namespace that may not ask)."""

    status = grpc.StatusCode.PERMISSION_DENIED


class HookInvalidAdjustment(HookError):
    status = grpc.StatusCode.INTERNAL


class HookNotPermitted(HookError):
    status = grpc.StatusCode.PERMISSION_DENIED


class HookRequired(CrihookError):
    """A hook the configuration or the pod requires did not run successfully (down, skipped
    by its breaker, timed out, failed, exempted, or not in the chain)."""

    status = grpc.StatusCode.FAILED_PRECONDITION


class HookConflict(CrihookError):
    """Two hooks set the same field of the same request."""

    status = grpc.StatusCode.FAILED_PRECONDITION

    def __init__(self, field: str, owner: str, other: str) -> None:
        super().__init__(
            f"hooks {owner!r} and {other!r} both set {field}; "
            "fix the hooks or set [hooks] precedence in the crihook config"
        )
        self.field = field
        self.owner = owner
        self.other = other


class TopologyRejected(CrihookError):
    """The topology policy admits no placement the resource hooks offered (kubelet's
    TopologyAffinityError)."""

    status = grpc.StatusCode.FAILED_PRECONDITION
