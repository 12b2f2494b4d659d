"""The seam through which hooks touch the host's processes: find a container's processes, read
and write their ``oom_score_adj``. Hooks take a :class:`Host`; crihook passes a
:class:`LinuxHost`, tests and replays pass their own.

Where containerd puts a container's cgroup (runc, CRI plugin):

- cgroupfs driver: the CRI ``cgroup_parent`` is a path such as ``/kubepods/burstable/pod<uid>``
  and the container is ``<parent>/<container id>``, the same relative path in every cgroup v1
  hierarchy and in the cgroup v2 tree.
- systemd driver: the parent is a slice name such as ``kubepods-burstable-pod<uid>.slice``; it
  expands to ``kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice`` and
  the container is ``<expanded>/cri-containerd-<container id>.scope``.

Races with exiting processes are expected, not errors: a container whose cgroup is gone has
no processes (``[]``), and writing the score of a process that exited after it was listed is
skipped. A pid could in principle be reused in between; the window is the few microseconds
from reading ``cgroup.procs`` to the write.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from typing import Protocol

__all__ = [
    "OOM_SCORE_ADJ_MAX",
    "OOM_SCORE_ADJ_MIN",
    "Host",
    "LinuxHost",
    "cgroup_version",
    "expand_slice",
    "pod_cgroup_path",
]

OOM_SCORE_ADJ_MIN = -1000
OOM_SCORE_ADJ_MAX = 1000

# cgroup v1 hierarchies that hold every container, in the order tried. `cpu,cpuacct` is the
# usual co-mount; some hosts mount `cpu` and `cpuacct` apart.
_V1_HIERARCHIES = ("pids", "memory", "cpu,cpuacct", "cpu", "cpuacct")

# Container ids are hex for containerd; anything that could climb out of the parent is refused.
_CONTAINER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class Host(Protocol):
    """What hooks may do to the host's processes."""

    def container_pids(self, cgroup_parent: str, container_id: str) -> list[int]:
        """The processes of a container (its cgroup and any cgroups below it), ascending.

        ``[]`` when the container's cgroup does not exist (not created yet, or exited).
        """
        ...

    def write_oom_score_adj(self, pid: int, score: int) -> None:
        """Set a process's oom_score_adj (-1000..1000); a process that is gone is skipped."""
        ...

    def read_oom_score_adj(self, pid: int) -> int:
        """A process's oom_score_adj; ProcessLookupError when it is gone."""
        ...

    def unlimit_cpu_quota(self, cgroup_parent: str) -> bool:
        """Lift the CFS quota of a pod's cgroup (kubelet does so for a pod with exclusive
        CPUs). False when the cgroup does not exist (yet, or any more)."""
        ...


def expand_slice(slice_name: str) -> str:
    """The path of a systemd slice below the cgroup root: ``a-b.slice`` → ``a.slice/a-b.slice``.

    ``-.slice`` is the root slice (``""``). ValueError for a name systemd would refuse.
    """
    if not slice_name.endswith(".slice") or "/" in slice_name:
        raise ValueError(f"not a systemd slice name: {slice_name!r}")
    if slice_name == "-.slice":
        return ""
    stem = slice_name.removesuffix(".slice")
    parts = stem.split("-")
    if not all(parts):  # leading/trailing/double dash
        raise ValueError(f"invalid systemd slice name: {slice_name!r}")
    return "/".join("-".join(parts[: i + 1]) + ".slice" for i in range(len(parts)))


def pod_cgroup_path(cgroup_parent: str) -> str:
    """The pod cgroup's path relative to a hierarchy's root, from the sandbox's
    `cgroup_parent` (either driver). ValueError when it is empty or climbs out."""
    parent = cgroup_parent.strip("/")
    if not parent or ".." in parent.split("/"):
        raise ValueError(f"not a pod cgroup parent: {cgroup_parent!r}")
    if parent.endswith(".slice") and "/" not in parent:
        return expand_slice(parent).lstrip("/")
    return parent


