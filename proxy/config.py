"""Settings: loaded once at start from the TOML file, overridden by flags, validated, frozen.

Every setting has a documented default here; `deploy/config.toml` is the annotated example.
A bad value raises ConfigError naming the setting (`[hooks.annotate] timeout_ms: ...`), which
the CLI prints as one line before exiting 2.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from crihook.hooks.builtin import BUILTIN_HOOKS
from crihook.proxy.errors import ConfigError

__all__ = [
    "DEFAULT_CONFIG_PATH",
    "ChainSettings",
    "HookSettings",
    "NodeSettings",
    "RecordSettings",
    "RuntimeSettings",
    "ServerSettings",
    "Settings",
    "expand_hook_name",
    "load_config",
    "metrics_address",
    "normalize_endpoint",
    "parse_hook_name",
]

DEFAULT_CONFIG_PATH = Path("/etc/crihook/config.toml")
DEFAULT_LISTEN = "unix:///run/crihook/crihook.sock"
DEFAULT_RUNTIME = "unix:///run/containerd/containerd.sock"
DEFAULT_STATE_DIR = Path("/var/lib/crihook")
DEFAULT_PLUGINS_DIR = Path("/etc/crihook/hooks.d")
DEFAULT_MAX_MESSAGE_BYTES = 24 * 1024 * 1024
MIN_MAX_MESSAGE_BYTES = 1024 * 1024  # less is likelier a typo (MiB meant) than a limit
MAX_MAX_MESSAGE_BYTES = 2**31 - 1  # grpc's limit is a signed 32-bit number
LOG_FORMATS = ("plain", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
FAILURE_POLICIES = ("fail", "ignore")
TOPOLOGY_POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
TOPOLOGY_SCOPES = ("container", "pod")
DEFAULT_SYSFS_ROOT = Path("/sys")
DEFAULT_STAGING_DIR = Path("/run/crihook/mounts")
DEFAULT_CGROUP_ROOT = Path("/sys/fs/cgroup")
CONFLICT_MODES = ("error", "precedence")
DATA_PATHS = ("grpc", "h2")
UPDATE_MODES = ("after-answer", "before-answer")
"""`updates`: the updates to other containers go out after kubelet's answer, or before."""

_HOOK_NAME = re.compile(r"^(\d{2})-([a-z0-9][a-z0-9_.-]*)$")
_MAX_UNIX_PATH = 107


@dataclass(frozen=True)
class ServerSettings:
    listen: str = DEFAULT_LISTEN
    """Where kubelet connects: `unix:///path`."""
    socket_mode: int = 0o660
    """Permission bits of the listen socket."""
    socket_group: str | None = None
    """Group owning the listen socket (name or number); None keeps root's."""
    shutdown_grace_seconds: float = 10.0
    """On SIGTERM, how long calls in flight may take before they are cancelled."""
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    """The largest request crihook accepts from kubelet (a bigger one gets RESOURCE_EXHAUSTED
    and is not forwarded): kubelet's own 16 MiB limit plus headroom. Answers from the runtime
    are not limited (kubelet applies its own limit to them)."""
    metrics_listen: str | None = None
    """Where Prometheus metrics are served (`GET /metrics`): `unix:///path` or `HOST:PORT`
    (`127.0.0.1:9464`, `[::1]:9464`, `0.0.0.0:9464`); None: no metrics."""
    data_path: str = "h2"
    """How calls cross crihook: `h2` (crihook speaks HTTP/2 itself, api/h2: pass-through
    calls relayed as frames) or `grpc` (grpc.aio's server and channels, the default before
    `h2` passed the whole suite and the soak; kept as a fallback)."""

    @property
    def socket_path(self) -> Path:
        return Path(self.listen.removeprefix("unix://"))


