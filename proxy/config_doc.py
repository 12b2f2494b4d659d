"""The effective settings written back as a config document: what a recording's header keeps,
and what `crihook replay` reads back with `settings_from_toml` when no `--config` is given.

    settings_from_toml(settings_doc(settings)) == settings   (hook_tables aside)
    plugin_settings(plugin_docs(plugins)) == plugins          (the drop-ins' settings)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

from crihook.proxy.config import (
    ChainSettings,
    HookSettings,
    RecordSettings,
    Settings,
    parse_hook_name,
    parse_hook_settings,
)

__all__ = ["plugin_docs", "plugin_settings", "settings_doc"]

_HOOK_DEFAULTS = HookSettings(name="00-x")


def settings_doc(settings: Settings) -> dict[str, Any]:
    """Settings as the TOML document that gives them (plain JSON types)."""
    server, runtime, chain = settings.server, settings.runtime, settings.chain
    doc: dict[str, Any] = {
        "listen": server.listen,
        "runtime_endpoint": runtime.endpoint,
        "socket_mode": f"{server.socket_mode:04o}",
        "shutdown_grace_seconds": server.shutdown_grace_seconds,
        "max_message_bytes": server.max_message_bytes,
        "data_path": server.data_path,
        "runtime_startup_wait_max_seconds": runtime.startup_wait_max_seconds,
        "read_back": runtime.read_back,
        "reconcile_seconds": runtime.reconcile_seconds,
        "updates": runtime.updates,
        "state_dir": str(settings.state_dir),
        "plugins_dir": str(chain.plugins_dir),
        "log_format": settings.log_format,
        "log_level": settings.log_level,
        "dry_run": chain.dry_run,
        "hooks": _chain_doc(chain),
        "node": {
            "sysfs_root": str(settings.node.sysfs_root),
            "topology_policy": settings.node.topology_policy,
            "topology_scope": settings.node.topology_scope,
            "staging_dir": str(settings.node.staging_dir),
            "cgroup_root": str(settings.node.cgroup_root),
        },
        "record": _record_doc(settings.record),
    }
    if server.socket_group is not None:
        doc["socket_group"] = server.socket_group
    if server.metrics_listen is not None:
        doc["metrics_listen"] = server.metrics_listen
    if runtime.image_endpoint is not None:
        doc["image_endpoint"] = runtime.image_endpoint
    return doc


def _chain_doc(chain: ChainSettings) -> dict[str, Any]:
    table: dict[str, Any] = {
        "order": [h.name for h in chain.hooks],
        "conflict": chain.conflict,
        "exempt_namespaces": list(chain.exempt_namespaces),
        "exempt_labels": dict(chain.exempt_labels),
        "required_hooks": list(chain.required_hooks),
    }
    if chain.precedence:
        table["precedence"] = list(chain.precedence)
    for hook in chain.hooks:
        hook_table = _hook_doc(hook)
        if hook_table:
            table[hook.base_name] = hook_table
    return table


def plugin_docs(plugins: Sequence[HookSettings]) -> list[dict[str, Any]]:
    """Plugins' settings (their drop-ins'), as a recording keeps them: `name` and what is
    not a default."""
    return [{"name": p.name, **_hook_doc(p)} for p in plugins]


def plugin_settings(docs: Sequence[Mapping[str, Any]]) -> list[HookSettings]:
    """`plugin_docs` read back; ConfigError naming the plugin and the setting."""
    out = []
    for doc in docs:
        table = dict(doc)
        name = parse_hook_name("plugin name", table.pop("name", None))
        out.append(parse_hook_settings(f"plugin {name}", name, table))
    return out


def _hook_doc(hook: HookSettings) -> dict[str, Any]:
    doc: dict[str, Any] = {k: _plain(v) for k, v in hook.options.items()}
    for f in fields(HookSettings):
        if f.name in ("name", "options"):
            continue
        value = getattr(hook, f.name)
        if value != getattr(_HOOK_DEFAULTS, f.name):
            doc[f.name] = _plain(value)
    return doc


def _record_doc(record: RecordSettings) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "all": record.all,
        "secrets": record.secrets,
        "max_bytes": record.max_bytes,
        "keep": record.keep,
        "redact_annotations": list(record.redact_annotations),
        "redact_values": list(record.redact_values),
    }
    if record.file is not None:
        doc["file"] = str(record.file)
    return doc


def _plain(value: Any) -> Any:
    """Mappings, tuples and paths of settings as plain JSON values."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)
