"""`crihook state`: pods, containers, who set which field, hook states, from the state dir.

Whether crihook runs comes from the process itself: the lock a running crihook holds on its
state directory (proxy/state/directory.py) names its pid, also when a full disk kept status.json
from being written. Only a state directory without the lock file (an older crihook's) is
judged by the age of its status file."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from crihook.proxy.state.directory import HOOKS_DIR, LOCK_FILE, state_dir_holder
from crihook.proxy.state.journal import journal_files
from crihook.proxy.state.records_journal import apply_records, read_records
from crihook.proxy.state.store import STATUS_FILE, STORE_FILE, apply_journal, read_journal

__all__ = ["STALE_SECONDS", "liveness", "load_state", "process_of", "render_state", "show_state"]


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def load_state(state_dir: Path) -> dict[str, Any]:
    # The records: store.json (the snapshot) and the lines written since, journal first
    # (read_records says why).
    records = read_records(state_dir)
    store = _read(state_dir / STORE_FILE) or {"pods": {}, "containers": {}}
    apply_records(records, store)
    hooks = _hook_states(state_dir / HOOKS_DIR)
    return {
        "status": _read(state_dir / STATUS_FILE),
        "process": process_of(state_dir),
        "pods": store.get("pods", {}),
        "containers": store.get("containers", {}),
        "hook_states": hooks,
    }


# How often the hook states are read again while crihook keeps writing the journal under the
# reader; past it the last read is shown (crihook writes at most a line per call).
HOOK_STATE_READS = 5


def _journal_stamp(hooks_dir: Path) -> list[tuple[str, int]]:
    stamp = []
    for _, path in journal_files(hooks_dir):
        try:
            stamp.append((path.name, path.stat().st_size))
        except FileNotFoundError:
            stamp.append((path.name, -1))
    return stamp


def _hook_states(hooks_dir: Path) -> dict[str, Any]:
    """Each hook's state: its state file with the journal lines written ahead since the last
    compaction (at most seconds ago, or before crihook stopped), the journal read first
    (read_journal says why). Read again while the journal changed during the read: a line
    appended after the journal was read, then compacted into a state file before that was
    read, would leave the older line replayed over the newer file (a key deleted since
    would show again)."""
    for _ in range(HOOK_STATE_READS):
        before = _journal_stamp(hooks_dir)
        journal = read_journal(hooks_dir)
        hooks = {p.stem: _read(p) for p in sorted(hooks_dir.glob("*.json"))}
        if _journal_stamp(hooks_dir) == before:
            break
    apply_journal(journal, hooks)
    return hooks


def process_of(state_dir: Path) -> dict[str, int | None] | None:
    """`{"pid": N}` of the crihook that holds the state directory, `{"pid": None}` when none
    does; None when there is no lock file to ask (a crihook older than the lock)."""
    try:
        return {"pid": state_dir_holder(state_dir)}
    except OSError:
        return None


# status.json is rewritten every second while crihook runs: older than this, it is not.
STALE_SECONDS = 10.0


def liveness(
    status: dict[str, Any] | None,
    now: float | None = None,
    process: dict[str, int | None] | None = None,
) -> str | None:
    """Why crihook is not running, or None if it runs. `process` (process_of) decides when
    known; without it, the status file's age does."""
    now = time.time() if now is None else now
    status = status or {}
    stopped = status.get("stopped_at")
    updated = status.get("updated_at")
    if process is not None:
        if process["pid"] is not None:
            return None
        if stopped:
            return f"crihook is not running: it stopped at {_when(stopped)}"
        last = f"; its status was last written at {_when(updated)}" if updated else ""
        return f"crihook is not running: no process holds {LOCK_FILE}{last}"
    if status.get("running") is False and stopped:
        return f"crihook is not running: it stopped at {_when(stopped)}"
    if updated is not None and now - updated > STALE_SECONDS:
        return (
            f"crihook is not running: its status was last written at {_when(updated)} "
            "(it stopped without a clean shutdown, or hangs)"
        )
    return None


