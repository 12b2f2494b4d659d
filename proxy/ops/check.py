"""`crihook check`: is this node ready to run crihook between kubelet and the runtime?

It takes the flags `crihook serve` takes, and:

- validates the settings (config file and flags), the in-process hooks they name, the node
  topology (`--sysfs-root`) and the plugin drop-ins;
- with the devices hook: that its staging directory (`[node] staging_dir`) is on a shared
  mount, so the bind mounts it makes there reach the runtime (a DaemonSet needs /run/crihook
  mounted Bidirectional), and that only root may write there;
- reaches the runtime (CRI Version, Status with verbose info, RuntimeConfig) and reports its
  name, version, cgroup driver, and the node's cgroup version;
- reads kubelet's settings when given (`--kubelet-config FILE`, `--kubelet-flags "ARGS"`) and
  warns when its static CPU or memory manager is on (they pin cpusets and NUMA nodes
  themselves, and would fight the cpuset and numa hooks), when its runtime endpoint is not
  crihook's socket, and when its cgroup driver differs from the runtime's.

Each finding is one line: `ok`, `note` (worth knowing, changes nothing), `warning` or
`error`. Exit code: 0 when there is no warning or error, 1 with warnings only, 2 with errors.
"""

from __future__ import annotations

import argparse
import asyncio
import enum
import json
import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import grpc
from google.protobuf.message import DecodeError

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.builtin import BUILTIN_HOOKS
from crihook.hooks.node import cgroup_version
from crihook.hooks.node.staging import propagation_of
from crihook.hooks.remote.client import check_socket
from crihook.proxy.chain.dropin_files import read_dropins
from crihook.proxy.chain.local_hooks import host_problems, load_local_hook
from crihook.proxy.chain.plugins import (
    crihook_sockets,
    dropin_endpoint_problem,
    dropin_name_problem,
    parse_dropin,
)
from crihook.proxy.config import (
    DEFAULT_CONFIG_PATH,
    HookSettings,
    Settings,
    apply_flags,
    load_config,
)
from crihook.proxy.cri.methods import method_path
from crihook.proxy.cri.runtime import RuntimeCallFailed
from crihook.proxy.errors import ConfigError
from crihook.proxy.ops.kubelet_settings import (
    CONFIG_DIR_FLAG,
    CONFIG_FLAG,
    KubeletConfigError,
    KubeletSetting,
    parse_kubelet_config,
    parse_kubelet_flags,
    resolve_kubelet_settings,
    same_socket,
)
from crihook.proxy.ops.node_doc import read_topology
from crihook.proxy.wire.grpc.runtime_client import RuntimeClient

__all__ = [
    "Finding",
    "Level",
    "cgroup_driver_from_info",
    "check_command",
    "exit_code",
    "kubelet_findings",
    "staging_findings",
]

RUNTIME_TIMEOUT_SECONDS = 5.0


class Level(enum.Enum):
    OK = "ok"
    NOTE = "note"
    WARNING = "warning"
    ERROR = "error"


@dataclass(frozen=True)
class Finding:
    level: Level
    topic: str
    message: str

    def line(self) -> str:
        return f"{self.level.value:<8} {self.topic}: {self.message}"


def exit_code(findings: Iterable[Finding]) -> int:
    """2 with any error, 1 with warnings only, else 0."""
    levels = {f.level for f in findings}
    if Level.ERROR in levels:
        return 2
    return 1 if Level.WARNING in levels else 0


def check_command(args: argparse.Namespace, out: TextIO) -> int:
    findings: list[Finding] = []
    settings = _settings(args, findings)
    if settings is not None:
        findings += _node_findings(settings)
        findings += _hook_findings(settings)
        findings += staging_findings(settings, _mountinfo())
        findings += dropin_findings(settings)
        driver = asyncio.run(_runtime_findings(settings, findings))
    else:
        driver = None
    findings += _kubelet(args, settings, driver)
    code = exit_code(findings)
    counts = {level: sum(f.level is level for f in findings) for level in Level}
    if getattr(args, "json", False):
        doc = {
            "findings": [
                {"level": f.level.value, "topic": f.topic, "message": f.message} for f in findings
            ],
            "counts": {level.value: n for level, n in counts.items()},
            "exit": code,
        }
        print(json.dumps(doc, indent=2), file=out)
        return code
    for finding in findings:
        print(finding.line(), file=out)
    print(
        f"crihook check: {counts[Level.ERROR]} error(s), {counts[Level.WARNING]} warning(s) "
        f"(exit {code})",
        file=out,
    )
    return code