class LinuxHost:
    """The real host: cgroupfs under ``cgroup_root``, processes under ``proc_root``."""

    def __init__(
        self, cgroup_root: Path = Path("/sys/fs/cgroup"), proc_root: Path = Path("/proc")
    ) -> None:
        self.cgroup_root = cgroup_root
        self.proc_root = proc_root

    def container_cgroup(self, cgroup_parent: str, container_id: str) -> str:
        """containerd's cgroup path for the container, relative to a hierarchy's root
        (driver from the parent)."""
        return self.container_cgroups(cgroup_parent, container_id)[0]

    def container_cgroups(self, cgroup_parent: str, container_id: str) -> tuple[str, str]:
        """Where the container's cgroup is, relative to a hierarchy's root: containerd's
        name for it, then CRI-O's. cgroupfs: ``<parent>/<id>``, ``<parent>/crio-<id>``;
        systemd: ``<slice>/cri-containerd-<id>.scope``, ``<slice>/crio-<id>.scope``.
        (CRI-O's conmon lives beside it in ``crio-conmon-<id>``: never a candidate.)"""
        if not _CONTAINER_ID.fullmatch(container_id):
            raise ValueError(f"not a container id: {container_id!r}")
        parent = cgroup_parent.strip("/")
        if ".." in parent.split("/"):
            raise ValueError(f"cgroup parent climbs out of the cgroup root: {cgroup_parent!r}")
        if parent.endswith(".slice") and "/" not in parent:
            base = expand_slice(parent)
            names = (f"cri-containerd-{container_id}.scope", f"crio-{container_id}.scope")
        else:
            base = parent
            names = (container_id, f"crio-{container_id}")
        first, second = (f"{base}/{name}".lstrip("/") for name in names)
        return first, second

    def container_pids(self, cgroup_parent: str, container_id: str) -> list[int]:
        candidates = self.container_cgroups(cgroup_parent, container_id)
        for top in self._hierarchies():
            for relative in candidates:
                cgroup = top / relative
                if (cgroup / "cgroup.procs").is_file():
                    return self._pids_below(cgroup)
        return []

    def write_oom_score_adj(self, pid: int, score: int) -> None:
        if not OOM_SCORE_ADJ_MIN <= score <= OOM_SCORE_ADJ_MAX:
            raise ValueError(f"oom_score_adj must be in -1000..1000, not {score}")
        path = self.proc_root / str(pid) / "oom_score_adj"
        try:
            # No O_CREAT: a vanished /proc/<pid> must not become a new file. O_TRUNC is a
            # no-op on procfs (as for `echo 500 > ...`) and keeps a fake file exact.
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
        except (FileNotFoundError, ProcessLookupError):
            return  # exited since it was listed
        except OSError as exc:
            raise _with_path(exc, "cannot open", path) from exc
        try:
            os.write(fd, str(score).encode())
        except ProcessLookupError:
            return  # exiting: the kernel refuses with ESRCH
        except OSError as exc:
            raise _with_path(exc, f"cannot write {score} to", path) from exc
        finally:
            os.close(fd)

    def read_oom_score_adj(self, pid: int) -> int:
        path = self.proc_root / str(pid) / "oom_score_adj"
        try:
            text = path.read_text()
        except FileNotFoundError as exc:
            raise ProcessLookupError(errno.ESRCH, f"no process {pid} ({path})") from exc
        except OSError as exc:
            raise _with_path(exc, "cannot read", path) from exc
        try:
            return int(text.strip())
        except ValueError:
            raise OSError(errno.EINVAL, f"malformed oom_score_adj {text!r} in {path}") from None

    def unlimit_cpu_quota(self, cgroup_parent: str) -> bool:
        relative = pod_cgroup_path(cgroup_parent)
        if (self.cgroup_root / "cgroup.controllers").is_file():  # v2: "max <period>"
            path = self.cgroup_root / relative / "cpu.max"
            try:
                period = path.read_text().split()[1]
            except FileNotFoundError:
                return False
            except (OSError, IndexError) as exc:
                raise OSError(errno.EINVAL, f"cannot read {path}: {exc}") from None
            return _write_existing(path, f"max {period}")
        for top in ("cpu,cpuacct", "cpu"):
            path = self.cgroup_root / top / relative / "cpu.cfs_quota_us"
            if path.is_file():
                return _write_existing(path, "-1")
        return False

    def _hierarchies(self) -> list[Path]:
        # cgroup v2 (unified at the root): one tree. Otherwise (v1 or hybrid) the v1
        # controllers, where runc places containers in hybrid mode too.
        if (self.cgroup_root / "cgroup.controllers").is_file():
            return [self.cgroup_root]
        return [self.cgroup_root / name for name in _V1_HIERARCHIES]

    def _pids_below(self, cgroup: Path) -> list[int]:
        pids: set[int] = set()
        # Sub-cgroups hold processes too (a container running systemd makes its own).
        for directory, _subdirs, files in os.walk(cgroup):
            if "cgroup.procs" in files:
                pids.update(_read_procs(Path(directory) / "cgroup.procs"))
        return sorted(pids)


def _write_existing(path: Path, value: str) -> bool:
    try:
        # Never create: cgroupfs files exist or not. O_TRUNC: a no-op there, exact on fakes.
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise _with_path(exc, "cannot open", path) from exc
    try:
        os.write(fd, value.encode())
    except OSError as exc:
        raise _with_path(exc, f"cannot write {value!r} to", path) from exc
    finally:
        os.close(fd)
    return True


def _read_procs(path: Path) -> list[int]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []  # the cgroup was removed while we walked: its processes are gone
    except OSError as exc:
        raise _with_path(exc, "cannot read", path) from exc
    try:
        return [int(line) for line in text.split()]
    except ValueError:
        raise OSError(errno.EINVAL, f"malformed pid list in {path}") from None


def _with_path(exc: OSError, what: str, path: Path) -> OSError:
    # OSError(errno, msg) returns the errno's subclass (PermissionError, ...), so callers can
    # still tell the cause apart while the message names the file.
    return OSError(exc.errno, f"{what} {path}: {exc.strerror or exc}")


def cgroup_version(cgroup_root: Path) -> int | None:
    """2 when the unified hierarchy is mounted at ``cgroup_root`` (runc then uses cgroup v2),
    1 when v1 hierarchies are (hybrid hosts included: runc places containers in v1 there),
    None when ``cgroup_root`` holds neither (no cgroupfs there, or a sysfs fixture)."""
    if (cgroup_root / "cgroup.controllers").is_file():
        return 2
    if any((cgroup_root / name).is_dir() for name in _V1_HIERARCHIES):
        return 1
    return None
