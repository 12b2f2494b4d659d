"""One private, real CRI-O (with conmon, runc or crun, and a CNI bridge) under a temp directory.

The lab's second runtime, beside :mod:`tests.lab.containerd`; what both share is
:class:`tests.lab.runtime_lab.RuntimeLab`. CRI-O is built here (``tests.lab.peers.crio()``);
conmon is Debian's; the OCI runtime is the runc built here (``runtime="runc"``) or Debian's
crun (``runtime="crun"``). The config files come from :mod:`tests.lab.crio_config`: its own
root, run root, socket, cgroupfs, config dir, conmon, pause image, registries and image
policy; nothing is read from or written to /etc/crio, /etc/containers or
/var/lib/containers.

Images: CRI-O has no import command, so the lab images are pulled through CRI, from a
loopback registry this lab starts (:mod:`tests.lab.registry`) serving the lab's two image
archives. With ``registry_mirror`` (the conformance bed's stand-ins) every registry critest
pulls from resolves to that mirror too. The proxy safety net of :class:`RuntimeLab` holds
for CRI-O as for containerd: nothing can reach a registry off the machine.

Log dirs: conmon opens a container's log file but never makes its directory (kubelet does,
containerd would); the lab's conmon is a front that makes it, for the clients that are not
kubelet (crictl, tests sending CreateContainer themselves).

What CRI-O puts outside the root: pod cgroups under ``/sys/fs/cgroup/*/<cgroup parent>``
(containers in ``crio-<id>``, their conmon in ``crio-conmon-<id>``), the bridge, CNI result
caches in ``/var/lib/cni/results``. :meth:`Crio.cleanup` removes those that are ours.

OOM scores and capabilities: root here lacks CAP_SYS_RESOURCE (in its bounding set too), so
no process can lower its oom_score_adj below its parent's, and runc cannot grant that
capability. containerd has ``restrict_oom_score_adj`` for the first and takes "all
capabilities" from the current bounding set; CRI-O has no such setting, gives every infra
container -998 and a privileged container every capability it knows, so without help those
pods fail. The lab's OCI runtime is then a front (:data:`SPEC_FRONT`) that raises a spec's
oomScoreAdj to the lowest value allowed, drops capabilities the host cannot grant and hugepage
limits where no hugetlb cgroup is mounted (a real kubelet sends them), before runc creates
the container, as containerd does. CRI-O still reports what it asked for (its
verbose status shows its own spec): docs/test-bed.md lists this among the differences.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from tests.lab import host
from tests.lab.containerd import overlay_works
from tests.lab.containerd_config import REGISTRY_HOSTS
from tests.lab.crio_config import (
    CrioConfig,
    crio_conf,
    policy_json,
    registries_conf,
    storage_conf,
)
from tests.lab.images import ImageArchive, LabImages
from tests.lab.oci import Image
from tests.lab.registry import Catalog, Registry
from tests.lab.runtime_lab import LabError, RuntimeLab, container_cgroup_pattern

__all__ = ["SPEC_FRONT", "Crio", "CrioBinaries", "archive_image", "crio_helpers"]

RUNTIMES = ("runc", "crun")

# containers/image keeps a blob-info cache (which layers each registry has) at this fixed
# path when it runs as root; CRI-O has no setting for it (SystemContext.BlobInfoCacheDir).
_BLOB_INFO_CACHE = Path("/var/lib/containers/cache/blob-info-cache-v1.sqlite")

SPEC_FRONT = """\
# The lab's OCI runtime front (tests/lab/crio.py): before the real runtime creates a
# container, the bundle's spec gets what this VM allows: process.oomScoreAdj raised to this
# process's own score (nothing here may lower one), and capabilities outside the host's
# bounding set dropped (runc cannot grant them), and hugepage limits dropped where no hugetlb
# cgroup is mounted (runc cannot set them: kubelet sends one per page size, 0 by default).
# containerd does all three itself (restrict_oom_score_adj; "all capabilities" are the
# current bounding set; disable_hugetlb_controller). Only `create`
# and `run` come here, and `exec` (its process file: capabilities only); every other command
# goes straight to the runtime.
import json, os, sys

CAPS = (
    "CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP "
    "LINUX_IMMUTABLE NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER "
    "SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE "
    "SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP "
    "MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF "
    "CHECKPOINT_RESTORE"
).split()

real, args = sys.argv[1], sys.argv[2:]
bundle, process_file = ".", None
for i, arg in enumerate(args):
    value = args[i + 1] if i + 1 < len(args) else None
    if arg in ("--bundle", "-b"):
        bundle = value
    elif arg.startswith("--bundle="):
        bundle = arg.split("=", 1)[1]
    elif arg in ("--process", "-p"):
        process_file = value
    elif arg.startswith("--process="):
        process_file = arg.split("=", 1)[1]
