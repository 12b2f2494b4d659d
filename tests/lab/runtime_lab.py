"""What every private CRI runtime of the lab shares: one process under a temp directory, a
CNI bridge, and a clean-up that leaves the host as it found it.

:class:`RuntimeLab` is the base of :class:`tests.lab.containerd.Containerd` and
:class:`tests.lab.crio.Crio`. It owns the lifecycle (start, stop, kill, restart,
ensure_running, cleanup), the readiness probe (CRI Version over gRPC), the CNI bridge
(conflist, the host's address on it, deletion), the safety net against registries off the
machine (HTTP(S)_PROXY to a closed loopback port), and the clean-up steps that do not depend
on the runtime: pods removed through CRI, then leftover processes killed by PID, mounts
under the root unmounted, container and pod cgroups removed, CNI result caches deleted.

A subclass says what differs: the runtime's command line and config files, which processes
outlive it (containerd's shims, CRI-O's conmons), what a container's cgroup is called
(containerd: ``<parent>/<id>``; CRI-O: ``<parent>/crio-<id>``), and how images come in.

The test suites use a lab through this surface only (``endpoint``, ``pod_log_dir``,
``runtime``, ``restart()``, ...), so one suite runs on every runtime.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import ipaddress
import json
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, ClassVar

import grpc

from tests.lab import cgroups, host
from tests.lab.images import LabImages, build_images

__all__ = ["CNI_CACHE_DIR", "LabError", "RuntimeLab", "container_cgroup_pattern"]

log = logging.getLogger(__name__)

SOCKET_PATH_MAX = 107  # sun_path is 108 bytes including the NUL
CNI_CACHE_DIR = Path("/var/lib/cni/results")  # libcni's default; neither runtime moves it
_VERSION_METHOD = "/runtime.v1.RuntimeService/Version"
_DEAD_PROXY = "http://127.0.0.1:9"  # the discard port: nothing listens there


class LabError(RuntimeError):
    """The test bed could not be set up or torn down; the message says what and why."""


def container_cgroup_pattern(prefix: str = "") -> re.Pattern[str]:
    """The name of a container's cgroup dir: ``<prefix><64-hex id>``."""
    return re.compile(rf"{re.escape(prefix)}[0-9a-f]{{64}}")


