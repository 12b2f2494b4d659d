"""An example validator: refuse privileged containers and host-path mounts outside an
allowlist, whoever asked for them (kubelet, or a hook earlier in the chain).

    [hooks]
    order = ["90-guard"]
    [hooks.guard]
    host_paths = ["/var/lib/kubelet/*", "/var/log/pods/*", "/data/*"]
    privileged_namespaces = ["kube-system"]

A validator sees the request as crihook would forward it, after every pre stage, and who
set each field (`ctx.owners`); it can only refuse the call. Host paths are resolved
(symlinks, `..`) before they are matched, so a link inside an allowed directory cannot
reach outside it. The defaults allow what kubelet itself mounts (its pod directories and
logs) and no privileged container.
"""

from __future__ import annotations

import asyncio
import fnmatch
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from crihook.hooks.spec import Hook, HookContext, Reject, reject_unknown

__all__ = ["GuardHook", "GuardOptions", "parse_options", "refusal"]

DEFAULT_HOST_PATHS = ("/var/lib/kubelet/*", "/var/log/pods/*")


@dataclass(frozen=True)
class GuardOptions:
    host_paths: tuple[str, ...] = DEFAULT_HOST_PATHS
    privileged_namespaces: tuple[str, ...] = ()


def parse_options(options: Mapping[str, Any]) -> GuardOptions:
    reject_unknown("guard", options, {"host_paths", "privileged_namespaces"})
    out = {}
    for name in ("host_paths", "privileged_namespaces"):
        if name in options:
            value = options[name]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"guard: {name} must be a list of strings, not {value!r}")
            out[name] = tuple(value)
    for pattern in out.get("host_paths", ()):
        if not pattern.startswith("/"):
            raise ValueError(f"guard: host_paths: {pattern!r} is not an absolute path glob")
    return GuardOptions(**out)


def refusal(
    options: GuardOptions,
    namespace: str,
    privileged: bool,
    host_paths: Sequence[tuple[str, str]],
    owners: Mapping[str, str],
) -> str | None:
    """Why the container may not run, or None. `host_paths`: (container path, resolved host
    path) of its mounts; `owners`: who set which field (to say who asked)."""
    if privileged and namespace not in options.privileged_namespaces:
        return f"privileged containers are not allowed in namespace {namespace!r}"
    for container_path, host_path in host_paths:
        if not any(fnmatch.fnmatchcase(host_path, p) for p in options.host_paths):
            who = owners.get(f"mount {container_path!r}", "kubelet")
            return (
                f"host path {host_path} (mounted at {container_path}, asked by {who}) is "
                f"outside the allowed host paths {list(options.host_paths)}"
            )
    return None


class GuardHook(Hook):
    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(options)
        self.config = parse_options(self.options)

    async def validate_create_container(self, ctx: HookContext) -> None:
        config = ctx.request.config  # type: ignore[attr-defined]
        mounts = [(m.container_path, m.host_path) for m in config.mounts]
        resolved = await asyncio.to_thread(_resolve, mounts)  # symlinks: file system reads
        privileged = config.linux.security_context.privileged
        why = refusal(self.config, ctx.pod.namespace, privileged, resolved, ctx.owners)
        if why is not None:
            raise Reject(why)

    async def validate_run_pod_sandbox(self, ctx: HookContext) -> None:
        config = ctx.request.config  # type: ignore[attr-defined]
        privileged = config.linux.security_context.privileged
        why = refusal(self.config, ctx.pod.namespace, privileged, (), ctx.owners)
        if why is not None:
            raise Reject(why)


def _resolve(mounts: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(c, os.path.realpath(h)) for c, h in mounts]
