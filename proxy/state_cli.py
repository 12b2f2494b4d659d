"""`crihook state`: pods, containers, who set which field, hook states, from the state dir."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from crihook.proxy.store import HOOKS_DIR, STATUS_FILE, STORE_FILE

__all__ = ["load_state", "render_state", "show_state"]


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def load_state(state_dir: Path) -> dict[str, Any]:
    store = _read(state_dir / STORE_FILE) or {"pods": {}, "containers": {}}
    hooks = {p.stem: _read(p) for p in sorted((state_dir / HOOKS_DIR).glob("*.json"))}
    return {
        "status": _read(state_dir / STATUS_FILE),
        "pods": store.get("pods", {}),
        "containers": store.get("containers", {}),
        "hook_states": hooks,
    }


def render_state(doc: dict[str, Any]) -> str:
    lines = []
    status = doc.get("status")
    if status:
        lines.append(
            f"crihook {status.get('version')}  ready={status.get('ready')}  "
            f"runtime={status.get('runtime')}  dry_run={status.get('dry_run')}"
        )
        lines += _store_health(status.get("store") or {})
        for hook in status.get("hooks", []):
            counters = " ".join(f"{k}={v}" for k, v in sorted(hook.get("counters", {}).items()))
            lines.append(
                f"  hook {hook['name']} ({hook['kind']}, {hook['failure_policy']}, "
                f"breaker {hook['breaker']}, connected={hook['connected']}) {counters}"
            )
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
            cview = c["view"]
            lines.append(f"  container {cview['name']} {cview['id'][:13]} kind={cview['kind']}")
            lines += _owners(c.get("audit", {}), "      ")
            for err in c.get("update_errors", []):
                lines.append(
                    f"      update FAILED for {err['hook']}: {err['code']} {err['details']}"
                )
    for name, state in doc["hook_states"].items():
        lines.append(f"hook state {name}: {json.dumps(state, sort_keys=True)}")
    return "\n".join(lines)


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


def _owners(audit: dict[str, Any], indent: str) -> list[str]:
    return [
        f"{indent}{field} = {json.dumps(a['value'])}  (set by {a['hook']} at {a['event']})"
        for field, a in sorted(audit.items())
    ]


def show_state(state_dir: Path, as_json: bool) -> int:
    if not state_dir.is_dir():
        print(
            f"crihook: no state in {state_dir} (has crihook run with --state-dir there?)",
            file=sys.stderr,
        )
        return 1
    doc = load_state(state_dir)
    print(json.dumps(doc, indent=2, sort_keys=True) if as_json else render_state(doc))
    return 0