path = process_file or os.path.join(bundle, "config.json")
with open("/proc/self/oom_score_adj") as f:
    floor = int(f.read())
with open("/proc/self/status") as f:
    bounding = next(int(line.split()[1], 16) for line in f if line.startswith("CapBnd:"))
allowed = {"CAP_" + name for bit, name in enumerate(CAPS) if bounding >> bit & 1}
with open(path) as f:
    spec = json.load(f)
process = spec if process_file else spec.get("process") or {}
changed = False
score = process.get("oomScoreAdj")
if score is not None and score < floor and not process_file:
    process["oomScoreAdj"] = floor
    changed = True
for kind, caps in (process.get("capabilities") or {}).items():
    kept = [c for c in caps if c in allowed]
    if kept != caps:
        process["capabilities"][kind] = kept
        changed = True
resources = (spec.get("linux") or {}).get("resources") or {}
if resources.get("hugepageLimits") and not process_file:
    unified = "/sys/fs/cgroup/cgroup.controllers"
    if os.path.exists(unified):
        with open(unified) as f:
            hugetlb = "hugetlb" in f.read().split()
    else:
        hugetlb = os.path.isdir("/sys/fs/cgroup/hugetlb")
    if not hugetlb:
        del resources["hugepageLimits"]
        changed = True
if changed:
    with open(path + ".lab", "w") as f:
        json.dump(spec, f)
    os.replace(path + ".lab", path)
os.execv(real, [real, *args])
"""

# conmon opens the container's log file (-l PATH) but, unlike containerd, never makes its
# directory: kubelet does, before CreateContainer. The lab's other clients (crictl sessions,
# tests that send CreateContainer themselves) do not, so conmon runs behind this front.
_CONMON_FRONT = """\
#!/bin/sh
prev=
for arg in "$@"; do
    if [ "$prev" = -l ]; then
        mkdir -p "$(dirname "$arg")"
    fi
    prev=$arg
done
exec {real} "$@"
"""

_FRONT = """\
#!/bin/sh
for arg in "$@"; do
    if [ "$arg" = create ] || [ "$arg" = run ] || [ "$arg" = exec ]; then
        exec {python} -I {clamp} {real} "$@"
    fi
done
exec {real} "$@"
"""


@dataclass(frozen=True)
class CrioBinaries:
    crio: Path
    pinns: Path
    conmon: Path
    runc: Path  # the runc built here
    crun: Path | None  # Debian's crun, if installed


def crio_helpers(*, crio: Path, pinns: Path, runc: Path) -> CrioBinaries:
    """CRI-O and pinns (built here) with Debian's conmon and crun from PATH."""
    conmon = shutil.which("conmon")
    if conmon is None:
        raise LabError("conmon not found: run tests/lab/install.sh")
    crun = shutil.which("crun")
    return CrioBinaries(
        crio=crio, pinns=pinns, conmon=Path(conmon), runc=runc, crun=Path(crun) if crun else None
    )


def archive_image(archive: ImageArchive) -> Image:
    """The image inside one of the lab's OCI archives (index.json -> manifest -> blobs)."""
    import tarfile

    with tarfile.open(archive.path) as tar:

        def blob(digest: str) -> bytes:
            member = tar.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
            if member is None:
                raise LabError(f"{archive.path} lacks blob {digest}")
            return member.read()

        manifest = blob(archive.manifest_digest)
        doc = json.loads(manifest)
        layers = tuple(blob(layer["digest"]) for layer in doc["layers"])
        return Image(manifest=manifest, config=blob(doc["config"]["digest"]), layers=layers)


