"""One INFO line per intercepted call, from its outcome:

    CreateContainer ok (adjusted) method=CreateContainer pod=default/web-0 container=app
        hooks=20-cpuset/hints:hints,20-cpuset/pre:adjusted,20-cpuset/post:nothing
        outcome=adjusted elapsed_ms=12.41 runtime_ms=11.87

`outcome` is `ok`, `adjusted` (forwarded with changes), or the status code the call ended
with; `origin` says who ended a failed call (`crihook`, `runtime`, `kubelet`). `hooks` lists
each hook's run as `hook/stage:verdict`, in order. `elapsed_ms` is the whole call as crihook
saw it; `runtime_ms` the runtime's part of it (from the request forwarded to its answer or
error), absent when the runtime gave neither (the call never reached it, or kubelet
cancelled it there): the difference is what crihook added. The JSON format has the same
keys.

Only names, ids, verdicts and codes: never a request's content (env values, annotations),
so nothing a pod carries as a secret reaches the log. Why a call was refused is logged by
the pipeline (WARNING) before this line.
"""

from __future__ import annotations

import logging
from typing import Any

from crihook.proxy.cri.outcome import Outcome

__all__ = ["CallLog", "call_fields"]

# A pinned name, not the module path: operators filter on it (README, "Logs").
log = logging.getLogger("crihook.proxy.call_log")


def call_fields(outcome: Outcome) -> tuple[str, dict[str, Any]]:
    """The line's message and its fields."""
    method = outcome.event.value
    fields: dict[str, Any] = {"method": method, "pod": _pod(outcome)}
    container = outcome.container
    if container is not None:
        fields["container"] = container.name or container.id[:12] or "-"
    fields["hooks"] = ",".join(
        f"{hook}/{stage.value}:{verdict}" for hook, stage, verdict, *_ in outcome.trace or ()
    )
    status = outcome.status
    if status is None:
        result = "adjusted" if outcome.changed else "ok"
        message = f"{method} ok (adjusted)" if outcome.changed else f"{method} ok"
    else:
        result = status.code.name
        fields["origin"] = outcome.status_origin
        if outcome.status_origin == "runtime":
            message = f"{method} failed in the runtime: {result}"
        elif outcome.status_origin == "kubelet":
            message = f"{method} cancelled by kubelet"
        else:
            message = f"{method} refused by crihook: {result}"
    fields["outcome"] = result
    fields["elapsed_ms"] = round(outcome.elapsed * 1000, 3)
    if outcome.runtime_elapsed is not None:
        fields["runtime_ms"] = round(outcome.runtime_elapsed * 1000, 3)
    return message, fields


class CallLog:
    """The pipeline's `on_outcome` listener that writes the line."""

    def outcome(self, outcome: Outcome) -> None:
        if log.isEnabledFor(logging.INFO):
            message, fields = call_fields(outcome)
            log.info("%s", message, extra=fields)


def _pod(outcome: Outcome) -> str:
    pod = outcome.pod
    if pod is None:
        return "-"
    if pod.name:
        return f"{pod.namespace}/{pod.name}"
    return pod.id[:12] or "-"
