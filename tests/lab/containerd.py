"""One private, real containerd (CRI plugin + runc + CNI bridge) under a temp directory.

By default it is Debian's containerd 1.6 from PATH; pass ``binaries=`` (for instance
``tests.lab.peers.containerd2()``) to run containerd 2.x instead. The config for either
comes from :mod:`tests.lab.containerd_config`.

Everything it creates lives under ``root_dir`` except what containerd / runc / CNI put in
fixed places: shim sockets in ``/run/containerd/s``, pod cgroups under
``/sys/fs/cgroup/*/<cgroup parent>``, the bridge interface, and CNI result cache files in
``/var/lib/cni/results``. :meth:`Containerd.cleanup` removes all of those that are ours.

Never call PullImage against it unless ``registry_mirror`` is set: with no mirror no
registry is reachable, and containerd would try the internet. The two lab images are
imported from local archives instead. With ``registry_mirror`` (the loopback registry of
:mod:`tests.lab.registry`), every registry critest uses resolves to that mirror only.
"""

from __future__ import annotations

import contextlib
import glob
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
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import grpc

from tests.lab import cgroups, host
from tests.lab.containerd_config import HOST_DROP_INS, LabConfig, config_toml, hosts_files
from tests.lab.images import LabImages, build_images

__all__ = ["Containerd", "ContainerdBinaries", "LabError", "debian_binaries"]

log = logging.getLogger(__name__)

_SOCKET_PATH_MAX = 107  # sun_path is 108 bytes including the NUL
_SHIM_SOCKET_DIR = Path("/run/containerd/s")  # fixed in containerd 1.6
_CNI_CACHE_DIR = Path("/var/lib/cni/results")  # libcni's default; containerd has no option
_VERSION_METHOD = "/runtime.v1.RuntimeService/Version"
_K8S_NAMESPACE = "k8s.io"
_DEAD_PROXY = "http://127.0.0.1:9"  # the discard port: nothing listens there
_CONTAINER_ID = re.compile(r"[0-9a-f]{64}")


class LabError(RuntimeError):
    """The test bed could not be set up or torn down; the message says what and why."""


@dataclass(frozen=True)
class ContainerdBinaries:
    """Which containerd to run. ``shim``: None finds containerd-shim-runc-v2 on PATH."""

    containerd: Path
    ctr: Path
    runc: Path
    major: int  # 1 or 2: picks the config schema
    shim: Path | None = None


def debian_binaries() -> ContainerdBinaries:
    """Debian's containerd 1.6, ctr and runc from PATH (tests/lab/install.sh)."""
    found = {tool: shutil.which(tool) for tool in ("containerd", "ctr", "runc")}
    missing = [tool for tool, path in found.items() if path is None]
    if missing:
        raise LabError(f"{', '.join(missing)} not found: run tests/lab/install.sh")
    return ContainerdBinaries(
        containerd=Path(str(found["containerd"])),
        ctr=Path(str(found["ctr"])),
        runc=Path(str(found["runc"])),
        major=1,
    )