class RuntimeLab(abc.ABC):
    """A CRI runtime private to one test session, under ``root_dir``.

    ``root_dir`` must exist or be creatable and be short (the socket path inside it is
    limited to 107 bytes). ``start()`` configures and launches the runtime and brings the
    lab images in; ``cleanup()`` removes everything it started. ``restart()`` keeps the
    root, so running pods survive it.
    """

    socket_name: ClassVar[str]
    """The CRI socket's file name under the root."""
    config_name: ClassVar[str]
    """The main config file's name under the root (its presence marks a lab root)."""
    log_name: ClassVar[str]
    """The runtime's log file under the root."""
    container_cgroups: ClassVar[tuple[re.Pattern[str], ...]]
    """Names of the cgroup dirs the runtime makes for its containers (and monitors)."""
    process_name: ClassVar[str]
    """For messages: "containerd", "CRI-O"."""
    fixed_bridge_mac: ClassVar[bool] = False
    """Make the bridge before CNI does, with a MAC address of its own. A Linux bridge takes
    the lowest MAC of its ports unless one is set, so it changes as pods come and go; CRI-O
    runs CNI CHECK on a new sandbox, and the bridge plugin fails it when the MAC moved since
    ADD ("Bridge interface ... Mac doesn't match"). containerd never checks."""

    def __init__(
        self,
        root_dir: Path | str,
        images: LabImages | None = None,
        *,
        subnet: str | None = None,
        start_timeout: float = 30.0,
        cni_bin_dir: str = "/usr/lib/cni",
        cgroup_roots: Sequence[str] = ("/kubepods",),
        registry_mirror: str | None = None,
        host_reaches_pods: bool = False,
    ) -> None:
        """``registry_mirror``: URL of a registry (``http://127.0.0.1:PORT``) that every
        registry critest uses resolves to; None: no registry at all.
        ``host_reaches_pods``: give the bridge the subnet's first address, so the host can
        reach pod IPs (as a node's bridge can); no routes or forwarding are added."""
        self.dir = Path(root_dir).absolute()
        self._images = images
        self.registry_mirror = registry_mirror
        self.host_reaches_pods = host_reaches_pods
        self.start_timeout = start_timeout
        self.cni_bin_dir = cni_bin_dir
        # Names derive from the directory so two sessions on one host never collide.
        tag = hashlib.sha256(str(self.dir).encode()).hexdigest()[:8]
        self.bridge = f"crih{tag}"  # IFNAMSIZ: at most 15 characters
        self.network_name = f"crihook-{tag}"
        self.subnet = subnet or _unused_subnet()
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        self._started = False
        self._was_ready = False  # CRI answered at least once: there may be pods to remove
        # Pod cgroup roots (kubelet's --cgroup-root) whose new, empty dirs cleanup removes.
        self.cgroup_roots = tuple(cgroup_roots)
        # Host paths outside root_dir that existed before the first start: never removed.
        self._preexisting: set[Path] = set()
        # Sandbox ids seen at cleanup (CRI list, monitors): their CNI cache files go too.
        self._sandbox_ids: set[str] = set()
        # cleanup() deletes root_dir: accept only an empty dir or an earlier lab root.
        if self.dir.is_dir() and any(self.dir.iterdir()) and not self.config_path.exists():
            raise LabError(f"{self.dir} is not empty and not a lab root; refusing to use it")
        if len(str(self.socket_path)) > SOCKET_PATH_MAX:
            raise LabError(
                f"socket path {self.socket_path} is longer than {SOCKET_PATH_MAX} bytes; "
                "use a shorter root_dir"
            )

    # -- what a runtime says about itself ------------------------------------------------

    @property
    @abc.abstractmethod
    def runtime(self) -> str:
        """Which runtime this is, as tests and ids name it: ``containerd-1.6``,
        ``containerd-2``, ``crio``."""

    @property
    def is_crio(self) -> bool:
        return self.runtime == "crio"

    @abc.abstractmethod
    def _prepare(self) -> None:
        """Check the binaries and write the runtime's config files (the root exists)."""

    @abc.abstractmethod
    def _command(self) -> list[str]:
        """The runtime's command line."""

    def _environment(self, env: dict[str, str]) -> None:  # noqa: B027  (optional hook)
        """Adjust the runtime's environment in place (the proxy safety net is set)."""

    @abc.abstractmethod
    def import_images(self) -> None:
        """(Re-)bring the lab images in; a test that removed one puts it back with this."""

    @abc.abstractmethod
    def tag_image(self, source: str, ref: str) -> None:
        """Make the image ``source`` (a lab image) known under ``ref`` too."""

    @abc.abstractmethod
    def _monitors(self) -> dict[int, str]:
        """pid -> sandbox or container id of the processes that outlive the runtime and
        serve its containers (containerd's shims, CRI-O's conmons)."""

    def _after_monitors_killed(self, ids: Iterable[str]) -> None:  # noqa: B027  (optional)
        """Remove what killed monitors leave outside the root (containerd: shim sockets)."""

    def _shared_dirs(self) -> tuple[Path, ...]:
        """Host dirs outside the root the runtime creates on first use: removed at clean-up
        when they are new and empty."""
        return (CNI_CACHE_DIR, CNI_CACHE_DIR.parent)

    # -- paths and properties ------------------------------------------------------------

    @property
    def socket_path(self) -> Path:
        return self.dir / self.socket_name

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket_path}"

    @property
    def log_path(self) -> Path:
        return self.dir / self.log_name

    @property
    def config_path(self) -> Path:
        return self.dir / self.config_name

    @property
    def cni_conf_dir(self) -> Path:
        return self.dir / "cni/net.d"

    @property
    def bridge_address(self) -> str:
        """The host's address on the pod bridge (``host_reaches_pods``): the subnet's first."""
        net = ipaddress.ip_network(self.subnet)
        return f"{net.network_address + 1}/{net.prefixlen}"

    @property
    def bridge_mac(self) -> str:
        """A locally administered unicast MAC, unique per lab (``fixed_bridge_mac``)."""
        tag = self.bridge.removeprefix("crih")
        return "02:" + ":".join(tag[i : i + 2] for i in range(0, 8, 2)) + ":01"

    @property
    def pod_log_dir(self) -> Path:
        """Where a kubelet-like client should put pod log directories (like /var/log/pods)."""
        return self.dir / "pods"

    @property
    def pid(self) -> int | None:
        """PID of the runtime process, or None when it is not running."""
        if self._proc is None or self._proc.poll() is not None:
            return None
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self.pid is not None

    @property
    def images(self) -> LabImages:
        if self._images is None:
            self._images = build_images()
        return self._images

    def container_cgroup(self, cgroup_parent: str, container_id: str) -> str:
        """The absolute cgroupfs path of a container the runtime made under a pod parent."""
        return f"/{cgroup_parent.strip('/')}/{self.container_cgroup_name(container_id)}"

    def container_cgroup_name(self, container_id: str) -> str:
        return container_id

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Write the configs, launch the runtime, wait for CRI, bring the lab images in."""
        if self.running:
            raise LabError(f"{self.process_name} is already running (pid {self.pid})")
        _require_root()
        if shutil.which("ip") is None:
            raise LabError("ip not found: run tests/lab/install.sh")
        for sub in ("cni/net.d", "cni/ipam", "pods"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        if not self._started:
            self._preexisting = _snapshot_host_dirs(self.cgroup_roots, self._shared_dirs())
        self._prepare()
        conflist = self.cni_conf_dir / "10-crihook.conflist"
        conflist.write_text(json.dumps(self._cni_conflist(), indent=2))
        self._started = True
        if self.host_reaches_pods or self.fixed_bridge_mac:
            self._create_bridge()
        self._launch()
        self.import_images()

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the runtime and wait for it; its monitors and containers keep running."""
        self._terminate(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """SIGKILL the runtime (fault tests); monitors and containers keep running."""
        self._terminate(signal.SIGKILL, 10.0)

    def restart(self) -> None:
        """Stop (if running) and start again on the same root; running pods survive."""
        if not self._started:
            raise LabError("restart() before start()")
        self.stop()
        self._launch()

    def ensure_running(self) -> None:
        """Relaunch on the same root if a test stopped or killed the runtime."""
        if not self.running:
            self.restart()

    def cleanup(self) -> None:
        """Remove every pod, process, mount, cgroup, bridge and file this instance made.

        Runs every step even when one fails, then raises one LabError listing the problems.
        """
        problems: list[str] = []
        if not self._started:
            self._close_log()
            shutil.rmtree(self.dir, ignore_errors=True)
            return
        # Container cgroups seen through CRI or on live processes: only these and their
        # parents are removed, never anything else under the root.
        container_cgroups: set[str] = set()
        # Sandboxes are removed through CRI so the runtime runs CNI DEL and the OCI
        # runtime's delete. After kill() that needs the runtime up again, on the same root.
        if not self.running and self._was_ready:
            try:
                self._launch()
            except LabError as exc:
                problems.append(f"could not relaunch {self.process_name} for cleanup: {exc}")
        if self.running:
            try:
                container_cgroups |= self.remove_all_pods()
            except Exception as exc:  # keep tearing down: the remaining steps still matter
                problems.append(f"removing sandboxes via CRI: {exc!r}")
        _step(problems, f"stopping {self.process_name}", self.stop)
        container_cgroups |= self._kill_leftover_processes(problems)
        left = host.unmount_under(self.dir)
        if left:
            problems.append(f"could not unmount: {left}")
        problems += self._remove_cgroups(container_cgroups)
        _step(problems, "deleting the bridge", self._delete_bridge)
        self._remove_cni_cache()
        # Shared dirs the runtime or CNI create on first use: drop them if we did and they
        # are empty now (a concurrent lab keeps them busy, and then they stay).
        for shared in self._shared_dirs():
            if shared not in self._preexisting:
                with contextlib.suppress(OSError):
                    shared.rmdir()
        self._close_log()
        if host.mounts_under(self.dir):
            problems.append(f"mounts left under {self.dir}; not removing it")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)
        self._started = self._was_ready = False
        if problems:
            raise LabError(
                f"{self.process_name} lab cleanup incomplete:\n  " + "\n  ".join(problems)
            )

    # -- CNI -----------------------------------------------------------------------------

    def _cni_conflist(self) -> dict[str, object]:
        # An isolated bridge: no gateway, no masquerade, no portmap, so no iptables rules
        # or sysctl changes on the host.
        return {
            "cniVersion": "1.0.0",
            "name": self.network_name,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": False,
                    "ipMasq": False,
                    "hairpinMode": False,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.subnet}]],
                        "dataDir": f"{self.dir}/cni/ipam",
                    },
                }
            ],
        }

    def _create_bridge(self) -> None:
        """Create the bridge with the host's address before CNI does (it reuses it).

        host-local never hands out the range's gateway (the first address), so the host
        owns it alone; the connected route lets the host reach pod IPs, nothing else."""
        if Path(f"/sys/class/net/{self.bridge}").exists():
            return
        steps = [["ip", "link", "add", "name", self.bridge, "type", "bridge"]]
        if self.fixed_bridge_mac:
            steps.append(["ip", "link", "set", "dev", self.bridge, "address", self.bridge_mac])
        if self.host_reaches_pods:
            steps.append(["ip", "addr", "add", self.bridge_address, "dev", self.bridge])
        steps.append(["ip", "link", "set", self.bridge, "up"])
        for argv in steps:
            proc = subprocess.run(argv, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise LabError(f"{' '.join(argv)} failed: {proc.stderr.strip()}")

    def _delete_bridge(self) -> None:
        if Path(f"/sys/class/net/{self.bridge}").exists():
            subprocess.run(["ip", "link", "delete", self.bridge], check=True, capture_output=True)

    # -- process control -----------------------------------------------------------------

    def _launch(self) -> None:
        self._close_log()
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115  (lives as long as the runtime)
        self._log_file.write(f"--- crihook lab: launching at {time.time():.3f}\n".encode())
        self._log_file.flush()
        self.socket_path.unlink(missing_ok=True)
        env = dict(os.environ)
        # A safety net: whatever the registry config says, the runtime's HTTP clients can
        # reach nothing but loopback. Requests elsewhere go to a closed local port (and
        # are not even resolved: the proxy would do that); Go never proxies loopback.
        for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
            env[var] = _DEAD_PROXY
        for var in ("NO_PROXY", "no_proxy"):
            env[var] = "127.0.0.1,localhost,::1"
        self._environment(env)
        self._proc = subprocess.Popen(
            self._command(),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # setsid: no terminal signals from the test run
            close_fds=True,
        )
        try:
            self._wait_ready()
        except LabError:
            self._terminate(signal.SIGKILL, 10.0)
            raise
        self._was_ready = True

    def _wait_ready(self) -> None:
        """Poll CRI Version over gRPC; it answers only once the CRI service is serving."""
        deadline = time.monotonic() + self.start_timeout
        last_error = "socket not created"
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                code = None if self._proc is None else self._proc.returncode
                raise LabError(
                    f"{self.process_name} exited with {code} during start\n{self._log_tail()}"
                )
            if self.socket_path.exists():
                try:
                    with grpc.insecure_channel(self.endpoint) as channel:
                        # Raw bytes: an empty VersionRequest, no generated stubs needed.
                        channel.unary_unary(_VERSION_METHOD)(b"", timeout=1.0)
                    return
                except grpc.RpcError as exc:
                    last_error = f"{exc.code()}: {exc.details()}"
            time.sleep(0.05)
        raise LabError(
            f"{self.process_name} did not answer CRI Version within {self.start_timeout}s "
            f"({last_error})\n{self._log_tail()}"
        )

    def _terminate(self, sig: signal.Signals, timeout: float) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning(
                    "%s ignored %s for %.0fs; killing it", self.process_name, sig.name, timeout
                )
                proc.kill()
                proc.wait(10.0)
        self._proc = None

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def _log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return f"(no {self.process_name} log)"
        return f"--- last lines of {self.log_path}:\n" + "\n".join(text[-lines:])

    # -- cleanup steps ---------------------------------------------------------------------

    def remove_all_pods(self) -> set[str]:
        """Stop every running container (no grace), then StopPodSandbox + RemovePodSandbox
        for every sandbox, as kubelet would; returns the container cgroups seen."""
        from crihook.api.cri.v1 import api_pb2, api_pb2_grpc  # stubs only needed here

        found: set[str] = set()
        with grpc.insecure_channel(self.endpoint) as channel:
            rt = api_pb2_grpc.RuntimeServiceStub(channel)
            for c in rt.ListContainers(api_pb2.ListContainersRequest(), timeout=30).containers:
                status = rt.ContainerStatus(
                    api_pb2.ContainerStatusRequest(container_id=c.id, verbose=True), timeout=30
                )
                found |= self._cgroups_from_info(status.info)
                if c.state == api_pb2.CONTAINER_RUNNING:
                    # As kubelet does, containers first, without grace: CRI-O's
                    # StopPodSandbox would give each running one two minutes.
                    rt.StopContainer(
                        api_pb2.StopContainerRequest(container_id=c.id, timeout=0), timeout=60
                    )
            for sb in rt.ListPodSandbox(api_pb2.ListPodSandboxRequest(), timeout=30).items:
                self._sandbox_ids.add(sb.id)
                status = rt.PodSandboxStatus(
                    api_pb2.PodSandboxStatusRequest(pod_sandbox_id=sb.id, verbose=True),
                    timeout=30,
                )
                found |= self._cgroups_from_info(status.info)
                rt.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=sb.id), timeout=60)
                rt.RemovePodSandbox(
                    api_pb2.RemovePodSandboxRequest(pod_sandbox_id=sb.id), timeout=60
                )
        return found

    def _kill_leftover_processes(self, problems: list[str]) -> set[str]:
        """SIGKILL our monitors and all their descendants by PID; returns container cgroups."""
        monitors = self._monitors()
        victims = host.descendants(set(monitors))
        found = {p for pid in victims - set(monitors) for p in self._container_cgroups_of(pid)}
        # Children first, so none is re-parented away from its monitor while we work.
        for pid in sorted(victims - set(monitors)) + sorted(monitors):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(host.alive(p) for p in victims):
            time.sleep(0.05)
        survivors = sorted(p for p in victims if host.alive(p))
        if survivors:
            problems.append(f"processes survived SIGKILL: {survivors}")
        self._sandbox_ids.update(monitors.values())
        self._after_monitors_killed(monitors.values())
        return found

    def _remove_cgroups(self, container_cgroups: set[str]) -> list[str]:
        """rmdir container cgroups and their pod parents, then new empty dirs under our roots.

        The runtimes remove container cgroups but leave pod and QoS-level dirs (kubelet's
        job). Anything that existed before the first start() is left alone.
        """
        problems: list[str] = []
        for path in sorted(container_cgroups):
            problems += cgroups.remove_cgroup_dir(path)
        parents = {str(Path(p).parent) for p in container_cgroups}
        for parent in sorted(parents):
            # Siblings named as ours that no CRI list showed (CRI-O leaves the conmon cgroup
            # of a container whose creation failed): new ones only.
            for d in cgroups.cgroup_dirs(parent):
                for child in _subdirs(d):
                    if child not in self._preexisting and self._is_container_cgroup(
                        f"{parent}/{child.name}"
                    ):
                        problems += cgroups.remove_cgroup_dir(f"{parent}/{child.name}")
            problems += cgroups.remove_cgroup_dir(parent)
        roots = {Path(r.strip("/")) for r in self.cgroup_roots if r.strip("/")}
        for mount in cgroups.cgroup_mounts():
            # Under our roots: every new dir that is empty now (QoS tiers, pods removed
            # earlier by remove_pod). A dir that stays busy belongs to someone else.
            for root in roots:
                for d in _dirs_deepest_first(mount / root, self._preexisting):
                    with contextlib.suppress(OSError):
                        d.rmdir()
            # Above each pod and root: new ancestors only, one rmdir each, no sweeping.
            uppers = {Path(p.strip("/")).parent for p in parents} | roots
            for rel in sorted({a for u in uppers for a in (u, *u.parents)}, key=_depth_desc):
                d = mount / rel
                if rel != Path(".") and d not in self._preexisting:
                    with contextlib.suppress(OSError):
                        d.rmdir()
        return problems

    def _remove_cni_cache(self) -> None:
        # libcni caches results as <network>-<sandbox id>-<ifname>, also for the loopback
        # network; the runtime's CNI DEL removes them, a killed pod leaves them behind.
        for sandbox_id in self._sandbox_ids:
            for cache in CNI_CACHE_DIR.glob(f"*-{sandbox_id}-*"):
                cache.unlink(missing_ok=True)
        for cache in CNI_CACHE_DIR.glob(f"{self.network_name}-*"):
            cache.unlink(missing_ok=True)

    def _cgroups_from_info(self, info: Mapping[str, str]) -> set[str]:
        """The container cgroup from a verbose status' runtimeSpec (both runtimes put the
        OCI spec under info["info"]["runtimeSpec"]; cgroupsPath is parent/<name>)."""
        raw = info.get("info")
        if not raw:
            return set()
        spec = json.loads(raw).get("runtimeSpec") or {}
        path = (spec.get("linux") or {}).get("cgroupsPath") or ""
        return {path} if self._is_container_cgroup(path) else set()

    def _container_cgroups_of(self, pid: int) -> set[str]:
        """Container cgroups (absolute parent/<name>) a process is in, any hierarchy."""
        try:
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        except OSError:
            return set()
        return {p for line in lines if self._is_container_cgroup(p := line.split(":", 2)[-1])}

    def _is_container_cgroup(self, path: str) -> bool:
        # Absolute, under some parent (never the root itself), named as the runtime names
        # its containers.
        parts = path.split("/")
        return (
            path.startswith("/")
            and len(parts) >= 3
            and any(p.fullmatch(parts[-1]) for p in self.container_cgroups)
        )