# --- settings, hooks, node, drop-ins -------------------------------------------------------


def _settings(args: argparse.Namespace, findings: list[Finding]) -> Settings | None:
    path = args.config or DEFAULT_CONFIG_PATH
    try:
        settings = apply_flags(load_config(args.config), vars(args))
    except ConfigError as exc:
        findings.append(Finding(Level.ERROR, "config", str(exc)))
        try:  # the runtime and kubelet can still be checked with the defaults and flags
            settings = apply_flags(Settings(), vars(args))
        except ConfigError:
            return None
        findings.append(Finding(Level.NOTE, "config", "checking on with the defaults and flags"))
        return settings
    if args.config is None and not path.exists():
        findings.append(Finding(Level.OK, "config", f"no {path}: defaults and flags"))
    else:
        findings.append(Finding(Level.OK, "config", f"{path} is valid"))
    if same_socket(settings.server.listen, settings.runtime.endpoint):
        findings.append(
            Finding(
                Level.ERROR,
                "config",
                f"the runtime endpoint is crihook's own socket ({settings.server.listen})",
            )
        )
    return settings


def _node_findings(settings: Settings) -> list[Finding]:
    try:
        node = read_topology(settings)
    except ConfigError as exc:
        return [Finding(Level.ERROR, "node", str(exc))]
    root = settings.node.sysfs_root
    cpus, numa = len(node.cpus), len(node.numa_nodes)
    found = [Finding(Level.OK, "node", f"{cpus} CPU(s), {numa} NUMA node(s) in {root}")]
    version = cgroup_version(root / "fs" / "cgroup")
    if version is None:
        found.append(Finding(Level.NOTE, "cgroup", f"no cgroupfs under {root}/fs/cgroup"))
    else:
        found.append(Finding(Level.OK, "cgroup", f"version {version}"))
    return found


def _hook_findings(settings: Settings) -> list[Finding]:
    found = []
    for hook in settings.chain.hooks:
        try:
            load_local_hook(hook)
        except ConfigError as exc:
            found.append(Finding(Level.ERROR, f"hook {hook.name}", str(exc)))
        else:
            state = "" if hook.enabled else " (disabled)"
            found.append(Finding(Level.OK, f"hook {hook.name}", f"builds{state}"))
    for problem in host_problems(settings.chain.hooks, settings.node.cgroup_root):
        found.append(Finding(Level.ERROR, "host", str(problem)))
    return found


def _uses_staging(hook: HookSettings) -> bool:
    builtin = BUILTIN_HOOKS.get(hook.base_name)
    return builtin is not None and builtin.uses_staging


def staging_findings(settings: Settings, mountinfo: str) -> list[Finding]:
    """Where the devices hook pins host paths: the mounts it makes there must reach the
    runtime's mount namespace (a shared mount; in a DaemonSet, a Bidirectional hostPath), and
    only root may write there."""
    if not any(_uses_staging(h) and h.enabled for h in settings.chain.hooks):
        return []
    topic = "staging"
    directory = str(settings.node.staging_dir)
    point, tags = propagation_of(mountinfo, directory)
    fix = (
        "mount /run/crihook into crihook's container with mountPropagation: Bidirectional "
        "(docs/install.md), or set [node] staging_dir on a shared mount"
    )
    found: list[Finding] = []
    shared = [t for t in tags if t.startswith("shared:")]
    if shared:
        found.append(
            Finding(
                Level.OK, topic, f"{directory} is on {point}, {shared[0]}: its mounts propagate"
            )
        )
    elif any(t.startswith("master:") for t in tags):
        found.append(
            Finding(
                Level.ERROR,
                topic,
                f"{directory} is on {point}, a slave mount (HostToContainer): the mounts the "
                f"devices hook makes there never reach the runtime, whose containers would "
                f"get empty directories instead of the host paths; {fix}",
            )
        )
    else:
        found.append(
            Finding(
                Level.WARNING,
                topic,
                f"{directory} is on {point}, a private mount: the mounts the devices hook "
                f"makes there are seen only in crihook's mount namespace, right on a host "
                f"install whose runtime shares it, wrong in a container; {fix}",
            )
        )
    try:
        st = os.stat(directory)
    except FileNotFoundError:
        return found  # made at the first pin, root's and 0711
    except OSError as exc:
        return [*found, Finding(Level.ERROR, topic, f"cannot stat {directory}: {exc.strerror}")]
    if st.st_uid != 0 or st.st_mode & 0o022:
        found.append(
            Finding(
                Level.ERROR,
                topic,
                f"{directory} is owned by uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}: "
                "only root may write where checked host paths are pinned",
            )
        )
    return found