@dataclass(frozen=True)
class RuntimeSettings:
    endpoint: str = DEFAULT_RUNTIME
    """containerd's CRI socket."""
    image_endpoint: str | None = None
    """A separate image service (kubelet's --image-service-endpoint); None: the runtime's."""
    startup_wait_max_seconds: float = 5.0
    """Cap of the backoff between probes while waiting for the runtime at start."""
    read_back: bool = False
    """After each CreateContainer a hook adjusted, read the container back (verbose
    ContainerStatus) and report each field a hook set that the runtime made otherwise (an
    NRI plugin after crihook, the runtime's own rules)."""
    reconcile_seconds: float = 10.0
    """How often the runtime is listed for pods and containers removed without crihook
    (kubelet's CPU manager reconciles every 10 s too)."""
    updates: str = "after-answer"
    """When the updates hooks ask for to other containers (a shared pool shrunk by an
    exclusive CPU) go out: `after-answer` (in the background, once kubelet has its answer)
    or `before-answer` (the call waits for them)."""

    @property
    def image_target(self) -> str:
        return self.image_endpoint or self.endpoint


@dataclass(frozen=True)
class HookSettings:
    """Settings of one hook in the chain (in-process or out-of-process)."""

    name: str
    """`NN-name`: NN (two digits) orders the chain, the name breaks ties."""
    failure_policy: str = "fail"
    """`fail`: the CRI call fails naming the hook; `ignore`: go on without its adjustment."""
    timeout_ms: int = 1000
    """Per call; also bounded by kubelet's remaining deadline."""
    dry_run: bool = False
    """Compute and log this hook's adjustment, apply nothing."""
    enabled: bool = True
    breaker_threshold: int = 5
    """Consecutive failures after which the hook is skipped (circuit open)."""
    breaker_reset_seconds: float = 30.0
    """How long an open circuit waits before one probe call is let through."""
    module: str | None = None
    """In-process hook: `package.module:Class` (built-ins need none)."""
    endpoint: str | None = None
    """Out-of-process plugin: `unix:///path` of its socket."""
    allow: tuple[str, ...] | None = None
    """What the hook may set (`cpuset_cpus`, `annotation:example.com/*`, `device:/dev/fuse`);
    None: what it declares, or labels, annotations and container resources."""
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    """Hook-specific settings, handed to the hook as they are."""

    @property
    def index(self) -> int:
        return int(self.name[:2])

    @property
    def base_name(self) -> str:
        return self.name[3:]


