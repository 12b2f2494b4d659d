"""Settings: TOML file, validation naming the setting, flags over the file."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from crihook.hooks.builtin import BUILTIN_HOOKS
from crihook.proxy import config as config_module
from crihook.proxy.config import (
    ChainSettings,
    HookSettings,
    NodeSettings,
    RecordSettings,
    RuntimeSettings,
    ServerSettings,
    Settings,
    apply_flags,
    load_config,
    normalize_endpoint,
    settings_from_toml,
)
from crihook.proxy.errors import ConfigError


def get(settings: Settings, path: str) -> Any:
    value: Any = settings
    for part in path.split("."):
        value = getattr(value, part)
    return value


# --- defaults and the file -------------------------------------------------------------------


def test_defaults() -> None:
    settings = settings_from_toml({})
    assert settings == Settings()
    assert settings.server == ServerSettings(
        listen="unix:///run/crihook/crihook.sock",
        socket_mode=0o660,
        socket_group=None,
        shutdown_grace_seconds=10.0,
        max_message_bytes=24 * 1024 * 1024,
    )
    assert settings.runtime == RuntimeSettings(
        endpoint="unix:///run/containerd/containerd.sock",
        image_endpoint=None,
        startup_wait_max_seconds=5.0,
    )
    assert settings.chain == ChainSettings()
    assert settings.chain.hooks == ()
    assert (settings.chain.conflict, settings.chain.dry_run) == ("error", False)
    assert (settings.state_dir, settings.log_format, settings.log_level) == (
        Path("/var/lib/crihook"),
        "plain",
        "info",
    )
    assert settings.runtime.image_target == "unix:///run/containerd/containerd.sock"
    assert settings.server.socket_path == Path("/run/crihook/crihook.sock")


def test_absent_default_file_gives_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(config_module, "DEFAULT_CONFIG_PATH", tmp_path / "absent.toml")
    assert load_config(None) == Settings()


def test_absent_explicit_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "absent.toml")
    assert info.value.setting == "--config"


@pytest.mark.parametrize(
    "content",
    [b"listen = ", b"[hooks\n", b"\xff\xfe = 1"],
    ids=["no-value", "bad-table", "not-utf8"],
)
def test_invalid_toml_is_an_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "config.toml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.setting == "--config"
    assert "not valid TOML" in str(info.value)


def test_load_config_reads_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(
        'listen = "/run/x.sock"\n'
        'log_level = "debug"\n'
        "[hooks]\n"
        'order = ["10-annotate"]\n'
        "[hooks.annotate]\n"
        "timeout_ms = 250\n"
        'prefix = "example.com/"\n'
    )
    settings = load_config(path)
    assert settings.server.listen == "unix:///run/x.sock"
    assert settings.log_level == "debug"
    assert settings.chain.hooks == (
        HookSettings(name="10-annotate", timeout_ms=250, options={"prefix": "example.com/"}),
    )


def test_the_shipped_example_config_loads() -> None:
    example = Path(__file__).resolve().parents[2] / "deploy" / "config.toml"
    assert isinstance(load_config(example), Settings)


# --- every top-level key ---------------------------------------------------------------------

# (id, document, attribute path, expected value)
VALID_TOP = [
    ("listen-path", {"listen": "/run/x.sock"}, "server.listen", "unix:///run/x.sock"),
    ("listen-unix", {"listen": "unix:///run/x.sock"}, "server.listen", "unix:///run/x.sock"),
    (
        "runtime_endpoint",
        {"runtime_endpoint": "/run/c.sock"},
        "runtime.endpoint",
        "unix:///run/c.sock",
    ),
    (
        "image_endpoint",
        {"image_endpoint": "unix:///run/i.sock"},
        "runtime.image_target",
        "unix:///run/i.sock",
    ),
    ("socket_mode", {"socket_mode": "0600"}, "server.socket_mode", 0o600),
    ("socket_mode-3-digits", {"socket_mode": "660"}, "server.socket_mode", 0o660),
    ("socket_group-name", {"socket_group": "kube"}, "server.socket_group", "kube"),
    ("socket_group-id", {"socket_group": 1000}, "server.socket_group", "1000"),
    ("state_dir", {"state_dir": "/var/lib/x"}, "state_dir", Path("/var/lib/x")),
    ("plugins_dir", {"plugins_dir": "/etc/x.d"}, "chain.plugins_dir", Path("/etc/x.d")),
    ("log_format", {"log_format": "json"}, "log_format", "json"),
    (
        "metrics_listen-unix",
        {"metrics_listen": "unix:///run/crihook/metrics.sock"},
        "server.metrics_listen",
        "unix:///run/crihook/metrics.sock",
    ),
    (
        "metrics_listen-ipv4",
        {"metrics_listen": "127.0.0.1:9464"},
        "server.metrics_listen",
        "127.0.0.1:9464",
    ),
    (
        "metrics_listen-ipv6",
        {"metrics_listen": "[::1]:9464"},
        "server.metrics_listen",
        "[::1]:9464",
    ),
    (
        "metrics_listen-name",
        {"metrics_listen": "localhost:09464"},
        "server.metrics_listen",
        "localhost:9464",
    ),
    ("log_level-upper", {"log_level": "WARNING"}, "log_level", "warning"),
    ("dry_run", {"dry_run": True}, "chain.dry_run", True),
    (
        "shutdown_grace_seconds-float",
        {"shutdown_grace_seconds": 2.5},
        "server.shutdown_grace_seconds",
        2.5,
    ),
    (
        "shutdown_grace_seconds-int",
        {"shutdown_grace_seconds": 3},
        "server.shutdown_grace_seconds",
        3.0,
    ),
    (
        "runtime_startup_wait_max_seconds",
        {"runtime_startup_wait_max_seconds": 1},
        "runtime.startup_wait_max_seconds",
        1.0,
    ),
    ("reconcile_seconds", {"reconcile_seconds": 0.5}, "runtime.reconcile_seconds", 0.5),
    (
        "max_message_bytes",
        {"max_message_bytes": 32 * 1024 * 1024},
        "server.max_message_bytes",
        32 * 1024 * 1024,
    ),
    ("data_path", {"data_path": "grpc"}, "server.data_path", "grpc"),
    ("read_back", {"read_back": True}, "runtime.read_back", True),
    ("updates", {"updates": "before-answer"}, "runtime.updates", "before-answer"),
    ("hooks-empty", {"hooks": {}}, "chain", ChainSettings()),
    (
        "node",
        {"node": {"sysfs_root": "/fixtures/sys", "topology_policy": "restricted"}},
        "node",
        NodeSettings(sysfs_root=Path("/fixtures/sys"), topology_policy="restricted"),
    ),
    (
        "record",
        {
            "record": {
                "file": "/var/lib/crihook/record.jsonl",
                "all": True,
                "secrets": True,
                "max_bytes": 8 * 1024 * 1024,
                "keep": 5,
                "redact_annotations": ["*pin*"],
                "redact_values": ["sk-*"],
            }
        },
        "record",
        RecordSettings(
            file=Path("/var/lib/crihook/record.jsonl"),
            all=True,
            secrets=True,
            max_bytes=8 * 1024 * 1024,
            keep=5,
            redact_annotations=("*pin*",),
            redact_values=("sk-*",),
        ),
    ),
]


@pytest.mark.parametrize(
    ("doc", "path", "expected"), [c[1:] for c in VALID_TOP], ids=[c[0] for c in VALID_TOP]
)
def test_valid_top_level_settings(doc: dict[str, Any], path: str, expected: Any) -> None:
    assert get(settings_from_toml(doc), path) == expected


def test_every_top_level_key_is_covered() -> None:
    covered = {key for case in VALID_TOP for key in case[1]}
    assert covered == config_module._TOP_KEYS


# (id, document, the setting the error must name)
INVALID_TOP = [
    ("unknown-key", {"lisen": "/x.sock"}, "lisen"),
    ("listen-tcp", {"listen": "tcp://127.0.0.1:1234"}, "listen"),
    ("listen-int", {"listen": 5}, "listen"),
    ("listen-empty", {"listen": ""}, "listen"),
    ("runtime_endpoint-relative", {"runtime_endpoint": "run/c.sock"}, "runtime_endpoint"),
    ("image_endpoint-tcp", {"image_endpoint": "tcp://1.2.3.4:5"}, "image_endpoint"),
    ("socket_mode-int", {"socket_mode": 0o660}, "socket_mode"),
    ("socket_mode-python-octal", {"socket_mode": "0o660"}, "socket_mode"),
    ("socket_mode-not-octal", {"socket_mode": "0800"}, "socket_mode"),
    ("socket_group-bool", {"socket_group": True}, "socket_group"),
    ("socket_group-float", {"socket_group": 1.5}, "socket_group"),
    ("state_dir-relative", {"state_dir": "var/lib"}, "state_dir"),
    ("state_dir-int", {"state_dir": 5}, "state_dir"),
    ("plugins_dir-relative", {"plugins_dir": "hooks.d"}, "plugins_dir"),
    ("log_format", {"log_format": "xml"}, "log_format"),
    ("data_path", {"data_path": "grpc.aio"}, "data_path"),
    ("log_level", {"log_level": "trace"}, "log_level"),
    ("metrics_listen-port-only", {"metrics_listen": "9464"}, "metrics_listen"),
    ("metrics_listen-no-host", {"metrics_listen": ":9464"}, "metrics_listen"),
    ("metrics_listen-url", {"metrics_listen": "http://127.0.0.1:9464"}, "metrics_listen"),
    ("metrics_listen-bare-ipv6", {"metrics_listen": "::1:9464"}, "metrics_listen"),
    ("metrics_listen-port-too-big", {"metrics_listen": "127.0.0.1:65536"}, "metrics_listen"),
    ("metrics_listen-relative-unix", {"metrics_listen": "unix://m.sock"}, "metrics_listen"),
    ("metrics_listen-int", {"metrics_listen": 9464}, "metrics_listen"),
    ("metrics_listen-empty", {"metrics_listen": ""}, "metrics_listen"),
    ("dry_run-string", {"dry_run": "yes"}, "dry_run"),
    ("dry_run-int", {"dry_run": 1}, "dry_run"),
    ("shutdown_grace_seconds-zero", {"shutdown_grace_seconds": 0}, "shutdown_grace_seconds"),
    ("shutdown_grace_seconds-negative", {"shutdown_grace_seconds": -1}, "shutdown_grace_seconds"),
    ("shutdown_grace_seconds-string", {"shutdown_grace_seconds": "5"}, "shutdown_grace_seconds"),
    ("shutdown_grace_seconds-bool", {"shutdown_grace_seconds": True}, "shutdown_grace_seconds"),
    (
        "runtime_startup_wait-zero",
        {"runtime_startup_wait_max_seconds": 0},
        "runtime_startup_wait_max_seconds",
    ),
    ("reconcile_seconds-zero", {"reconcile_seconds": 0}, "reconcile_seconds"),
    ("updates-unknown", {"updates": "sync"}, "updates"),
    ("max_message_bytes-float", {"max_message_bytes": 1e7}, "max_message_bytes"),
    ("max_message_bytes-string", {"max_message_bytes": "16MiB"}, "max_message_bytes"),
    ("max_message_bytes-tiny", {"max_message_bytes": 16}, "max_message_bytes"),
    ("max_message_bytes-over-int32", {"max_message_bytes": 2**31}, "max_message_bytes"),
    ("hooks-not-a-table", {"hooks": "10-a"}, "[hooks]"),
]


@pytest.mark.parametrize(
    ("doc", "setting"), [c[1:] for c in INVALID_TOP], ids=[c[0] for c in INVALID_TOP]
)
def test_invalid_top_level_settings_name_the_setting(doc: dict[str, Any], setting: str) -> None:
    with pytest.raises(ConfigError) as info:
        settings_from_toml(doc)
    assert info.value.setting == setting
    assert str(info.value).startswith(f"{setting}: ")


# --- [hooks] -----------------------------------------------------------------------------------


def test_hooks_order_precedence_and_exemptions() -> None:
    settings = settings_from_toml(
        {
            "hooks": {
                "order": ["20-pin", "10-annotate"],
                "conflict": "precedence",
                "precedence": ["pin", "annotate"],
                "exempt_namespaces": ["kube-system"],
                "annotate": {"failure_policy": "ignore"},
            }
        }
    )
    chain = settings.chain
    assert [h.name for h in chain.hooks] == ["20-pin", "10-annotate"]
    assert chain.hooks[1].failure_policy == "ignore"
    assert chain.hooks[0] == HookSettings(name="20-pin")
    assert (chain.conflict, chain.precedence) == ("precedence", ("pin", "annotate"))
    assert chain.exempt_namespaces == ("kube-system",)
    assert (chain.hooks[0].index, chain.hooks[0].base_name) == (20, "pin")


def test_exempt_labels_table() -> None:
    settings = settings_from_toml(
        {"hooks": {"exempt_labels": {"crihook.io/skip": "true", "tier": "infra"}}}
    )
    assert dict(settings.chain.exempt_labels) == {"crihook.io/skip": "true", "tier": "infra"}


INVALID_HOOKS = [
    ("unknown-key", {"ordre": ["10-a"]}, "[hooks] ordre"),
    ("order-not-list", {"order": "10-a"}, "[hooks] order"),
    ("order-not-strings", {"order": [10]}, "[hooks] order"),
    ("order-no-number", {"order": ["a"]}, "[hooks] order"),
    ("order-one-digit", {"order": ["1-a"]}, "[hooks] order"),
    ("order-upper-case", {"order": ["10-A"]}, "[hooks] order"),
    ("order-base-twice", {"order": ["10-a", "20-a"]}, "[hooks] order"),
    ("order-builtin-twice", {"order": ["cpuset", "25-cpuset"]}, "[hooks] order"),
    ("order-unknown-bare-name", {"order": ["cpusett"]}, "[hooks] order"),
    ("conflict-unknown", {"conflict": "last-wins"}, "[hooks] conflict"),
    ("precedence-mode-without-list", {"conflict": "precedence"}, "[hooks] precedence"),
    ("precedence-not-strings", {"precedence": [1]}, "[hooks] precedence"),
    (
        "exempt_namespaces-not-list",
        {"exempt_namespaces": "kube-system"},
        "[hooks] exempt_namespaces",
    ),
    ("exempt_labels-not-strings", {"exempt_labels": {"tier": 1}}, "[hooks] exempt_labels"),
    ("table-for-unordered-hook", {"order": ["10-a"], "b": {"timeout_ms": 5}}, "[hooks.b]"),
]


@pytest.mark.parametrize(
    ("table", "setting"), [c[1:] for c in INVALID_HOOKS], ids=[c[0] for c in INVALID_HOOKS]
)
def test_invalid_hooks_settings_name_the_setting(table: dict[str, Any], setting: str) -> None:
    with pytest.raises(ConfigError) as info:
        settings_from_toml({"hooks": table})
    assert info.value.setting == setting


# --- per-hook tables ---------------------------------------------------------------------------


def hook_settings(table: dict[str, Any]) -> HookSettings:
    settings = settings_from_toml({"hooks": {"order": ["10-a"], "a": table}})
    (hook,) = settings.chain.hooks
    return hook


VALID_HOOK = [
    ("failure_policy", {"failure_policy": "ignore"}, "failure_policy", "ignore"),
    ("timeout_ms", {"timeout_ms": 250}, "timeout_ms", 250),
    ("dry_run", {"dry_run": True}, "dry_run", True),
    ("enabled", {"enabled": False}, "enabled", False),
    ("breaker_threshold", {"breaker_threshold": 3}, "breaker_threshold", 3),
    ("breaker_reset_seconds", {"breaker_reset_seconds": 0.5}, "breaker_reset_seconds", 0.5),
    ("module", {"module": "pkg.mod:Hook"}, "module", "pkg.mod:Hook"),
    ("endpoint", {"endpoint": "/run/p.sock"}, "endpoint", "unix:///run/p.sock"),
    (
        "allow",
        {"allow": ["cpuset_cpus", "annotation:example.com/*", "device:/dev/fuse"]},
        "allow",
        ("cpuset_cpus", "annotation:example.com/*", "device:/dev/fuse"),
    ),
]


@pytest.mark.parametrize(
    ("table", "attr", "expected"), [c[1:] for c in VALID_HOOK], ids=[c[0] for c in VALID_HOOK]
)
def test_valid_hook_settings(table: dict[str, Any], attr: str, expected: Any) -> None:
    hook = hook_settings(table)
    assert getattr(hook, attr) == expected
    assert dict(hook.options) == {}


def test_every_hook_key_is_covered() -> None:
    assert {key for case in VALID_HOOK for key in case[1]} == config_module.HOOK_KEYS


INVALID_HOOK = [
    ("failure_policy", {"failure_policy": "skip"}, "failure_policy"),
    ("timeout_ms-zero", {"timeout_ms": 0}, "timeout_ms"),
    ("timeout_ms-string", {"timeout_ms": "250"}, "timeout_ms"),
    ("timeout_ms-bool", {"timeout_ms": True}, "timeout_ms"),
    ("timeout_ms-below-one", {"timeout_ms": 0.5}, "timeout_ms"),
    ("dry_run-string", {"dry_run": "true"}, "dry_run"),
    ("enabled-int", {"enabled": 0}, "enabled"),
    ("breaker_threshold-zero", {"breaker_threshold": 0}, "breaker_threshold"),
    ("breaker_reset_seconds-zero", {"breaker_reset_seconds": 0}, "breaker_reset_seconds"),
    ("module-no-class", {"module": "pkg.mod"}, "module"),
    ("module-int", {"module": 5}, "module"),
    ("endpoint-tcp", {"endpoint": "tcp://1.2.3.4:5"}, "endpoint"),
    ("allow-not-a-list", {"allow": "cpuset_cpus"}, "allow"),
    ("allow-unknown-field", {"allow": ["cpusets"]}, "allow"),
    ("allow-narrowing-a-scalar", {"allow": ["cpuset_cpus:0-3"]}, "allow"),
    ("allow-empty-pattern", {"allow": ["annotation:"]}, "allow"),
]


@pytest.mark.parametrize(
    ("table", "key"), [c[1:] for c in INVALID_HOOK], ids=[c[0] for c in INVALID_HOOK]
)
def test_invalid_hook_settings_name_hook_and_key(table: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        hook_settings(table)
    assert info.value.setting == f"[hooks.a] {key}"


def test_unknown_hook_keys_become_options() -> None:
    hook = hook_settings(
        {"timeout_ms": 5, "cpus": "0-3", "nested": {"x": 1}, "list": [1, 2], "flag": True}
    )
    assert hook.timeout_ms == 5
    assert dict(hook.options) == {"cpus": "0-3", "nested": {"x": 1}, "list": [1, 2], "flag": True}
    with pytest.raises(TypeError):
        hook.options["cpus"] = "x"  # type: ignore[index]


def test_hook_without_table_gets_defaults() -> None:
    settings = settings_from_toml({"hooks": {"order": ["10-a"]}})
    assert settings.chain.hooks == (HookSettings(name="10-a"),)


# --- flags -------------------------------------------------------------------------------------

FILE = {
    "listen": "/run/file.sock",
    "runtime_endpoint": "/run/file-c.sock",
    "log_level": "info",
    "dry_run": True,
    "hooks": {
        "order": ["10-a", "20-c"],
        "a": {"timeout_ms": 5, "failure_policy": "ignore", "k": "v"},
    },
}


def test_hooks_none_empties_the_chain() -> None:
    settings = apply_flags(settings_from_toml(FILE), {"hooks": "none"})
    assert settings.chain.hooks == ()


def test_hooks_flag_keeps_configured_settings() -> None:
    settings = apply_flags(settings_from_toml(FILE), {"hooks": "10-a, 20-b"})
    a, b = settings.chain.hooks
    assert a == HookSettings(name="10-a", timeout_ms=5, failure_policy="ignore", options={"k": "v"})
    assert b == HookSettings(name="20-b")


def test_hooks_flag_may_reorder_a_configured_hook() -> None:
    settings = apply_flags(settings_from_toml(FILE), {"hooks": "30-a"})
    (a,) = settings.chain.hooks
    assert (a.name, a.timeout_ms, a.failure_policy) == ("30-a", 5, "ignore")


def test_builtin_names_take_their_default_positions() -> None:
    settings = apply_flags(Settings(), {"hooks": "oom,cpuset,numa"})
    assert [h.name for h in settings.chain.hooks] == ["40-oom", "20-cpuset", "30-numa"]
    settings = settings_from_toml({"hooks": {"order": ["cpuset", "15-oom"], "oom": {"x": 1}}})
    assert [h.name for h in settings.chain.hooks] == ["20-cpuset", "15-oom"]
    assert settings.chain.hooks[1].options == {"x": 1}


def test_hook_tables_serve_a_chain_named_by_the_flag() -> None:
    doc = {"hooks": {"cpuset": {"reserved_cpus": "0-1", "timeout_ms": 50}}}
    settings = apply_flags(settings_from_toml(doc), {"hooks": "cpuset,oom"})
    cpuset, oom = settings.chain.hooks
    assert (cpuset.name, cpuset.timeout_ms, dict(cpuset.options)) == (
        "20-cpuset",
        50,
        {"reserved_cpus": "0-1"},
    )
    assert oom == HookSettings(name="40-oom")
    with pytest.raises(ConfigError) as info:
        apply_flags(settings_from_toml(doc), {"hooks": "oom"})
    assert info.value.setting == "[hooks.cpuset]"


def test_required_hooks_are_base_names() -> None:
    settings = settings_from_toml({"hooks": {"required_hooks": ["cpuset", "50-guard"]}})
    assert settings.chain.required_hooks == ("cpuset", "guard")
    with pytest.raises(ConfigError) as info:
        settings_from_toml({"hooks": {"required_hooks": ["Not A Hook"]}})
    assert info.value.setting == "[hooks] required_hooks"


def test_builtin_positions_are_distinct() -> None:
    positions = [h.position for h in BUILTIN_HOOKS.values()]
    assert len(set(positions)) == len(positions)


@pytest.mark.parametrize(
    ("table", "setting"),
    [
        ({"topology_policy": "strict"}, "[node] topology_policy"),
        ({"topology_scope": "node"}, "[node] topology_scope"),
        ({"sysfs_root": "sys"}, "[node] sysfs_root"),
        ({"sysfs": "/sys"}, "[node] sysfs"),
    ],
    ids=["policy", "scope", "relative-root", "unknown-key"],
)
def test_invalid_node_settings_name_the_setting(table: dict[str, Any], setting: str) -> None:
    with pytest.raises(ConfigError) as info:
        settings_from_toml({"node": table})
    assert info.value.setting == setting


@pytest.mark.parametrize(
    ("table", "setting"),
    [
        ({"file": "rec.jsonl"}, "[record] file"),
        ({"all": "yes"}, "[record] all"),
        ({"secrets": 1}, "[record] secrets"),
        ({"max_bytes": 1000}, "[record] max_bytes"),
        ({"keep": 0}, "[record] keep"),
        ({"redact_annotations": "*pw*"}, "[record] redact_annotations"),
        ({"redact_values": [1]}, "[record] redact_values"),
        ({"path": "/x"}, "[record] path"),
    ],
    ids=[
        "relative-file",
        "all",
        "secrets",
        "tiny-max",
        "keep-none",
        "name-patterns",
        "value-patterns",
        "unknown-key",
    ],
)
def test_invalid_record_settings_name_the_setting(table: dict[str, Any], setting: str) -> None:
    with pytest.raises(ConfigError) as info:
        settings_from_toml({"record": table})
    assert info.value.setting == setting


def test_record_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    settings = apply_flags(
        Settings(), {"record": "calls.jsonl", "record_all": True, "record_secrets": True}
    )
    assert settings.record.file == tmp_path / "calls.jsonl"  # relative to where crihook runs
    assert settings.record.all and settings.record.secrets
    assert apply_flags(Settings(), {}).record == RecordSettings()


def test_sysfs_root_flag() -> None:
    settings = apply_flags(Settings(), {"sysfs_root": "/fixtures/epyc"})
    assert settings.node.sysfs_root == Path("/fixtures/epyc")
    with pytest.raises(ConfigError) as info:
        apply_flags(Settings(), {"sysfs_root": "epyc"})
    assert info.value.setting == "--sysfs-root"


@pytest.mark.parametrize(
    "value", ["10-a,20-a", "a", "10-a,,B"], ids=["twice", "no-number", "upper-case"]
)
def test_bad_hooks_flag(value: str) -> None:
    with pytest.raises(ConfigError) as info:
        apply_flags(settings_from_toml(FILE), {"hooks": value})
    assert info.value.setting == "--hooks"


def test_flags_override_the_file() -> None:
    settings = apply_flags(
        settings_from_toml(FILE),
        {
            "listen": "/run/flag.sock",
            "runtime_endpoint": "unix:///run/flag-c.sock",
            "image_endpoint": "/run/flag-i.sock",
            "plugins_dir": "/etc/flag.d",
            "state_dir": "/var/lib/flag",
            "log_format": "json",
            "log_level": "DEBUG",
            "max_message_bytes": 16 * 1024 * 1024,
            "metrics_listen": "[::]:9464",
            "updates": "before-answer",
        },
    )
    assert settings.server.listen == "unix:///run/flag.sock"
    assert settings.runtime.updates == "before-answer"
    assert settings.runtime.endpoint == "unix:///run/flag-c.sock"
    assert settings.runtime.image_endpoint == "unix:///run/flag-i.sock"
    assert settings.chain.plugins_dir == Path("/etc/flag.d")
    assert settings.state_dir == Path("/var/lib/flag")
    assert (settings.log_format, settings.log_level) == ("json", "debug")
    assert settings.server.max_message_bytes == 16 * 1024 * 1024
    assert settings.server.metrics_listen == "[::]:9464"
    # What no flag named stays as the file said.
    assert settings.chain.dry_run is True
    assert [h.name for h in settings.chain.hooks] == ["10-a", "20-c"]


def test_absent_flags_change_nothing() -> None:
    base = settings_from_toml(FILE)
    flags = {
        "listen": None,
        "runtime_endpoint": None,
        "image_endpoint": None,
        "hooks": None,
        "plugins_dir": None,
        "dry_run": False,
        "state_dir": None,
        "log_format": None,
        "log_level": None,
        "max_message_bytes": None,
        "metrics_listen": None,
    }
    assert apply_flags(base, flags) == base
    assert apply_flags(base, {}) == base


def test_dry_run_flag_turns_dry_run_on() -> None:
    base = replace(Settings(), chain=ChainSettings(dry_run=False))
    assert apply_flags(base, {"dry_run": True}).chain.dry_run is True


@pytest.mark.parametrize(
    ("flags", "setting"),
    [
        ({"listen": "tcp://x:1"}, "--listen"),
        ({"runtime_endpoint": "rel.sock"}, "--runtime-endpoint"),
        ({"image_endpoint": ""}, "--image-endpoint"),
        ({"plugins_dir": "rel"}, "--plugins-dir"),
        ({"state_dir": "rel"}, "--state-dir"),
        ({"log_format": "xml"}, "--log-format"),
        ({"log_level": "trace"}, "--log-level"),
        ({"max_message_bytes": 1000}, "--max-message-bytes"),
        ({"metrics_listen": "9464"}, "--metrics-listen"),
        ({"updates": "later"}, "--updates"),
    ],
    ids=[
        "listen",
        "runtime",
        "image",
        "plugins-dir",
        "state-dir",
        "log-format",
        "log-level",
        "max-message-bytes",
        "metrics-listen",
        "updates",
    ],
)
def test_bad_flags_name_the_flag(flags: dict[str, Any], setting: str) -> None:
    with pytest.raises(ConfigError) as info:
        apply_flags(Settings(), flags)
    assert info.value.setting == setting


# --- endpoints -------------------------------------------------------------------------------

LONGEST = "/" + "s" * 106  # 107 bytes: the most sun_path can hold with its NUL
ENDPOINT_OK = [
    ("path", "/x.sock", "unix:///x.sock"),
    ("unix-url", "unix:///x.sock", "unix:///x.sock"),
    ("longest-path", LONGEST, "unix://" + LONGEST),
    ("longest-url", "unix://" + LONGEST, "unix://" + LONGEST),
]


@pytest.mark.parametrize(
    ("value", "expected"), [c[1:] for c in ENDPOINT_OK], ids=[c[0] for c in ENDPOINT_OK]
)
def test_endpoint_normalization(value: str, expected: str) -> None:
    assert normalize_endpoint("listen", value) == expected


ENDPOINT_BAD = [
    ("tcp", "tcp://127.0.0.1:1234"),
    ("relative", "unix://run/x.sock"),
    ("bare-relative", "x.sock"),
    ("empty", ""),
    ("none", None),
    ("too-long", LONGEST + "s"),
    ("too-long-in-bytes", "/" + "é" * 54),  # 109 bytes, 55 characters
]


@pytest.mark.parametrize("value", [c[1] for c in ENDPOINT_BAD], ids=[c[0] for c in ENDPOINT_BAD])
def test_endpoint_rejected(value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        normalize_endpoint("runtime_endpoint", value)
    assert info.value.setting == "runtime_endpoint"