def _mountinfo() -> str:
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            return f.read()
    except OSError:
        return ""  # no /proc: the staging directory's mount is reported as "/" (private)


def dropin_findings(settings: Settings) -> list[Finding]:
    """Every drop-in parsed as crihook would load it, and its plugin's socket looked at."""
    directory = settings.chain.plugins_dir
    topic = "plugins"
    try:
        paths = sorted(directory.glob("*.toml"))
    except OSError as exc:
        return [Finding(Level.ERROR, topic, f"cannot list {directory}: {exc.strerror}")]
    listing = read_dropins(directory)
    if listing.missing:
        return [Finding(Level.NOTE, topic, f"no directory {directory}: no plugins")]
    if listing.refused_directory is not None:
        return [
            Finding(
                Level.ERROR,
                topic,
                f"{listing.refused_directory} (crihook reads none of its drop-ins)",
            )
        ]
    found: list[Finding] = []
    reserved = {h.base_name for h in settings.chain.hooks}
    sockets = crihook_sockets(settings)
    loaded: dict[Path, HookSettings] = {}
    for path in paths:
        refusal = listing.refused.get(path)
        if refusal is not None:
            found.append(Finding(Level.ERROR, topic, f"{refusal} (crihook ignores this file)"))
            continue
        if path not in listing.files:
            found.append(Finding(Level.ERROR, topic, f"cannot read {path}"))
            continue
        try:
            dropin = parse_dropin(path, listing.files[path])
            problem = dropin_name_problem(path, dropin, reserved, loaded)
            if problem is None:
                problem = dropin_endpoint_problem(path, dropin, sockets)
            if problem is not None:
                raise problem
        except ConfigError as exc:
            found.append(Finding(Level.ERROR, topic, f"{exc} (crihook ignores this file)"))
            continue
        loaded[path] = dropin
        assert dropin.endpoint is not None  # parse_dropin requires one
        socket_problem = check_socket(dropin.endpoint.removeprefix("unix://"))
        if socket_problem is None:
            found.append(Finding(Level.OK, f"plugin {dropin.name}", dropin.endpoint))
        else:
            # A plugin that must answer fails every call it handles until it is reachable.
            level = Level.WARNING if dropin.failure_policy == "fail" else Level.NOTE
            found.append(Finding(level, f"plugin {dropin.name}", socket_problem))
    if not paths:
        found.append(Finding(Level.OK, topic, f"no drop-ins in {directory}"))
    return found


# --- the runtime -------------------------------------------------------------------------


async def _runtime_findings(settings: Settings, findings: list[Finding]) -> str | None:
    """Version, Status and cgroup driver of the runtime; the driver, when known."""
    client = RuntimeClient(settings.runtime)
    topic = "runtime"
    endpoint = settings.runtime.endpoint
    try:
        try:
            answer = await _call(client, "Version", api_pb2.VersionRequest())
        except RuntimeCallFailed as exc:
            findings.append(
                Finding(Level.ERROR, topic, f"{endpoint} does not answer Version ({_status(exc)})")
            )
            return None
        version = api_pb2.VersionResponse.FromString(answer)
        findings.append(
            Finding(
                Level.OK,
                topic,
                f"{version.runtime_name} {version.runtime_version} "
                f"(CRI {version.runtime_api_version}) at {endpoint}",
            )
        )
        if version.runtime_api_version != "v1":
            findings.append(
                Finding(Level.ERROR, topic, "crihook speaks CRI v1 only; kubelet would too")
            )
        info: Mapping[str, str] = {}
        try:
            status = api_pb2.StatusResponse.FromString(
                await _call(client, "Status", api_pb2.StatusRequest(verbose=True))
            )
        except RuntimeCallFailed as exc:
            findings.append(Finding(Level.ERROR, topic, f"Status failed ({_status(exc)})"))
        else:
            info = status.info
            findings += condition_findings(status.status.conditions)
        driver, source = await _cgroup_driver(client, info)
        if driver is None:
            findings.append(Finding(Level.NOTE, "cgroup", f"driver unknown ({source})"))
        else:
            findings.append(Finding(Level.OK, "cgroup", f"driver {driver} ({source})"))
        if settings.runtime.image_endpoint:
            findings.append(await _image_finding(client, settings.runtime.image_endpoint))
        return driver
    finally:
        await client.close()