def _stale_but_running(
    status: dict[str, Any] | None, process: dict[str, int | None] | None, now: float
) -> str | None:
    """A running crihook whose status file is old or missing: it cannot write it."""
    if process is None or process["pid"] is None:
        return None
    pid = process["pid"]
    if not status:
        return f"crihook runs (pid {pid}) and has written no status file yet"
    updated = status.get("updated_at")
    if updated is not None and now - updated > STALE_SECONDS:
        return (
            f"crihook runs (pid {pid}), but its status file was last written at "
            f"{_when(updated)}: it cannot write its state directory (full?); what follows is "
            "what it last wrote"
        )
    return None


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def render_state(doc: dict[str, Any]) -> str:
    lines = []
    status = doc.get("status")
    process = doc.get("process")
    now = time.time()
    stale = _stale_but_running(status, process, now)
    if stale is not None:
        lines.append(stale)
    if status:
        down = liveness(status, now, process)
        if down is not None:
            lines.append(f"{down}; what follows is what it last knew")
        lines.append(
            f"crihook {status.get('version')}  ready={status.get('ready') and down is None}  "
            f"runtime={status.get('runtime')}  dry_run={status.get('dry_run')}"
        )
        lines += _store_health(status.get("store") or {})
        lines += _recording(status.get("recording"))
        for hook in status.get("hooks", []):
            counters = " ".join(f"{k}={v}" for k, v in sorted(hook.get("counters", {}).items()))
            connected = hook["connected"] and down is None
            lines.append(
                f"  hook {hook['name']} ({hook['kind']}, {hook['failure_policy']}, "
                f"breaker {hook['breaker']}, connected={connected}) {counters}"
            )
            for layer in hook.get("permissions", []):
                lines.append(f"    may set: {', '.join(layer) or 'nothing'}")
            failed = {what: n for what, n in sorted(hook.get("failures", {}).items()) if n}
            if failed:
                listed = ", ".join(f"{what} {n}" for what, n in failed.items())
                lines.append(f"    failed beside the calls (tried again): {listed}")
    containers_by_pod: dict[str, list[dict[str, Any]]] = {}
    for record in doc["containers"].values():
        containers_by_pod.setdefault(record["view"]["pod_id"], []).append(record)
    lines.append(f"pods: {len(doc['pods'])}  containers: {len(doc['containers'])}")
    for pod_id, record in sorted(doc["pods"].items(), key=lambda kv: kv[1]["view"]["name"]):
        view = record["view"]
        lines.append(
            f"pod {view['namespace']}/{view['name']} {pod_id[:13]} "
            f"qos={view['qos_class']} cgroup_parent={view['cgroup_parent']}"
        )
        lines += _owners(record.get("audit", {}), "    ")
        for c in sorted(containers_by_pod.get(pod_id, []), key=lambda r: r["view"]["name"]):
            lines.append(_container_line(c))
            lines += _owners(c.get("audit", {}), "      ")
            for err in c.get("update_errors", []):
                lines.append(
                    f"      update FAILED for {err['hook']}: {err['code']} {err['details']}"
                )
    for name, state in doc["hook_states"].items():
        lines.append(f"hook state {name}: {json.dumps(state, sort_keys=True)}")
    return "\n".join(lines)


def _container_line(record: dict[str, Any]) -> str:
    """A container as kubelet described it: name, id, its state as crihook last saw it, and
    kubelet's attempt (restart count). Its kind only where the pod says it (the
    crihook.io/init-containers annotations): kubelet tells the runtime nothing of it (no
    label or annotation of CreateContainer names init containers, v1.37)."""
    view = record["view"]
    line = f"  container {view['name']} {view['id'][:13]} {record.get('state', 'unknown')}"
    line += f" attempt={view.get('attempt', 0)}"
    if view.get("kind", "unknown") != "unknown":
        line += f" kind={view['kind']}"
    return line


def _store_health(store: dict[str, Any]) -> list[str]:
    """A line when writing the state fails or has failed (nothing when all is well)."""
    if store.get("degraded"):
        at = store.get("degraded_since")
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) if at else "?"
        return [
            f"  store DEGRADED since {since}: {store['degraded']} "
            f"({store.get('write_failures', 0)} failed writes; kept in memory, retrying)"
        ]
    if store.get("write_failures"):
        return [
            f"  store ok again after {store['write_failures']} failed writes "
            f"(last: {store.get('last_error')})"
        ]
    return []


def _recording(recording: dict[str, Any] | None) -> list[str]:
    """A line when crihook records (`--record`): where, how much, and what it lost."""
    if not recording:
        return []
    line = (
        f"  recording to {recording['file']}: {recording['lines']} lines, "
        f"{recording['bytes']} bytes, {recording['dropped']} lost"
    )
    if recording.get("backlog"):
        line += f", {recording['backlog']} waiting for the renderer"
    if recording.get("failing_since"):
        line += f"; FAILING: {recording.get('last_error')}"
    elif recording.get("write_failures"):
        line += f" (last failure: {recording.get('last_error')})"
    return [line]


def _owners(audit: dict[str, Any], indent: str) -> list[str]:
    lines = []
    for field, a in sorted(audit.items()):
        if "refused" in a:
            refused = ", ".join(a["refused"])
            lines.append(f"{indent}REFUSED {refused}  (asked by {a['hook']} at {a['event']})")
        else:
            lines.append(
                f"{indent}{field} = {json.dumps(a['value'])}  (set by {a['hook']} at {a['event']})"
            )
            if "runtime_made_it" in a:  # proxy.core.readback: changed after crihook
                lines.append(
                    f"{indent}  CHANGED after crihook: the runtime made it "
                    f"{json.dumps(a['runtime_made_it'])}"
                )
    return lines


def show_state(state_dir: Path, as_json: bool) -> int:
    if not state_dir.is_dir():
        print(
            f"crihook: no state in {state_dir} (has crihook run with --state-dir there?)",
            file=sys.stderr,
        )
        return 1
    doc = load_state(state_dir)
    if as_json:
        status, process = doc.get("status"), doc.get("process")
        # Tools read this instead of trusting a status file crihook no longer writes.
        known = status is not None or process is not None
        doc["running"] = known and liveness(status, process=process) is None
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(render_state(doc))
    return 0