# -- host helpers (module private) -----------------------------------------------------------


def _require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("the runtime lab needs root (mounts, cgroups, network namespaces)")


def _snapshot_host_dirs(cgroup_roots: Sequence[str], shared: Iterable[Path]) -> set[Path]:
    """Shared host dirs and cgroup dirs (under the roots, and the top two levels of every
    hierarchy) that exist now: cleanup never removes these."""
    found = {p for p in shared if p.exists()}
    for mount in cgroups.cgroup_mounts():
        for d1 in _subdirs(mount):
            found.add(d1)
            found.update(_subdirs(d1))
        for root in cgroup_roots:
            top = mount / root.strip("/")
            if top.is_dir() and top != mount:
                found.update(Path(d) for d, _, _ in os.walk(top))
    return found


def _dirs_deepest_first(top: Path, keep: set[Path]) -> Iterator[Path]:
    """top and the dirs below it, deepest first, leaving out those in keep and above them."""
    if not top.is_dir():
        return iter(())
    found = [Path(d) for d, _, _ in os.walk(top)]
    return iter(sorted((d for d in found if d not in keep), key=_depth_desc))


def _depth_desc(p: Path) -> int:
    return -len(p.parts)


def _subdirs(p: Path) -> list[Path]:
    try:
        return [e for e in p.iterdir() if e.is_dir()]
    except OSError:
        return []