async def _call(client: RuntimeClient, name: str, request: Any, image: bool = False) -> bytes:
    service = "ImageService" if image else "RuntimeService"
    call = client.control(method_path(service, name), image_service=image)
    answer: bytes = await call(request.SerializeToString(), timeout=RUNTIME_TIMEOUT_SECONDS)
    return answer


async def _image_finding(client: RuntimeClient, endpoint: str) -> Finding:
    try:
        await _call(client, "ImageFsInfo", api_pb2.ImageFsInfoRequest(), image=True)
    except RuntimeCallFailed as exc:
        return Finding(Level.ERROR, "images", f"{endpoint} does not answer ({_status(exc)})")
    return Finding(Level.OK, "images", f"image service at {endpoint}")


def condition_findings(conditions: Sequence[api_pb2.RuntimeCondition]) -> list[Finding]:
    """RuntimeReady false is an error (kubelet starts no pod), NetworkReady false a warning
    (no pod network until CNI is set up); other conditions (containerd 2.x's deprecation
    warnings) are notes."""
    found = []
    for condition in conditions:
        if condition.status:
            continue
        why = "; ".join(x for x in (condition.reason, condition.message) if x)
        text = f"{condition.type} is false" + (f": {why}" if why else "")
        if condition.type == "RuntimeReady":
            found.append(Finding(Level.ERROR, "runtime", text))
        elif condition.type == "NetworkReady":
            found.append(Finding(Level.WARNING, "runtime", text))
        else:
            found.append(Finding(Level.NOTE, "runtime", text))
    return found


async def _cgroup_driver(client: RuntimeClient, info: Mapping[str, str]) -> tuple[str | None, str]:
    # containerd >= 2.0 answers RuntimeConfig (what kubelet >= 1.28 asks); 1.6 does not.
    try:
        answer = await _call(client, "RuntimeConfig", api_pb2.RuntimeConfigRequest())
    except RuntimeCallFailed as exc:
        if exc.status.code != grpc.StatusCode.UNIMPLEMENTED:
            return None, f"RuntimeConfig failed: {_status(exc)}"
    else:
        try:
            config = api_pb2.RuntimeConfigResponse.FromString(answer)
        except DecodeError:
            return None, "RuntimeConfig answered something that does not parse"
        if config.HasField("linux"):
            name = api_pb2.CgroupDriver.Name(config.linux.cgroup_driver).lower()
            return name, "CRI RuntimeConfig"
    return cgroup_driver_from_info(info)


def cgroup_driver_from_info(info: Mapping[str, str]) -> tuple[str | None, str]:
    """The cgroup driver from Status's verbose `config`. CRI-O: its `CgroupManagerName`
    (under `crio`). containerd (1.6 and 2.x): its default runtime's runc option
    `SystemdCgroup`, else the 1.x plugin-wide `systemdCgroup`, else runc's default
    (cgroupfs)."""
    raw = info.get("config")
    if raw is None:
        return None, "Status info has no config"
    try:
        config = json.loads(raw)
    except ValueError:
        return None, "Status info config does not parse"
    crio = config.get("crio") if isinstance(config, dict) else None
    if isinstance(crio, dict):
        manager = crio.get("CgroupManagerName")
        if manager in ("cgroupfs", "systemd"):
            return manager, "Status info, CRI-O CgroupManagerName"
        return None, "Status info config (CRI-O) names no cgroup manager"
    try:
        containerd = config["containerd"]
        name = containerd["defaultRuntimeName"]
        runtime = containerd["runtimes"][name]
    except (KeyError, TypeError):
        return None, "Status info config names no default runtime"
    options = runtime.get("options") or {}
    where = f"Status info, runtime {name!r}"
    if isinstance(options, dict) and "SystemdCgroup" in options:
        driver = "systemd" if options["SystemdCgroup"] is True else "cgroupfs"
        return driver, f"{where} SystemdCgroup"
    if config.get("systemdCgroup") is True:
        return "systemd", "Status info systemdCgroup"
    return "cgroupfs", f"{where}, runc's default"


