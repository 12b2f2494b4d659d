"""`crihook replay FILE --explain HOOK`: what one hook set on each container, and why.

A pure function of a replay's report: the replayed runs of the hook (`hook_docs`, as a
recording keeps them), grouped by pod and container in the order they first appear, each with
what the hook set, the other containers it moved, and its reason (`Adjustment.because`):

    koordinator (as replayed), per container:
    default/lsr-0
      RunPodSandbox (line 4): cpu_quota=-1, cpuset_cpus="1"
        why: QoS LSR (label koordinator.sh/qosClass); koord-scheduler's cpus (...)
    default/lsr-0 app
      CreateContainer (line 5): cpu_quota=-1, cpuset_cpus="1"
        moves: default/ls-0 app cpuset_cpus="0"
        why: cpus: koord-scheduler's (...); QoS LSR (label koordinator.sh/qosClass)

Runs that set nothing and say nothing (most calls of most containers) are left out. Pod-level
calls (RunPodSandbox, UpdatePodSandboxResources) are listed under the pod alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from crihook.proxy.replay.file import CallEntry
from crihook.proxy.replay.runner import EntryResult, ReplayReport

__all__ = ["explain", "explain_all"]

_SHOWN = frozenset({"pre", "post", "validate"})
_NN = re.compile(r"^[0-9]{2}-")


def explain(report: ReplayReport, hook: str) -> list[str]:
    """The lines `--explain HOOK` prints (the hook named with or without its `NN-`)."""
    wanted = _NN.sub("", hook)
    results = [r for r in report.results if isinstance(r.entry, CallEntry)]
    names = _container_names(results)
    groups: dict[tuple[str, str], list[str]] = {}
    ran = False
    for result in results:
        entry = result.entry
        assert isinstance(entry, CallEntry)
        doc = result.updated or entry.doc
        for run in doc.get("hooks", []):
            if _NN.sub("", str(run.get("hook", ""))) != wanted:
                continue
            ran = True
            lines = _run_lines(entry, run, names, doc.get("updates", []))
            if lines:
                key = (str(entry.doc.get("pod", "")), str(entry.doc.get("container", "")))
                groups.setdefault(key, []).extend(lines)
    heading = f"{wanted} (as replayed), per container:"
    if not ran:
        return [heading, f"  hook {wanted} did not run in this replay (is it in the chain?)"]
    out = [heading]
    for (pod, container), lines in groups.items():
        out.append(f"{pod} {container}".rstrip() if pod else container or "(no pod)")
        out.extend(lines)
    return out


def _run_lines(
    entry: CallEntry,
    run: Mapping[str, Any],
    names: Mapping[str, str],
    issued: Sequence[Mapping[str, Any]],
) -> list[str]:
    """`issued`: the call's updates, member by member: what the hook's group updates
    (`update_groups`: every container of a pool) moved."""
    stage, verdict = str(run.get("stage", "")), str(run.get("verdict", ""))
    detail = str(run.get("detail", ""))
    answer = run.get("answer")
    if stage not in _SHOWN or (verdict == "nothing" and not detail):
        return []
    what = entry.event.value if stage == "pre" else f"{entry.event.value} {stage}"
    head = f"  {what} (line {entry.line}): "
    if verdict in ("rejected", "failed", "ignored", "cancelled"):
        return [head + f"{verdict}: {detail}"]
    sets = answer.get("set", {}) if isinstance(answer, Mapping) else {}
    lines = [
        head + (_fields(sets) or "nothing set") + (" (dry-run)" if verdict == "dry-run" else "")
    ]
    updates = answer.get("updates", []) if isinstance(answer, Mapping) else []
    for update in updates:
        target = names.get(update.get("container_id", ""), str(update.get("container_id", ""))[:12])
        lines.append(f"    moves: {target} {_fields(update.get('resources', {}))}")
    groups = answer.get("update_groups", []) if isinstance(answer, Mapping) else []
    if groups:
        own = {u.get("container_id") for u in updates}
        for update in issued:
            cid = update.get("container_id", "")
            if cid in own or run.get("hook") not in update.get("hooks", ()):
                continue
            target = names.get(cid, str(cid)[:12])
            lines.append(f"    moves: {target} {_fields(update.get('changed', {}))}")
    if detail:
        lines.append(f"    why: {detail}")
    return lines


def _fields(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={json.dumps(v, sort_keys=True)}" for k, v in sorted(values.items()))


def _container_names(results: Iterable[EntryResult]) -> dict[str, str]:
    """Container id → `namespace/pod container`, from the calls that name both."""
    out: dict[str, str] = {}
    for result in results:
        doc = result.entry.doc
        cid = doc.get("container_id") or _created_id(doc)
        if cid and doc.get("container"):
            out[str(cid)] = f"{doc.get('pod', '')} {doc['container']}".strip()
    return out


def _created_id(doc: Mapping[str, Any]) -> str:
    response = doc.get("response")
    if not isinstance(response, Mapping) or doc.get("method") != "CreateContainer":
        return ""
    rendered = response.get("json")
    return str(rendered.get("container_id", "")) if isinstance(rendered, Mapping) else ""


def explain_all(report: ReplayReport, hooks: Sequence[str]) -> list[str]:
    """`explain` for each hook named (comma-separated names allowed), one block each."""
    out: list[str] = []
    for name in (n.strip() for h in hooks for n in h.split(",")):
        if name:
            out.extend(explain(report, name))
    return out