class Crio(RuntimeLab):
    """A CRI-O instance private to one test session (see :class:`RuntimeLab`)."""

    socket_name = "crio.sock"
    config_name = "crio.conf"
    log_name = "crio.log"
    # <parent>/crio-<id> for a container, <parent>/crio-conmon-<id> for its conmon.
    container_cgroups = (
        container_cgroup_pattern("crio-"),
        container_cgroup_pattern("crio-conmon-"),
    )
    process_name = "CRI-O"
    fixed_bridge_mac = True  # CRI-O runs CNI CHECK (see RuntimeLab.fixed_bridge_mac)

    def __init__(
        self,
        root_dir: Path | str,
        images: LabImages | None = None,
        *,
        binaries: CrioBinaries,
        runtime: str = "runc",
        subnet: str | None = None,
        start_timeout: float = 60.0,
        cni_bin_dir: str = "/usr/lib/cni",
        cgroup_roots: Sequence[str] = ("/kubepods",),
        registry_mirror: str | None = None,
        host_reaches_pods: bool = False,
        nri_socket: Path | None = None,
    ) -> None:
        """``binaries``: :func:`tests.lab.peers.crio`. ``runtime``: the OCI runtime, runc
        (built here) or crun (Debian's). ``nri_socket``: enable NRI on this socket (CRI-O
        has NRI built in; off otherwise). The rest: see :class:`RuntimeLab`."""
        if runtime not in RUNTIMES:
            raise LabError(f"no OCI runtime {runtime!r} for CRI-O; choose one of {RUNTIMES}")
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
        self.binaries = binaries
        self.oci_runtime = runtime
        self.nri_socket = nri_socket
        self.storage_driver = ""
        self._registry: Registry | None = None

    # -- paths and properties ------------------------------------------------------------

    @property
    def runtime(self) -> str:
        return "crio"

    @property
    def attach_dir(self) -> Path:
        """Where conmon puts each container's attach socket (``<dir>/<id>/attach``). A unix
        socket path has at most 107 bytes and the id alone is 64: under a deep lab root (the
        conformance bed's) they do not fit, so a short dir of its own, unique per lab."""
        return Path(f"/tmp/crihook-at-{self.bridge.removeprefix('crih')}")

    @property
    def config_dir(self) -> Path:
        """CRI-O's drop-in dir (``--config-dir``): empty, but the lab's own."""
        return self.dir / "crio.conf.d"

    def oci_runtime_path(self, name: str) -> Path:
        if name == "crun":
            if self.binaries.crun is None:
                raise LabError("crun not found: run tests/lab/install.sh")
            return self.binaries.crun
        return self.binaries.runc

    def _handlers(self) -> list[str]:
        """The runtime handlers: the default first, then crun where it is installed."""
        others = [n for n in RUNTIMES if n != self.oci_runtime]
        if self.binaries.crun is None:
            others = [n for n in others if n != "crun"]
        return [self.oci_runtime, *others]

    def container_cgroup_name(self, container_id: str) -> str:
        return f"crio-{container_id}"

    # -- what RuntimeLab asks ------------------------------------------------------------

    def _prepare(self) -> None:
        b = self.binaries
        for path in (b.crio, b.pinns, b.conmon, self.oci_runtime_path(self.oci_runtime)):
            if not os.access(path, os.X_OK):
                raise LabError(f"{path} is not an executable file")
        for sub in ("storage", "run", "keys", "hooks.d", "cdi", "tmp", "policies", "bin"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.config_dir.mkdir(exist_ok=True)
        self.attach_dir.mkdir(exist_ok=True)
        if not self.storage_driver:
            self.storage_driver = "overlay" if overlay_works(self.dir / "ovltest") else "vfs"
        if self._registry is None:
            catalog = Catalog()
            for archive in self.images.all():
                catalog.add(archive_image(archive), [archive.ref])
            self._registry = Registry(catalog).start()
        config = CrioConfig(
            dir=self.dir,
            socket=self.socket_path,
            storage_driver=self.storage_driver,
            pause_image=self.images.pause.ref,
            runtime_name=self.oci_runtime,
            runtimes={name: self._runtime_front(name) for name in self._handlers()},
            conmon=self._conmon_front(),
            pinns=b.pinns,
            cni_bin_dir=self.cni_bin_dir,
            cni_conf_dir=self.cni_conf_dir,
            attach_dir=self.attach_dir,
            nri_socket=self.nri_socket,
        )
        self.config_path.write_text(crio_conf(config))
        (self.dir / "storage.conf").write_text(storage_conf(config))
        (self.dir / "policy.json").write_text(policy_json())
        mirror = self.registry_mirror.removeprefix("http://") if self.registry_mirror else None
        lab_registry = self._registry.url.removeprefix("http://")
        (self.dir / "registries.conf").write_text(
            registries_conf(lab_registry, mirror, REGISTRY_HOSTS)
        )

    def _command(self) -> list[str]:
        return [
            str(self.binaries.crio),
            "--config",
            str(self.config_path),
            "--config-dir",
            str(self.config_dir),
            "--registries-conf",
            str(self.dir / "registries.conf"),
            "--registries-conf-dir",
            str(self.dir / "registries.conf.d"),
        ]

    def _environment(self, env: dict[str, str]) -> None:
        # containers/storage and containers/common read these before CRI-O's own config.
        env["CONTAINERS_STORAGE_CONF"] = str(self.dir / "storage.conf")
        env["CONTAINERS_REGISTRIES_CONF"] = str(self.dir / "registries.conf")
        env["CONTAINERS_CONF"] = str(self.dir / "containers.conf")
        (self.dir / "containers.conf").touch()
        # conmon and pinns are found by path; the OCI runtime too (runtime_path).
        env["PATH"] = f"{self.binaries.conmon.parent}:{env.get('PATH', '')}"

    def import_images(self) -> None:
        """Pull the lab images through CRI from the lab registry (CRI-O imports nothing)."""
        self._pull([archive.ref for archive in self.images.all()])

    def tag_image(self, source: str, ref: str) -> None:
        """Serve ``source``'s image as ``ref`` (a ``localhost/crihook/...`` name) from the
        lab registry too, and pull it: CRI has no tag call, and CRI-O no other door."""
        if self._registry is None:
            raise LabError("tag_image() before start()")
        (archive,) = [a for a in self.images.all() if a.ref == source]
        self._registry.catalog.add(archive_image(archive), [ref])
        self._pull([ref])

    def _pull(self, refs: Sequence[str]) -> None:
        from crihook.api.cri.v1 import api_pb2, api_pb2_grpc

        with grpc.insecure_channel(self.endpoint) as channel:
            images = api_pb2_grpc.ImageServiceStub(channel)
            for ref in refs:
                try:
                    images.PullImage(
                        api_pb2.PullImageRequest(image=api_pb2.ImageSpec(image=ref)),
                        timeout=120,
                    )
                except grpc.RpcError as exc:
                    raise LabError(
                        f"CRI-O could not pull {ref} from the lab registry: "
                        f"{exc.code().name}: {exc.details()}\n{self._log_tail()}"
                    ) from exc

    def _monitors(self) -> dict[int, str]:
        """pid -> container id of every conmon serving a container of this lab (its
        arguments name paths under the root)."""
        found: dict[int, str] = {}
        root = str(self.dir) + "/"
        for pid, (_, argv) in host.proc_table().items():
            if not argv or os.path.basename(argv[0]) != "conmon":
                continue
            if not any(a.startswith(root) or f"={root}" in a for a in argv):
                continue
            opts = {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("-")}
            found[pid] = opts.get("--cid") or opts.get("-c") or ""
        return found

    def _shared_dirs(self) -> tuple[Path, ...]:
        return (_BLOB_INFO_CACHE.parent, _BLOB_INFO_CACHE.parent.parent, *super()._shared_dirs())

    def cleanup(self) -> None:
        try:
            super().cleanup()
        finally:
            if self._registry is not None:
                self._registry.stop()
                self._registry = None
            shutil.rmtree(self.attach_dir, ignore_errors=True)
            # The one file CRI-O writes outside the root (see _BLOB_INFO_CACHE): ours when
            # the lab made its directory; removed with it.
            cache_dir = _BLOB_INFO_CACHE.parent
            if cache_dir not in self._preexisting:
                _BLOB_INFO_CACHE.unlink(missing_ok=True)
                for d in (cache_dir, cache_dir.parent):
                    with contextlib.suppress(OSError):
                        d.rmdir()

    # -- the OCI runtime ------------------------------------------------------------------

    def _conmon_front(self) -> Path:
        front = self.dir / "bin/conmon"
        front.write_text(_CONMON_FRONT.format(real=self.binaries.conmon))
        front.chmod(front.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        return front

    def _runtime_front(self, name: str) -> Path:
        """The OCI runtime CRI-O runs for handler ``name``: the real one on a host whose root
        has every capability, else the lab's front (see the module docstring)."""
        real = self.oci_runtime_path(name)
        if _has_every_capability():
            return real
        clamp = self.dir / "bin/spec_front.py"
        clamp.write_text(SPEC_FRONT)
        front = self.dir / f"bin/{name}"
        python = shutil.which("python3") or "/usr/bin/python3"
        front.write_text(_FRONT.format(python=python, clamp=clamp, real=real))
        front.chmod(front.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        return front


def _has_every_capability() -> bool:
    """Whether this process's effective and bounding sets have every capability up to
    CAP_CHECKPOINT_RESTORE (40): CAP_SYS_RESOURCE lowers OOM scores, and CRI-O may grant a
    container any of them."""
    every = (1 << 41) - 1
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:
        return False
    sets = {k: int(v.split()[0], 16) for k, _, v in (ln.partition(":") for ln in lines)
            if k in ("CapEff", "CapBnd")}  # fmt: skip
    return all(sets.get(k, 0) & every == every for k in ("CapEff", "CapBnd"))


def crio_version(binary: Path) -> str:
    """``crio --version``'s first line (for messages)."""
    proc = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=False)
    return (proc.stdout or proc.stderr).splitlines()[0] if (proc.stdout or proc.stderr) else "?"