def _status(exc: RuntimeCallFailed) -> str:
    return f"{exc.status.code.name}: {exc.status.details}"


# --- kubelet -----------------------------------------------------------------------------


def _kubelet(
    args: argparse.Namespace, settings: Settings | None, runtime_driver: str | None
) -> list[Finding]:
    if args.kubelet_config is None and args.kubelet_flags is None:
        return [
            Finding(
                Level.NOTE,
                "kubelet",
                'not checked (give --kubelet-config FILE and/or --kubelet-flags "ARGS")',
            )
        ]
    try:
        resolved = read_kubelet(args.kubelet_config, args.kubelet_flags)
    except KubeletConfigError as exc:
        return [Finding(Level.ERROR, "kubelet", str(exc))]
    listen = settings.server.listen if settings is not None else None
    runtime = settings.runtime.endpoint if settings is not None else None
    return kubelet_findings(resolved, listen, runtime, runtime_driver)


def read_kubelet(config: Path | None, flags_text: str | None) -> dict[str, KubeletSetting]:
    """kubelet's effective settings from its config file (`config`, else the `--config` among
    the flags), the drop-ins of `--config-dir`, and the flags."""
    flags = parse_kubelet_flags(flags_text or "")
    path = config or (Path(flags[CONFIG_FLAG]) if CONFIG_FLAG in flags else None)
    documents = []
    if path is not None:
        documents.append((str(path), parse_kubelet_config(_read(path), str(path))))
    if CONFIG_DIR_FLAG in flags:
        directory = Path(flags[CONFIG_DIR_FLAG])
        try:
            dropins = sorted(p for p in directory.iterdir() if p.suffix == ".conf")
        except OSError as exc:
            raise KubeletConfigError(f"cannot list {directory}: {exc.strerror}") from None
        for dropin in dropins:
            documents.append((str(dropin), parse_kubelet_config(_read(dropin), str(dropin))))
    return resolve_kubelet_settings(documents, flags)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise KubeletConfigError(f"cannot read {path}: {reason}") from None


def kubelet_findings(
    kubelet: Mapping[str, KubeletSetting],
    listen: str | None,
    runtime_endpoint: str | None,
    runtime_driver: str | None,
) -> list[Finding]:
    """What kubelet's settings mean for crihook."""
    found = []
    cpu = kubelet["cpuManagerPolicy"]
    if cpu.value.lower() == "static":
        found.append(
            Finding(
                Level.WARNING,
                "kubelet",
                f"CPU manager policy is static ({cpu.source}): kubelet pins the cpusets of "
                "Guaranteed containers itself and would undo or fight the cpuset hook's; "
                "set it to none where crihook places CPUs",
            )
        )
    memory = kubelet["memoryManagerPolicy"]
    if memory.value.lower() == "static":
        found.append(
            Finding(
                Level.WARNING,
                "kubelet",
                f"memory manager policy is Static ({memory.source}): kubelet pins the NUMA "
                "nodes of Guaranteed containers itself and would fight the numa hook; set it "
                "to None where crihook places memory",
            )
        )
    if not found:
        found.append(
            Finding(
                Level.OK,
                "kubelet",
                f"CPU manager {cpu.value}, memory manager {memory.value}",
            )
        )
    endpoint = kubelet["containerRuntimeEndpoint"]
    if listen is not None and same_socket(endpoint.value, listen):
        found.append(Finding(Level.OK, "kubelet", f"runtime endpoint is crihook ({listen})"))
    elif listen is not None:
        direct = runtime_endpoint is not None and same_socket(endpoint.value, runtime_endpoint)
        what = "the runtime itself: crihook sees no call" if direct else "not crihook"
        found.append(
            Finding(
                Level.WARNING,
                "kubelet",
                f"runtime endpoint {endpoint.value} ({endpoint.source}) is {what}; "
                f"point it at {listen} (systemd/kubelet.service.d/10-crihook.conf)",
            )
        )
    driver = kubelet["cgroupDriver"]
    # Only a driver kubelet was given: without one, recent kubelets ask the runtime
    # (RuntimeConfig, feature gate KubeletCgroupDriverFromCRI).
    given = driver.source != "default"
    if given and runtime_driver is not None and driver.value != runtime_driver:
        found.append(
            Finding(
                Level.WARNING,
                "kubelet",
                f"cgroup driver {driver.value} ({driver.source}) is not the runtime's "
                f"({runtime_driver}): pods fail to start",
            )
        )
    return found
