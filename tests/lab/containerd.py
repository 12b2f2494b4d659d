"""One private, real containerd (CRI plugin + runc + CNI bridge) under a temp directory.

By default it is Debian's containerd 1.6 from PATH; pass ``binaries=`` (for instance
``tests.lab.peers.containerd2()``) to run containerd 2.x instead. The config for either
comes from :mod:`tests.lab.containerd_config`. What containerd shares with the lab's other
runtime (CRI-O) is :class:`tests.lab.runtime_lab.RuntimeLab`.

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

import glob
import hashlib
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from tests.lab import host
from tests.lab.containerd_config import HOST_DROP_INS, LabConfig, config_toml, hosts_files
from tests.lab.images import LabImages
from tests.lab.runtime_lab import LabError, RuntimeLab, container_cgroup_pattern

__all__ = ["Containerd", "ContainerdBinaries", "LabError", "debian_binaries"]

log = logging.getLogger(__name__)

_SHIM_SOCKET_DIR = Path("/run/containerd/s")  # fixed in containerd 1.6
_K8S_NAMESPACE = "k8s.io"


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


class Containerd(RuntimeLab):
    """A containerd instance private to one test session (see :class:`RuntimeLab`)."""

    socket_name = "containerd.sock"
    config_name = "config.toml"
    log_name = "containerd.log"
    container_cgroups = (container_cgroup_pattern(),)  # <parent>/<id>
    process_name = "containerd"

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
        ``registry_mirror``: every host in ``containerd_config.REGISTRY_HOSTS`` resolves to
        it. ``nri_socket``: containerd 2.x only: enable NRI on this socket. The rest: see
        :class:`RuntimeLab`."""
        super().__init__(
            root_dir,
            images,
            subnet=subnet,
            start_timeout=start_timeout,
            cni_bin_dir=cni_bin_dir,
            cgroup_roots=cgroup_roots,
            registry_mirror=registry_mirror,
            host_reaches_pods=host_reaches_pods,
        )
        self._binaries = binaries
        self.nri_socket = nri_socket
        self._requested_snapshotter = snapshotter
        self.snapshotter = ""

    # -- paths and properties ------------------------------------------------------------

    @property
    def runtime(self) -> str:
        return "containerd-1.6" if self.major == 1 else f"containerd-{self.major}"

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

    # -- what RuntimeLab asks ------------------------------------------------------------

    def _prepare(self) -> None:
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
        for sub in ("root", "state", "runc", "opt"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.snapshotter = self._requested_snapshotter or self._probe_snapshotter()
        if self.registry_mirror is not None:
            for path, text in hosts_files(self.registry_config_path, self.registry_mirror).items():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
        self.config_path.write_text(self._config_toml())

    def _command(self) -> list[str]:
        return [str(self.binaries.containerd), "--config", str(self.config_path)]

    def _environment(self, env: dict[str, str]) -> None:
        if self.binaries.shim is not None:
            # containerd looks the shim up on PATH first: put the matching one ahead of
            # Debian's (2.x also gets it as runtime_path in the config).
            env["PATH"] = f"{self.binaries.shim.parent}:{env.get('PATH', '')}"

    def import_images(self) -> None:
        for image in self.images.all():
            self._ctr("images", "import", "--snapshotter", self.snapshotter, str(image.path))
        self._await_cri_images([image.ref for image in self.images.all()])

    def tag_image(self, source: str, ref: str) -> None:
        self._ctr("images", "tag", "--force", source, ref)
        self._await_cri_images([ref])

    def _await_cri_images(self, refs: Sequence[str], timeout: float = 30.0) -> None:
        """Wait until CRI knows ``refs``: its image cache follows ctr's changes through
        containerd's events, after ``ctr`` has returned (seen on 2.x under load)."""
        from crihook.api.cri.v1 import api_pb2, api_pb2_grpc

        deadline = time.monotonic() + timeout
        missing = list(refs)
        with grpc.insecure_channel(self.endpoint) as channel:
            images = api_pb2_grpc.ImageServiceStub(channel)
            while True:
                missing = [
                    ref
                    for ref in missing
                    if not images.ImageStatus(
                        api_pb2.ImageStatusRequest(image=api_pb2.ImageSpec(image=ref)),
                        timeout=max(1.0, deadline - time.monotonic()),
                    ).image.id
                ]
                if not missing:
                    return
                if time.monotonic() >= deadline:
                    raise LabError(
                        f"containerd's CRI does not know {missing} {timeout:.0f} s after ctr "
                        "made them"
                    )
                time.sleep(0.05)

    def _monitors(self) -> dict[int, str]:
        # runc v2 groups a pod under its sandbox id: the shim's id is the sandbox's.
        return _shims_for(str(self.socket_path))

    def _after_monitors_killed(self, ids: Iterable[str]) -> None:
        for shim_id in ids:
            # A killed shim leaves its socket, named sha256("<address>/<namespace>/<id>").
            key = f"{self.socket_path}/{_K8S_NAMESPACE}/{shim_id}".encode()
            (_SHIM_SOCKET_DIR / hashlib.sha256(key).hexdigest()).unlink(missing_ok=True)

    def _shared_dirs(self) -> tuple[Path, ...]:
        return (_SHIM_SOCKET_DIR, _SHIM_SOCKET_DIR.parent, *super()._shared_dirs())

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
                cni_conf_dir=self.cni_conf_dir,
                registry_config_path=(
                    self.registry_config_path if self.registry_mirror is not None else None
                ),
                nri_socket=self.nri_socket,
            )
        )

    def _probe_snapshotter(self) -> str:
        """overlayfs when a test overlay mount works here, else native."""
        return "overlayfs" if overlay_works(self.dir / "ovltest") else "native"

    def _ctr(self, *args: str) -> str:
        argv = [str(self.binaries.ctr), "--address", str(self.socket_path)]
        argv += ["-n", _K8S_NAMESPACE, *args]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if proc.returncode != 0:
            raise LabError(f"{' '.join(argv)} failed: {proc.stderr.strip()}")
        return proc.stdout


def overlay_works(base: Path) -> bool:
    """Whether a test overlay mount in ``base`` (made and removed here) works."""
    dirs = {n: base / n for n in ("lower", "upper", "work", "merged")}
    for p in dirs.values():
        p.mkdir(parents=True, exist_ok=True)
    opts = f"lowerdir={dirs['lower']},upperdir={dirs['upper']},workdir={dirs['work']}"
    try:
        host.mount("overlay", str(dirs["merged"]), "overlay", opts)
    except OSError as exc:
        log.warning("overlay mount failed (%s); using the native snapshotter", exc)
        return False
    else:
        host.umount(str(dirs["merged"]))
        return True
    finally:
        shutil.rmtree(base, ignore_errors=True)


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