class Containerd:
    """A containerd instance private to one test session.

    ``root_dir`` must exist or be creatable and be short (the socket path inside it is
    limited to 107 bytes). ``start()`` configures and launches containerd and imports
    the lab images; ``cleanup()`` removes everything it started. ``restart()`` keeps the
    root, so running pods survive it.
    """

    def __init__(
        self,
        root_dir: Path | str,
        images: LabImages | None = None,
        *,
        snapshotter: str | None = None,
        subnet: str | None = None,
        start_timeout: float = 120.0,  # a loaded 2-core machine: it answers when it answers
        cni_bin_dir: str = "/usr/lib/cni",
        cgroup_roots: Sequence[str] = ("/kubepods",),
        binaries: ContainerdBinaries | None = None,
        registry_mirror: str | None = None,
        host_reaches_pods: bool = False,
        nri_socket: Path | None = None,
    ) -> None:
        """``binaries``: which containerd (default: Debian's 1.6 from PATH, found at start).
        ``registry_mirror``: URL of a registry (``http://127.0.0.1:PORT``) that every host in
        ``containerd_config.REGISTRY_HOSTS`` resolves to; None: no registry at all.
        ``host_reaches_pods``: give the bridge the subnet's first address, so the host can
        reach pod IPs (as a node's bridge can); no routes or forwarding are added.
        ``nri_socket``: containerd 2.x only: enable NRI on this socket."""
        self.dir = Path(root_dir).absolute()
        self._images = images
        self._binaries = binaries
        self.registry_mirror = registry_mirror
        self.host_reaches_pods = host_reaches_pods
        self.nri_socket = nri_socket
        self._requested_snapshotter = snapshotter
        self.start_timeout = start_timeout
        self.cni_bin_dir = cni_bin_dir
        # Names derive from the directory so two sessions on one host never collide.
        tag = hashlib.sha256(str(self.dir).encode()).hexdigest()[:8]
        self.bridge = f"crih{tag}"  # IFNAMSIZ: at most 15 characters
        self.network_name = f"crihook-{tag}"
        self.subnet = subnet or _unused_subnet()
        self.snapshotter = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        self._started = False
        self._was_ready = False  # CRI answered at least once: there may be pods to remove
        # Pod cgroup roots (kubelet's --cgroup-root) whose new, empty dirs cleanup removes.
        self.cgroup_roots = tuple(cgroup_roots)
        # Host paths outside root_dir that existed before the first start: never removed.
        self._preexisting: set[Path] = set()
        # Sandbox ids seen at cleanup (CRI list, shim ids): their CNI cache files go too.
        self._sandbox_ids: set[str] = set()
        # cleanup() deletes root_dir: accept only an empty dir or an earlier lab root.
        if self.dir.is_dir() and any(self.dir.iterdir()) and not self.config_path.exists():
            raise LabError(f"{self.dir} is not empty and not a lab root; refusing to use it")
        if len(str(self.socket_path)) > _SOCKET_PATH_MAX:
            raise LabError(
                f"socket path {self.socket_path} is longer than {_SOCKET_PATH_MAX} bytes; "
                "use a shorter root_dir"
            )

    # -- paths and properties ------------------------------------------------------------

    @property
    def socket_path(self) -> Path:
        return self.dir / "containerd.sock"

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket_path}"

    @property
    def log_path(self) -> Path:
        return self.dir / "containerd.log"

    @property
    def config_path(self) -> Path:
        return self.dir / "config.toml"

    @property
    def registry_config_path(self) -> Path:
        """Where the <host>/hosts.toml files live (used only with ``registry_mirror``)."""
        return self.dir / "certs.d"

    @property
    def binaries(self) -> ContainerdBinaries:
        if self._binaries is None:
            self._binaries = debian_binaries()
        return self._binaries

    @property
    def major(self) -> int:
        """containerd's major version (1 or 2)."""
        return self.binaries.major

    @property
    def bridge_address(self) -> str:
        """The host's address on the pod bridge (``host_reaches_pods``): the subnet's first."""
        net = ipaddress.ip_network(self.subnet)
        return f"{net.network_address + 1}/{net.prefixlen}"

    @property
    def pod_log_dir(self) -> Path:
        """Where a kubelet-like client should put pod log directories (like /var/log/pods)."""
        return self.dir / "pods"

    @property
    def pid(self) -> int | None:
        """PID of the containerd process, or None when it is not running."""
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

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Write the config, launch containerd, wait for CRI, import the lab images."""
        if self.running:
            raise LabError(f"containerd is already running (pid {self.pid})")
        _require_root()
        if shutil.which("ip") is None:
            raise LabError("ip not found: run tests/lab/install.sh")
        binaries = self.binaries
        if self.nri_socket is not None and binaries.major < 2:
            raise LabError(f"NRI needs containerd 2.x; {binaries.containerd} is {binaries.major}.x")
        drop_ins = sorted(glob.glob(HOST_DROP_INS)) if binaries.major >= 2 else []
        if drop_ins:
            raise LabError(
                f"containerd 2.x would merge the host's drop-in config {', '.join(drop_ins)} "
                "into the lab's (it always imports them): move them away to run the lab"
            )
        for path in (binaries.containerd, binaries.ctr, binaries.runc, binaries.shim):
            if path is not None and not os.access(path, os.X_OK):
                raise LabError(f"{path} is not an executable file")
        for sub in ("root", "state", "runc", "opt", "cni/net.d", "cni/ipam", "pods"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        if not self._started:
            self._preexisting = _snapshot_host_dirs(self.cgroup_roots)
        self.snapshotter = self._requested_snapshotter or self._probe_snapshotter()
        if self.registry_mirror is not None:
            for path, text in hosts_files(self.registry_config_path, self.registry_mirror).items():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
        self.config_path.write_text(self._config_toml())
        conflist = self.dir / "cni/net.d/10-crihook.conflist"
        conflist.write_text(json.dumps(self._cni_conflist(), indent=2))
        self._started = True
        if self.host_reaches_pods:
            self._create_bridge()
        self._launch()
        self.import_images()

    def import_images(self) -> None:
        """(Re-)import the lab images; a test that removed one puts it back with this."""
        for image in self.images.all():
            self._ctr("images", "import", "--snapshotter", self.snapshotter, str(image.path))

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM containerd and wait for it; shims and containers keep running."""
        self._terminate(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """SIGKILL containerd (fault tests); shims and containers keep running."""
        self._terminate(signal.SIGKILL, 10.0)

    def restart(self) -> None:
        """Stop (if running) and start again on the same root; running pods survive."""
        if not self._started:
            raise LabError("restart() before start()")
        self.stop()
        self._launch()

    def ensure_running(self) -> None:
        """Relaunch on the same root if a test stopped or killed containerd."""
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
        # Container cgroups (<parent>/<64-hex id>) seen through CRI or on live processes:
        # only these and their parents are removed, never anything else under the root.
        container_cgroups: set[str] = set()
        # Sandboxes are removed through CRI so containerd runs CNI DEL and runc delete.
        # After kill() that needs containerd up again, on the same root.
        if not self.running and self._was_ready:
            try:
                self._launch()
            except LabError as exc:
                problems.append(f"could not relaunch containerd for cleanup: {exc}")
        if self.running:
            try:
                container_cgroups |= self._remove_all_sandboxes()
            except Exception as exc:  # keep tearing down: the remaining steps still matter
                problems.append(f"removing sandboxes via CRI: {exc!r}")
        _step(problems, "stopping containerd", self.stop)
        container_cgroups |= self._kill_leftover_processes(problems)
        left = host.unmount_under(self.dir)
        if left:
            problems.append(f"could not unmount: {left}")
        problems += self._remove_cgroups(container_cgroups)
        _step(problems, "deleting the bridge", self._delete_bridge)
        self._remove_cni_cache()
        # containerd/CNI create these shared dirs on first use; drop them if we did and
        # they are empty now (a concurrent lab keeps them busy, and then they stay).
        for shared in (
            _SHIM_SOCKET_DIR,
            _SHIM_SOCKET_DIR.parent,
            _CNI_CACHE_DIR,
            _CNI_CACHE_DIR.parent,
        ):
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
            raise LabError("containerd lab cleanup incomplete:\n  " + "\n  ".join(problems))

    # -- config --------------------------------------------------------------------------

    def _config_toml(self) -> str:
        return config_toml(
            LabConfig(
                major=self.binaries.major,
                dir=self.dir,
                socket=self.socket_path,
                snapshotter=self.snapshotter,
                sandbox_image=self.images.pause.ref,
                runc=self.binaries.runc,
                shim=self.binaries.shim,
                cni_bin_dir=self.cni_bin_dir,
                cni_conf_dir=self.dir / "cni/net.d",
                registry_config_path=(
                    self.registry_config_path if self.registry_mirror is not None else None
                ),
                nri_socket=self.nri_socket,
            )
        )

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

    def _probe_snapshotter(self) -> str:
        """overlayfs when a test overlay mount works here, else native."""
        base = self.dir / "ovltest"
        dirs = {n: base / n for n in ("lower", "upper", "work", "merged")}
        for p in dirs.values():
            p.mkdir(parents=True, exist_ok=True)
        opts = f"lowerdir={dirs['lower']},upperdir={dirs['upper']},workdir={dirs['work']}"
        try:
            host.mount("overlay", str(dirs["merged"]), "overlay", opts)
        except OSError as exc:
            log.warning("overlay mount failed (%s); using the native snapshotter", exc)
            return "native"
        else:
            host.umount(str(dirs["merged"]))
            return "overlayfs"
        finally:
            shutil.rmtree(base, ignore_errors=True)

    # -- process control -----------------------------------------------------------------

    def _launch(self) -> None:
        self._close_log()
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115  (lives as long as containerd)
        self._log_file.write(f"--- crihook lab: launching at {time.time():.3f}\n".encode())
        self._log_file.flush()
        self.socket_path.unlink(missing_ok=True)
        env = dict(os.environ)
        # A safety net: whatever the registry config says, containerd's HTTP clients can
        # reach nothing but loopback. Requests elsewhere go to a closed local port (and
        # are not even resolved: the proxy would do that); Go never proxies loopback.
        for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
            env[var] = _DEAD_PROXY
        for var in ("NO_PROXY", "no_proxy"):
            env[var] = "127.0.0.1,localhost,::1"
        if self.binaries.shim is not None:
            # containerd looks the shim up on PATH first: put the matching one ahead of
            # Debian's (2.x also gets it as runtime_path in the config).
            env["PATH"] = f"{self.binaries.shim.parent}:{env.get('PATH', '')}"
        self._proc = subprocess.Popen(
            [str(self.binaries.containerd), "--config", str(self.config_path)],
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
        """Poll CRI Version over gRPC; it answers only once the CRI plugin is serving."""
        deadline = time.monotonic() + self.start_timeout
        last_error = "socket not created"
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                code = None if self._proc is None else self._proc.returncode
                raise LabError(f"containerd exited with {code} during start\n{self._log_tail()}")
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
            f"containerd did not answer CRI Version within {self.start_timeout}s "
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
                log.warning("containerd ignored %s for %.0fs; killing it", sig.name, timeout)
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
            return "(no containerd log)"
        return f"--- last lines of {self.log_path}:\n" + "\n".join(text[-lines:])

    def _ctr(self, *args: str) -> str:
        argv = [str(self.binaries.ctr), "--address", str(self.socket_path)]
        argv += ["-n", _K8S_NAMESPACE, *args]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if proc.returncode != 0:
            raise LabError(f"{' '.join(argv)} failed: {proc.stderr.strip()}")
        return proc.stdout

    # -- cleanup steps ---------------------------------------------------------------------

    def _remove_all_sandboxes(self) -> set[str]:
        """StopPodSandbox + RemovePodSandbox for every sandbox; returns container cgroups."""
        from crihook.api.cri.v1 import api_pb2, api_pb2_grpc  # stubs only needed here

        found: set[str] = set()
        with grpc.insecure_channel(self.endpoint) as channel:
            rt = api_pb2_grpc.RuntimeServiceStub(channel)
            for c in rt.ListContainers(api_pb2.ListContainersRequest(), timeout=30).containers:
                status = rt.ContainerStatus(
                    api_pb2.ContainerStatusRequest(container_id=c.id, verbose=True), timeout=30
                )
                found |= _cgroups_from_info(status.info)
            for sb in rt.ListPodSandbox(api_pb2.ListPodSandboxRequest(), timeout=30).items:
                self._sandbox_ids.add(sb.id)
                status = rt.PodSandboxStatus(
                    api_pb2.PodSandboxStatusRequest(pod_sandbox_id=sb.id, verbose=True),
                    timeout=30,
                )
                found |= _cgroups_from_info(status.info)
                rt.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=sb.id), timeout=60)
                rt.RemovePodSandbox(
                    api_pb2.RemovePodSandboxRequest(pod_sandbox_id=sb.id), timeout=60
                )
        return found

    def _kill_leftover_processes(self, problems: list[str]) -> set[str]:
        """SIGKILL our shims and all their descendants by PID; returns container cgroups."""
        shims = _shims_for(str(self.socket_path))
        victims = host.descendants(set(shims))
        found = {p for pid in victims - set(shims) for p in _container_cgroups_of(pid)}
        # Children first, so none is re-parented away from the shim while we work.
        for pid in sorted(victims - set(shims)) + sorted(shims):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(host.alive(p) for p in victims):
            time.sleep(0.05)
        survivors = sorted(p for p in victims if host.alive(p))
        if survivors:
            problems.append(f"processes survived SIGKILL: {survivors}")
        self._sandbox_ids.update(shims.values())  # runc v2 groups a pod under its sandbox id
        for shim_id in shims.values():
            # A killed shim leaves its socket, named sha256("<address>/<namespace>/<id>").
            key = f"{self.socket_path}/{_K8S_NAMESPACE}/{shim_id}".encode()
            (_SHIM_SOCKET_DIR / hashlib.sha256(key).hexdigest()).unlink(missing_ok=True)
        return found

    def _remove_cgroups(self, container_cgroups: set[str]) -> list[str]:
        """rmdir container cgroups and their pod parents, then new empty dirs under our roots.

        containerd removes container cgroups but leaves pod and QoS-level dirs (kubelet's
        job). Anything that existed before the first start() is left alone.
        """
        problems: list[str] = []
        for path in sorted(container_cgroups):
            problems += cgroups.remove_cgroup_dir(path)
        parents = {str(Path(p).parent) for p in container_cgroups}
        for parent in sorted(parents):
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
        # network; containerd's CNI DEL removes them, a killed pod leaves them behind.
        for sandbox_id in self._sandbox_ids:
            for cache in _CNI_CACHE_DIR.glob(f"*-{sandbox_id}-*"):
                cache.unlink(missing_ok=True)
        for cache in _CNI_CACHE_DIR.glob(f"{self.network_name}-*"):
            cache.unlink(missing_ok=True)

    def _create_bridge(self) -> None:
        """Create the bridge with the host's address before CNI does (it reuses it).

        host-local never hands out the range's gateway (the first address), so the host
        owns it alone; the connected route lets the host reach pod IPs, nothing else."""
        if Path(f"/sys/class/net/{self.bridge}").exists():
            return
        for argv in (
            ["ip", "link", "add", "name", self.bridge, "type", "bridge"],
            ["ip", "addr", "add", self.bridge_address, "dev", self.bridge],
            ["ip", "link", "set", self.bridge, "up"],
        ):
            proc = subprocess.run(argv, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise LabError(f"{' '.join(argv)} failed: {proc.stderr.strip()}")

    def _delete_bridge(self) -> None:
        if Path(f"/sys/class/net/{self.bridge}").exists():
            subprocess.run(["ip", "link", "delete", self.bridge], check=True, capture_output=True)


# -- host helpers (module private) -----------------------------------------------------------


def _require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("the containerd lab needs root (mounts, cgroups, network namespaces)")


def _snapshot_host_dirs(cgroup_roots: Sequence[str]) -> set[Path]:
    """Shared host dirs and cgroup dirs (under the roots, and the top two levels of every
    hierarchy) that exist now: cleanup never removes these."""
    found = {
        p
        for p in (_SHIM_SOCKET_DIR, _SHIM_SOCKET_DIR.parent, _CNI_CACHE_DIR, _CNI_CACHE_DIR.parent)
        if p.exists()
    }
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


def _cgroups_from_info(info: Mapping[str, str]) -> set[str]:
    """The container cgroup from a verbose status' runtimeSpec (cgroupsPath = parent/id)."""
    raw = info.get("info")
    if not raw:
        return set()
    spec = json.loads(raw).get("runtimeSpec") or {}
    path = (spec.get("linux") or {}).get("cgroupsPath") or ""
    return {path} if _is_container_cgroup(path) else set()


def _container_cgroups_of(pid: int) -> set[str]:
    """Container cgroups (absolute parent/<64-hex id>) a process is in, any hierarchy."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return set()
    return {p for line in lines if _is_container_cgroup(p := line.split(":", 2)[-1])}


def _is_container_cgroup(path: str) -> bool:
    # Absolute, under some parent (never the root itself), named by a container id.
    parts = path.split("/")
    return path.startswith("/") and len(parts) >= 3 and bool(_CONTAINER_ID.fullmatch(parts[-1]))


def _shims_for(socket_path: str) -> dict[int, str]:
    """pid -> shim id for every containerd shim serving the containerd at socket_path."""
    shims: dict[int, str] = {}
    for pid, (_, argv) in host.proc_table().items():
        if not argv or "containerd-shim" not in os.path.basename(argv[0]):
            continue
        opts = {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("-")}
        if opts.get("-address") == socket_path:
            shims[pid] = opts.get("-id", "")
    return shims


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