@dataclass(frozen=True)
class ChainSettings:
    hooks: tuple[HookSettings, ...] = ()
    """The configured in-process chain, in order."""
    conflict: str = "error"
    """`error`: two hooks setting one field fail the call; `precedence`: see below."""
    precedence: tuple[str, ...] = ()
    """With conflict = "precedence": hook base names, earlier wins a contested field."""
    exempt_namespaces: tuple[str, ...] = ()
    """Pods in these namespaces bypass every hook (a plugin's own pods, system pods)."""
    exempt_labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Pods carrying any of these label=value pairs bypass every hook."""
    plugins_dir: Path = DEFAULT_PLUGINS_DIR
    """Drop-in directory of out-of-process plugins, one TOML file each."""
    dry_run: bool = False
    """Global dry-run: every hook computes and logs, nothing is applied."""
    required_hooks: tuple[str, ...] = ()
    """Hooks (names) that must run successfully for every call they handle, whatever their
    failure policy, also for exempt pods; pods add their own with `hooks.crihook.io/required`."""
    hook_tables: Mapping[str, Mapping[str, Any]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    """`[hooks.<name>]` tables by hook name, for a chain named by `--hooks`."""


@dataclass(frozen=True)
class NodeSettings:
    """What crihook knows of the node, for the resource hooks (`[node]`)."""

    sysfs_root: Path = DEFAULT_SYSFS_ROOT
    """Where the node's topology is read (`<root>/devices/system/{cpu,node}`); another tree
    lets tests, benchmarks and replays run on the topology of a machine this one is not."""
    topology_policy: str = "none"
    """How the NUMA hints of the resource hooks are merged, as kubelet's topology manager
    does: none | best-effort | restricted | single-numa-node."""
    topology_scope: str = "container"
    """`container`: each container is placed on its own; `pod`: a pod with pod-level
    resources gets one NUMA-aligned bubble at RunPodSandbox, its containers share it."""
    staging_dir: Path = DEFAULT_STAGING_DIR
    """Where the `devices` hook pins the host paths and device nodes it checked (bind mounts
    and nodes the runtime is given instead of the pod's paths). Root's alone; mounts made
    there must reach the runtime's mount namespace (a DaemonSet: Bidirectional)."""
    cgroup_root: Path = DEFAULT_CGROUP_ROOT
    """Where the cgroup file system is (pods' and QoS cgroups written by hooks, containers'
    processes found); another tree lets tests and benchmarks run on a fake one."""


DEFAULT_REDACT_ANNOTATIONS = (
    "*password*",
    "*passwd*",
    "*secret*",
    "*token*",
    "*credential*",
    "*apikey*",
    "*api-key*",
    "*private*key*",
)
DEFAULT_REDACT_VALUES = ("-----BEGIN*", "eyJ*.*.*")
"""PEM blocks (keys, certificates) and JSON web tokens."""


@dataclass(frozen=True)
class RecordSettings:
    """Recording of the intercepted CRI traffic (`[record]`, `crihook serve --record FILE`)."""

    file: Path | None = None
    """Where calls are appended, one JSON line each; None: no recording."""
    all: bool = False
    """Pass-through (unary) calls too, not only the intercepted ones."""
    secrets: bool = False
    """Keep env values and secret-looking annotations; by default they are redacted."""
    max_bytes: int = 64 * 1024 * 1024
    """When the file grows past this, it is rotated (FILE → FILE.1 → FILE.2 ...)."""
    keep: int = 3
    """Rotated files kept besides FILE."""
    redact_annotations: tuple[str, ...] = DEFAULT_REDACT_ANNOTATIONS
    """Globs (case-insensitive) on annotation names: the value of an annotation whose name
    matches one is replaced by `<redacted>` (unless `secrets`)."""
    redact_values: tuple[str, ...] = DEFAULT_REDACT_VALUES
    """Globs (case-insensitive) on annotation values: a value that matches one is replaced
    too, whatever the annotation's name. (Values hooks read, such as the devices hook's JSON,
    must not match: a replay would see `<redacted>` instead.)"""


@dataclass(frozen=True)
class Settings:
    server: ServerSettings = ServerSettings()
    runtime: RuntimeSettings = RuntimeSettings()
    chain: ChainSettings = ChainSettings()
    node: NodeSettings = NodeSettings()
    record: RecordSettings = RecordSettings()
    state_dir: Path = DEFAULT_STATE_DIR
    log_format: str = "plain"
    log_level: str = "info"


def normalize_endpoint(setting: str, value: object) -> str:
    """`unix:///p` or `/p` → `unix:///p`; anything else is a ConfigError."""
    if not isinstance(value, str) or not value:
        raise ConfigError(setting, "must be a non-empty string like unix:///run/x.sock")
    path = value.removeprefix("unix://")
    if not path.startswith("/"):
        raise ConfigError(setting, f"{value!r} is not an absolute unix socket (unix:///path)")
    if len(path.encode()) > _MAX_UNIX_PATH:
        raise ConfigError(setting, f"socket path is longer than {_MAX_UNIX_PATH} bytes")
    return "unix://" + path


def metrics_address(setting: str, value: object) -> str:
    """`unix:///path` or `HOST:PORT` (an IPv6 host in brackets); anything else is a
    ConfigError naming the setting."""
    if not isinstance(value, str) or not value:
        raise ConfigError(setting, "must be unix:///path or HOST:PORT, like 127.0.0.1:9464")
    if value.startswith("unix:"):
        return normalize_endpoint(setting, value)
    host, sep, port = value.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    if (
        not sep
        or not host
        or "/" in value
        or (":" in host and not bracketed)
        or not port.isdigit()
        or int(port) > 65535
    ):
        raise ConfigError(
            setting,
            f"{value!r} is neither unix:///path nor HOST:PORT (127.0.0.1:9464, [::1]:9464)",
        )
    return f"{host}:{int(port)}"


def parse_hook_name(setting: str, name: object) -> str:
    if not isinstance(name, str) or not _HOOK_NAME.match(name):
        raise ConfigError(setting, f"{name!r} is not NN-name (two digits, dash, lower-case name)")
    return name


def _base_hook_name(setting: str, name: str) -> str:
    """`cpuset` or `20-cpuset` → `cpuset`."""
    base = name[3:] if _HOOK_NAME.match(name) else name
    if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", base):
        raise ConfigError(setting, f"{name!r} is not a hook name")
    return base


def expand_hook_name(setting: str, name: object) -> str:
    """`NN-name`, or a built-in hook's bare name at its default position (`cpuset` is
    `20-cpuset`)."""
    if isinstance(name, str) and name in BUILTIN_HOOKS:
        return f"{BUILTIN_HOOKS[name].position:02d}-{name}"
    if isinstance(name, str) and _HOOK_NAME.match(name):
        return name
    builtin = ", ".join(sorted(BUILTIN_HOOKS))
    raise ConfigError(
        setting,
        f"{name!r} is neither NN-name (two digits, dash, lower-case name) "
        f"nor a built-in hook ({builtin})",
    )


# --- TOML → Settings -----------------------------------------------------------------------

_TOP_KEYS = {
    "listen",
    "read_back",
    "runtime_endpoint",
    "image_endpoint",
    "socket_mode",
    "socket_group",
    "state_dir",
    "plugins_dir",
    "log_format",
    "log_level",
    "metrics_listen",
    "dry_run",
    "shutdown_grace_seconds",
    "max_message_bytes",
    "data_path",
    "runtime_startup_wait_max_seconds",
    "reconcile_seconds",
    "updates",
    "hooks",
    "node",
    "record",
}
_NODE_KEYS = {"sysfs_root", "topology_policy", "topology_scope", "staging_dir", "cgroup_root"}
_RECORD_KEYS = {
    "file",
    "all",
    "secrets",
    "max_bytes",
    "keep",
    "redact_annotations",
    "redact_values",
}
_CHAIN_KEYS = {
    "order",
    "conflict",
    "precedence",
    "exempt_namespaces",
    "exempt_labels",
    "required_hooks",
}
HOOK_KEYS = {
    "failure_policy",
    "timeout_ms",
    "dry_run",
    "enabled",
    "breaker_threshold",
    "breaker_reset_seconds",
    "module",
    "endpoint",
    "allow",
}


def _typed(setting: str, value: object, kind: type | tuple[type, ...], what: str) -> Any:
    # bool is an int in Python; never accept it where a number is meant.
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise ConfigError(setting, f"must be {what}, not {value!r}")
    if not isinstance(value, kind):
        raise ConfigError(setting, f"must be {what}, not {value!r}")
    return value


def _choice(setting: str, value: object, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ConfigError(setting, f"must be one of {', '.join(choices)}, not {value!r}")
    return str(value)


def _positive(setting: str, value: object) -> float:
    number = _typed(setting, value, (int, float), "a number")
    if number <= 0:
        raise ConfigError(setting, f"must be > 0, not {number!r}")
    return float(number)


def _count(setting: str, value: object) -> int:
    number = _typed(setting, value, int, "a whole number")
    if number < 1:
        raise ConfigError(setting, f"must be >= 1, not {number!r}")
    return int(number)


def _message_size(setting: str, value: object) -> int:
    number = _typed(setting, value, int, "a whole number of bytes")
    if not MIN_MAX_MESSAGE_BYTES <= number <= MAX_MAX_MESSAGE_BYTES:
        raise ConfigError(
            setting,
            f"must be between {MIN_MAX_MESSAGE_BYTES} and {MAX_MAX_MESSAGE_BYTES} bytes, "
            f"not {number!r}",
        )
    return int(number)


def _str_list(setting: str, value: object) -> tuple[str, ...]:
    items = _typed(setting, value, list, "a list of strings")
    for item in items:
        _typed(setting, item, str, "a list of strings")
    return tuple(items)


def _socket_mode(setting: str, value: object) -> int:
    if isinstance(value, str) and re.fullmatch(r"0?[0-7]{3}", value):
        return int(value, 8)
    raise ConfigError(setting, f'must be an octal string like "0660", not {value!r}')


def parse_hook_settings(section: str, name: str, table: Mapping[str, Any]) -> HookSettings:
    """One hook's settings from its table; unknown keys are hook options."""
    known = {k: v for k, v in table.items() if k in HOOK_KEYS}
    options = {k: v for k, v in table.items() if k not in HOOK_KEYS}
    kw: dict[str, Any] = {"name": name, "options": MappingProxyType(options)}
    if "failure_policy" in known:
        kw["failure_policy"] = _choice(
            f"{section} failure_policy", known["failure_policy"], FAILURE_POLICIES
        )
    if "timeout_ms" in known:
        kw["timeout_ms"] = _count(f"{section} timeout_ms", known["timeout_ms"])
    for flag in ("dry_run", "enabled"):
        if flag in known:
            kw[flag] = _typed(f"{section} {flag}", known[flag], bool, "true or false")
    if "breaker_threshold" in known:
        kw["breaker_threshold"] = _count(f"{section} breaker_threshold", known["breaker_threshold"])
    if "breaker_reset_seconds" in known:
        kw["breaker_reset_seconds"] = _positive(
            f"{section} breaker_reset_seconds", known["breaker_reset_seconds"]
        )
    if "module" in known:
        module = _typed(f"{section} module", known["module"], str, "'package.module:Class'")
        if ":" not in module:
            raise ConfigError(f"{section} module", f"{module!r} is not 'package.module:Class'")
        kw["module"] = module
    if "endpoint" in known:
        kw["endpoint"] = normalize_endpoint(f"{section} endpoint", known["endpoint"])
    if "allow" in known:
        allow = _str_list(f"{section} allow", known["allow"])
        # Imported only then: hooks.spec is not needed to read the settings and listen.
        from crihook.proxy.grants import parse_grants

        try:
            parse_grants(allow, f"{section} allow")
        except ValueError as exc:
            raise ConfigError(f"{section} allow", str(exc).split(": ", 1)[-1]) from None
        kw["allow"] = allow
    return HookSettings(**kw)


def _chain_settings(doc: Mapping[str, Any]) -> dict[str, Any]:
    table = _typed("[hooks]", doc.get("hooks", {}), dict, "a table")
    per_hook = {k: v for k, v in table.items() if isinstance(v, dict) and k not in _CHAIN_KEYS}
    for key in table:
        if key not in _CHAIN_KEYS and key not in per_hook:
            raise ConfigError(f"[hooks] {key}", "unknown setting")
    order = [
        expand_hook_name("[hooks] order", n)
        for n in _str_list("[hooks] order", table.get("order", []))
    ]
    if len({n[3:] for n in order}) != len(order):
        raise ConfigError("[hooks] order", "a hook name appears twice")
    hooks = []
    for name in order:
        base = name[3:]
        hooks.append(parse_hook_settings(f"[hooks.{base}]", name, per_hook.get(base, {})))
    if order:
        for base in per_hook:
            if base not in {n[3:] for n in order}:
                raise ConfigError(
                    f"[hooks.{base}]", "settings for a hook that is not in [hooks] order"
                )
    out: dict[str, Any] = {
        "hooks": tuple(hooks),
        "hook_tables": MappingProxyType({k: MappingProxyType(v) for k, v in per_hook.items()}),
    }
    if "conflict" in table:
        out["conflict"] = _choice("[hooks] conflict", table["conflict"], CONFLICT_MODES)
    if "precedence" in table:
        out["precedence"] = _str_list("[hooks] precedence", table["precedence"])
    if out.get("conflict") == "precedence" and not out.get("precedence"):
        raise ConfigError("[hooks] precedence", 'conflict = "precedence" needs a list of hooks')
    if "exempt_namespaces" in table:
        out["exempt_namespaces"] = _str_list(
            "[hooks] exempt_namespaces", table["exempt_namespaces"]
        )
    if "required_hooks" in table:
        out["required_hooks"] = tuple(
            _base_hook_name("[hooks] required_hooks", n)
            for n in _str_list("[hooks] required_hooks", table["required_hooks"])
        )
    if "exempt_labels" in table:
        labels = _typed("[hooks] exempt_labels", table["exempt_labels"], dict, "a table")
        for value in labels.values():
            _typed("[hooks] exempt_labels", value, str, "a table of strings")
        out["exempt_labels"] = MappingProxyType(dict(labels))
    return out


def _node_settings(doc: Mapping[str, Any]) -> NodeSettings:
    table = _typed("[node]", doc.get("node", {}), dict, "a table")
    for key in table:
        if key not in _NODE_KEYS:
            raise ConfigError(f"[node] {key}", "unknown setting")
    node: dict[str, Any] = {}
    if "sysfs_root" in table:
        node["sysfs_root"] = _abs_path("[node] sysfs_root", table["sysfs_root"])
    if "staging_dir" in table:
        node["staging_dir"] = _abs_path("[node] staging_dir", table["staging_dir"])
    if "cgroup_root" in table:
        node["cgroup_root"] = _abs_path("[node] cgroup_root", table["cgroup_root"])
    if "topology_policy" in table:
        node["topology_policy"] = _choice(
            "[node] topology_policy", table["topology_policy"], TOPOLOGY_POLICIES
        )
    if "topology_scope" in table:
        node["topology_scope"] = _choice(
            "[node] topology_scope", table["topology_scope"], TOPOLOGY_SCOPES
        )
    return NodeSettings(**node)


def _record_settings(doc: Mapping[str, Any]) -> RecordSettings:
    table = _typed("[record]", doc.get("record", {}), dict, "a table")
    for key in table:
        if key not in _RECORD_KEYS:
            raise ConfigError(f"[record] {key}", "unknown setting")
    record: dict[str, Any] = {}
    if "file" in table:
        record["file"] = _abs_path("[record] file", table["file"])
    for flag in ("all", "secrets"):
        if flag in table:
            record[flag] = _typed(f"[record] {flag}", table[flag], bool, "true or false")
    if "max_bytes" in table:
        size = _typed("[record] max_bytes", table["max_bytes"], int, "a whole number of bytes")
        if size < MIN_MAX_MESSAGE_BYTES:
            raise ConfigError("[record] max_bytes", f"must be at least {MIN_MAX_MESSAGE_BYTES}")
        record["max_bytes"] = size
    if "keep" in table:
        record["keep"] = _count("[record] keep", table["keep"])
    for patterns in ("redact_annotations", "redact_values"):
        if patterns in table:
            record[patterns] = _str_list(f"[record] {patterns}", table[patterns])
    return RecordSettings(**record)


def settings_from_toml(doc: Mapping[str, Any]) -> Settings:
    for key in doc:
        if key not in _TOP_KEYS:
            raise ConfigError(key, "unknown setting")
    server: dict[str, Any] = {}
    runtime: dict[str, Any] = {}
    chain = _chain_settings(doc)
    top: dict[str, Any] = {}
    if "listen" in doc:
        server["listen"] = normalize_endpoint("listen", doc["listen"])
    if "socket_mode" in doc:
        server["socket_mode"] = _socket_mode("socket_mode", doc["socket_mode"])
    if "socket_group" in doc:
        group = _typed("socket_group", doc["socket_group"], (str, int), "a group name or id")
        server["socket_group"] = str(group)
    if "shutdown_grace_seconds" in doc:
        server["shutdown_grace_seconds"] = _positive(
            "shutdown_grace_seconds", doc["shutdown_grace_seconds"]
        )
    if "max_message_bytes" in doc:
        server["max_message_bytes"] = _message_size("max_message_bytes", doc["max_message_bytes"])
    if "metrics_listen" in doc:
        server["metrics_listen"] = metrics_address("metrics_listen", doc["metrics_listen"])
    if "data_path" in doc:
        server["data_path"] = _choice("data_path", doc["data_path"], DATA_PATHS)
    if "runtime_endpoint" in doc:
        runtime["endpoint"] = normalize_endpoint("runtime_endpoint", doc["runtime_endpoint"])
    if "image_endpoint" in doc:
        runtime["image_endpoint"] = normalize_endpoint("image_endpoint", doc["image_endpoint"])
    if "runtime_startup_wait_max_seconds" in doc:
        runtime["startup_wait_max_seconds"] = _positive(
            "runtime_startup_wait_max_seconds", doc["runtime_startup_wait_max_seconds"]
        )
    if "read_back" in doc:
        runtime["read_back"] = _typed("read_back", doc["read_back"], bool, "true or false")
    if "reconcile_seconds" in doc:
        runtime["reconcile_seconds"] = _positive("reconcile_seconds", doc["reconcile_seconds"])
    if "updates" in doc:
        runtime["updates"] = _choice("updates", doc["updates"], UPDATE_MODES)
    if "state_dir" in doc:
        top["state_dir"] = _abs_path("state_dir", doc["state_dir"])
    if "plugins_dir" in doc:
        chain["plugins_dir"] = _abs_path("plugins_dir", doc["plugins_dir"])
    if "log_format" in doc:
        top["log_format"] = _choice("log_format", doc["log_format"], LOG_FORMATS)
    if "log_level" in doc:
        top["log_level"] = _choice("log_level", str(doc["log_level"]).lower(), LOG_LEVELS)
    if "dry_run" in doc:
        chain["dry_run"] = _typed("dry_run", doc["dry_run"], bool, "true or false")
    return Settings(
        server=ServerSettings(**server),
        runtime=RuntimeSettings(**runtime),
        chain=ChainSettings(**chain),
        node=_node_settings(doc),
        record=_record_settings(doc),
        **top,
    )


def _abs_path(setting: str, value: object) -> Path:
    text = _typed(setting, value, str, "an absolute path")
    if not text.startswith("/"):
        raise ConfigError(setting, f"{text!r} is not an absolute path")
    return Path(text)


def load_config(path: Path | None) -> Settings:
    """Read the TOML file. `None` means the default path, which may be absent."""
    target = path or DEFAULT_CONFIG_PATH
    try:
        raw = target.read_bytes()
    except FileNotFoundError:
        if path is None:
            return Settings()
        raise ConfigError("--config", f"{target} does not exist") from None
    except OSError as exc:
        raise ConfigError("--config", f"cannot read {target}: {exc.strerror}") from None
    try:
        doc = tomllib.loads(raw.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError("--config", f"{target} is not valid TOML: {exc}") from None
    return settings_from_toml(doc)


def apply_flags(settings: Settings, flags: Mapping[str, Any]) -> Settings:
    """Flags given on the command line (not None) override the file's settings."""
    server, runtime, chain, node = settings.server, settings.runtime, settings.chain, settings.node
    top: dict[str, Any] = {}
    if flags.get("listen") is not None:
        server = replace(server, listen=normalize_endpoint("--listen", flags["listen"]))
    if flags.get("max_message_bytes") is not None:
        server = replace(
            server,
            max_message_bytes=_message_size("--max-message-bytes", flags["max_message_bytes"]),
        )
    if flags.get("metrics_listen") is not None:
        server = replace(
            server, metrics_listen=metrics_address("--metrics-listen", flags["metrics_listen"])
        )
    if flags.get("data_path") is not None:
        server = replace(server, data_path=_choice("--data-path", flags["data_path"], DATA_PATHS))
    if flags.get("updates") is not None:
        runtime = replace(runtime, updates=_choice("--updates", flags["updates"], UPDATE_MODES))
    if flags.get("runtime_endpoint") is not None:
        runtime = replace(
            runtime, endpoint=normalize_endpoint("--runtime-endpoint", flags["runtime_endpoint"])
        )
    if flags.get("image_endpoint") is not None:
        runtime = replace(
            runtime,
            image_endpoint=normalize_endpoint("--image-endpoint", flags["image_endpoint"]),
        )
    if flags.get("hooks") is not None:
        chain = replace(chain, hooks=_hooks_flag(flags["hooks"], chain))
    if flags.get("plugins_dir") is not None:
        chain = replace(chain, plugins_dir=_abs_path("--plugins-dir", flags["plugins_dir"]))
    if flags.get("dry_run"):
        chain = replace(chain, dry_run=True)
    if flags.get("state_dir") is not None:
        top["state_dir"] = _abs_path("--state-dir", flags["state_dir"])
    if flags.get("sysfs_root") is not None:
        node = replace(node, sysfs_root=_abs_path("--sysfs-root", flags["sysfs_root"]))
    if flags.get("staging_dir") is not None:
        node = replace(node, staging_dir=_abs_path("--staging-dir", flags["staging_dir"]))
    if flags.get("cgroup_root") is not None:
        node = replace(node, cgroup_root=_abs_path("--cgroup-root", flags["cgroup_root"]))
    if flags.get("log_format") is not None:
        top["log_format"] = _choice("--log-format", flags["log_format"], LOG_FORMATS)
    if flags.get("log_level") is not None:
        top["log_level"] = _choice("--log-level", flags["log_level"].lower(), LOG_LEVELS)
    record = settings.record
    if flags.get("record") is not None:
        record = replace(record, file=_abs_path("--record", str(Path(flags["record"]).absolute())))
    if flags.get("record_all"):
        record = replace(record, all=True)
    if flags.get("record_secrets"):
        record = replace(record, secrets=True)
    return replace(
        settings, server=server, runtime=runtime, chain=chain, node=node, record=record, **top
    )


def _hooks_flag(value: str, chain: ChainSettings) -> tuple[HookSettings, ...]:
    """`--hooks none` empties the chain; `--hooks 10-a,20-b` or `--hooks cpuset,oom` names
    it (configured settings are kept for hooks that were configured, in `[hooks] order` or
    by their `[hooks.<name>]` table). A table for a hook the flag leaves out is an error."""
    if value.strip() == "none":
        return ()
    by_base = {h.base_name: h for h in chain.hooks}
    hooks = []
    for raw in (n.strip() for n in value.split(",") if n.strip()):
        name = expand_hook_name("--hooks", raw)
        known = by_base.get(name[3:])
        if known is not None:
            hooks.append(replace(known, name=name))
        else:
            table = chain.hook_tables.get(name[3:], {})
            hooks.append(parse_hook_settings(f"[hooks.{name[3:]}]", name, table))
    if len({h.base_name for h in hooks}) != len(hooks):
        raise ConfigError("--hooks", "a hook name appears twice")
    chosen = {h.base_name for h in hooks}
    for base in chain.hook_tables:
        if base not in chosen:
            raise ConfigError(f"[hooks.{base}]", "settings for a hook that is not in --hooks")
    return tuple(hooks)