def _step(problems: list[str], what: str, fn: Callable[[], object]) -> None:
    try:
        fn()
    except Exception as exc:  # teardown records and continues; cleanup() raises at the end
        problems.append(f"{what}: {exc!r}")


def _unused_subnet() -> str:
    """A 10.88.x.0/24 that no address or route of this host overlaps: two labs whose host
    addresses share a subnet (or a bridge left by a killed lab) send the host's packets for
    pods to the wrong bridge, and network specs time out."""
    taken: list[ipaddress.IPv4Network] = []
    shown = subprocess.run(
        ["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True, check=False
    )
    if shown.returncode == 0:
        for link in json.loads(shown.stdout or "[]"):
            for addr in link.get("addr_info", []):
                taken.append(ipaddress.ip_network(f"{addr['local']}/{addr['prefixlen']}", False))
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/route").read_text().splitlines()[1:]:
            fields = line.split()
            dest, mask = (
                ipaddress.IPv4Address(bytes.fromhex(f)[::-1]) for f in (fields[1], fields[7])
            )
            taken.append(ipaddress.ip_network(f"{dest}/{mask}", False))
    candidates = list(range(1, 255))
    random.shuffle(candidates)
    for x in candidates:
        net = ipaddress.ip_network(f"10.88.{x}.0/24")
        if not any(net.overlaps(t) for t in taken if t.prefixlen > 0):
            return str(net)
    raise LabError("no free 10.88.x.0/24 subnet for the lab's bridge")
