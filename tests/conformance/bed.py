"""The test bed of one conformance run: the loopback registry, the runtime, and crihook.

:class:`ConformanceBed` starts the registry holding critest's stand-in images and a lab
runtime (containerd 1.6 or 2.x, or CRI-O) whose registry mirrors point at it and whose
bridge the host can reach (critest fetches web pages from pod IPs).
:meth:`ConformanceBed.endpoint` yields the CRI endpoint for one :class:`Way`: the runtime's
own socket, or a crihook started in front of it. :meth:`ConformanceBed.reset` puts the
runtime back as it was between runs. Leaving the ``with`` block removes everything:
crihook, pods, the runtime, mounts, cgroups, the bridge, the registry and the work
directory.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import grpc

from crihook.api.cri.v1 import api_pb2, api_pb2_grpc
from tests.lab import peers
from tests.lab.crihook_proc import CrihookProcess
from tests.lab.images import DEFAULT_CACHE_DIR, build_images
from tests.lab.registry import Registry
from tests.lab.runtime_lab import LabError, RuntimeLab
from tests.lab.standins import build_catalog

__all__ = ["EXTRA_WAYS", "WAYS", "ConformanceBed", "Way"]

# critest's pods: "/test.slice" when RuntimeConfig is unimplemented (containerd 1.6),
# "" (containerd's "/k8s.io/<id>") when it reports cgroupfs (2.x). Cleanup removes what
# is new and empty under these (not under /kubepods, where other labs' pods may live).
_CGROUP_ROOTS = ("/test.slice", "/k8s.io")


@dataclass(frozen=True)
class Way:
    """One way of reaching containerd: directly, or through crihook with some hooks."""

    name: str
    via_crihook: bool
    hooks: str | None = None  # crihook --hooks; None: the config decides
    config: str = ""  # crihook's config.toml

    def describe(self) -> str:
        if not self.via_crihook:
            return "critest -> the runtime"
        chain = f"--hooks {self.hooks}" if self.hooks else "an in-process chain (config)"
        return f"critest -> crihook ({chain}) -> the runtime"


_ANNOTATE_CHAIN = """\
[hooks]
order = ["10-annotate"]
[hooks.annotate]
module = "crihook.hooks.examples.annotate:AnnotateHook"
key = "conformance.crihook.io/annotated"
value = "true"
"""

WAYS: tuple[Way, ...] = (
    Way("direct", via_crihook=False),
    Way("crihook-none", via_crihook=True, hooks="none"),
    Way("crihook-annotate", via_crihook=True, config=_ANNOTATE_CHAIN),
)
# Not run by default: selectable with --ways.
EXTRA_WAYS: tuple[Way, ...] = (Way("crihook-resources", via_crihook=True, hooks="cpuset,numa,oom"),)


class ConformanceBed:
    def __init__(self, workdir: Path, containerd: str) -> None:
        """``containerd``: one of ``tests.lab.peers.RUNTIME_CHOICES`` (1.6, 2 or crio)."""
        self.workdir = workdir
        self.containerd_version = containerd
        self.registry: Registry | None = None
        self.containerd: RuntimeLab | None = None
        self._lab_image_refs: set[str] = set()

    def __enter__(self) -> ConformanceBed:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _start(self) -> None:
        self.registry = Registry(build_catalog()).start()
        images = build_images(DEFAULT_CACHE_DIR)
        self._lab_image_refs = {image.ref for image in images.all()}
        self.containerd = peers.lab_runtime(
            self.containerd_version,
            self.workdir / "ctd",
            images,
            registry_mirror=self.registry.url,
            host_reaches_pods=True,
            cgroup_roots=_CGROUP_ROOTS,
        )
        self.containerd.start()

    def close(self) -> None:
        """Remove everything; raises LabError at the end if containerd's cleanup failed."""
        try:
            if self.containerd is not None:
                self.containerd.cleanup()
        finally:
            self.containerd = None
            if self.registry is not None:
                self.registry.stop()
                self.registry = None
            shutil.rmtree(self.workdir, ignore_errors=True)

    @property
    def lab(self) -> RuntimeLab:
        if self.containerd is None:
            raise LabError("the conformance bed is not running")
        return self.containerd

    @contextlib.contextmanager
    def host_ipc_cleanup(self) -> Iterator[None]:
        """critest's HostIpc specs make System V shared memory segments on the host
        (``ipcmk -M``) and never remove them: remove the new, unattached ones afterwards."""
        before = {shmid for shmid, _ in _shm_segments()}
        try:
            yield
        finally:
            for shmid, attached in _shm_segments():
                if shmid not in before and attached == 0:
                    subprocess.run(["ipcrm", "-m", str(shmid)], capture_output=True, check=False)

    @contextlib.contextmanager
    def endpoint(self, way: Way, rundir: Path) -> Iterator[str]:
        """The CRI endpoint critest should use for ``way`` (crihook runs until exit)."""
        if not way.via_crihook:
            yield self.lab.endpoint
            return
        workdir = rundir / "crihook"
        workdir.mkdir(parents=True, exist_ok=True)
        proc = CrihookProcess(
            self.lab.endpoint,
            workdir=workdir,
            config=way.config or None,
            hooks=way.hooks,
        )
        proc.start()
        try:
            yield proc.endpoint
        finally:
            code = proc.stop()
            if code != 0:
                raise LabError(f"crihook ({way.name}) exited {code}; see {proc.log_path}")

    def reset(self) -> None:
        """Between runs: no pods, and only the lab's own images (critest pulls the rest)."""
        lab = self.lab
        lab.ensure_running()
        lab.remove_all_pods()
        with grpc.insecure_channel(lab.endpoint) as channel:
            images = api_pb2_grpc.ImageServiceStub(channel)
            for image in images.ListImages(api_pb2.ListImagesRequest(), timeout=30).images:
                if self._lab_image_refs.isdisjoint(image.repo_tags):
                    images.RemoveImage(
                        api_pb2.RemoveImageRequest(image=api_pb2.ImageSpec(image=image.id)),
                        timeout=60,
                    )


def _shm_segments() -> list[tuple[int, int]]:
    """(shmid, number attached) of every System V shared memory segment on the host."""
    try:
        lines = Path("/proc/sysvipc/shm").read_text().splitlines()[1:]
    except OSError:
        return []
    return [(int(f[1]), int(f[6])) for f in (line.split() for line in lines) if len(f) > 6]
