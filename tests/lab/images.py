"""Build the lab's container images locally, without any registry.

Each image is an OCI image-layout tar archive (one uncompressed layer) that
``ctr images import`` accepts; ``index.json`` carries the annotation
``io.containerd.image.name=<ref>`` so the importer names the image. The bytes are
deterministic (fixed mtimes, owners, order and JSON encoding), so re-runs give the same
digests. Archives are cached by a key over their inputs (C source, compiler version,
busybox binary), so a session only compiles when something changed.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BUSYBOX_REF",
    "DEFAULT_CACHE_DIR",
    "PAUSE_REF",
    "ImageArchive",
    "LabImages",
    "build_images",
]

PAUSE_REF = "localhost/crihook/pause:1.0"
BUSYBOX_REF = "localhost/crihook/busybox:1.35"
DEFAULT_CACHE_DIR = Path("/tmp/crihook-lab-images")

# Bumped whenever the archive layout changes, so stale cache entries are not reused.
_FORMAT_VERSION = "1"
_LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"
_CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
_MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
_INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
_LayerFactory = Callable[[], bytes]
_PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# The pause program: PID 1 of every sandbox. It must reap zombies (containers sharing
# the PID namespace re-parent to it) and exit 0 on SIGTERM/SIGINT so StopPodSandbox is quick.
PAUSE_C_SOURCE = r"""
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig) { (void)sig; _exit(0); }

static void on_child(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction sa = {0};
    sa.sa_handler = on_stop;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sa.sa_handler = on_child;
    sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    sigaction(SIGCHLD, &sa, NULL);
    for (;;) {
        pause();
    }
    return 1;
}
"""


@dataclass(frozen=True)
class ImageArchive:
    """One image tar ready for ``ctr images import``."""

    ref: str
    path: Path
    manifest_digest: str
    config_digest: str


@dataclass(frozen=True)
class LabImages:
    pause: ImageArchive
    busybox: ImageArchive

    def all(self) -> tuple[ImageArchive, ImageArchive]:
        return (self.pause, self.busybox)


def build_images(
    cache_dir: Path | str = DEFAULT_CACHE_DIR, busybox_path: Path | str | None = None
) -> LabImages:
    """Build (or reuse from ``cache_dir``) the pause and busybox image archives."""
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    busybox_bin = Path(busybox_path) if busybox_path else _find_busybox()
    return LabImages(pause=_pause_image(cache), busybox=_busybox_image(cache, busybox_bin))


# -- pause ---------------------------------------------------------------------------------


def _pause_image(cache: Path) -> ImageArchive:
    gcc_version = _run(["gcc", "--version"]).splitlines()[0]
    key = _key("pause", PAUSE_C_SOURCE, gcc_version)
    return _cached(cache, "pause", key, PAUSE_REF, _pause_layer, {"Entrypoint": ["/pause"]})


def _pause_layer() -> bytes:
    with tempfile.TemporaryDirectory(prefix="crihook-pause-") as tmp:
        src = Path(tmp, "pause.c")
        out = Path(tmp, "pause")
        src.write_text(PAUSE_C_SOURCE)
        # -static: the image has no libc; -s strips symbols (smaller, and no build paths).
        _run(["gcc", "-static", "-Os", "-s", "-o", str(out), str(src)])
        binary = out.read_bytes()
    layer = _TarWriter()
    layer.file("pause", binary, mode=0o755)
    return layer.finish()


# -- busybox -------------------------------------------------------------------------------


def _find_busybox() -> Path:
    for candidate in ("/bin/busybox", "/usr/bin/busybox"):
        if os.access(candidate, os.X_OK):
            return Path(candidate)
    raise RuntimeError("busybox not found: run tests/lab/install.sh (busybox-static)")


def _busybox_image(cache: Path, busybox_bin: Path) -> ImageArchive:
    binary = busybox_bin.read_bytes()
    key = _key("busybox", hashlib.sha256(binary).hexdigest())
    config = {"Cmd": ["sh"], "Env": [_PATH_ENV]}
    return _cached(
        cache, "busybox", key, BUSYBOX_REF, lambda: _busybox_layer(busybox_bin, binary), config
    )


def _busybox_layer(busybox_bin: Path, binary: bytes) -> bytes:
    applets = sorted(
        line.strip()
        for line in _run([str(busybox_bin), "--list-full"]).splitlines()
        if line.strip() and line.strip() != "bin/busybox"
    )
    layer = _TarWriter()
    for d in (
        "bin",
        "dev",
        "etc",
        "proc",
        "root",
        "sbin",
        "sys",
        "usr",
        "usr/bin",
        "usr/sbin",
        "var",
        "var/run",
    ):
        layer.dir(d)
    layer.dir("tmp", mode=0o1777)
    layer.file("bin/busybox", binary, mode=0o755)
    layer.file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n")
    layer.file("etc/group", b"root:x:0:\nnogroup:x:65534:\n")
    for applet in applets:
        layer.symlink(applet, "/bin/busybox")
    return layer.finish()


# -- OCI layout ----------------------------------------------------------------------------


def _cached(
    cache: Path,
    name: str,
    key: str,
    ref: str,
    make_layer: _LayerFactory,
    config: Mapping[str, object],
) -> ImageArchive:
    path = cache / f"{name}-{key[:16]}.tar"
    meta_path = path.with_suffix(".json")
    if path.exists() and meta_path.exists():
        meta = json.loads(meta_path.read_text())
        return ImageArchive(ref, path, meta["manifest_digest"], meta["config_digest"])
    archive, manifest_digest, config_digest = _oci_archive(ref, make_layer(), config)
    # Write to a temp file and rename: concurrent sessions may build the same entry.
    _atomic_write(path, archive)
    meta = {"manifest_digest": manifest_digest, "config_digest": config_digest, "ref": ref}
    _atomic_write(meta_path, _json(meta))
    return ImageArchive(ref, path, manifest_digest, config_digest)


def _oci_archive(ref: str, layer: bytes, config: Mapping[str, object]) -> tuple[bytes, str, str]:
    layer_digest = _digest(layer)
    arch = _oci_arch()
    config_blob = _json(
        {
            "architecture": arch,
            "os": "linux",
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        }
    )
    config_digest = _digest(config_blob)
    manifest_blob = _json(
        {
            "schemaVersion": 2,
            "mediaType": _MANIFEST_MEDIA_TYPE,
            "config": {
                "mediaType": _CONFIG_MEDIA_TYPE,
                "digest": config_digest,
                "size": len(config_blob),
            },
            "layers": [
                {"mediaType": _LAYER_MEDIA_TYPE, "digest": layer_digest, "size": len(layer)}
            ],
        }
    )
    manifest_digest = _digest(manifest_blob)
    index_blob = _json(
        {
            "schemaVersion": 2,
            "mediaType": _INDEX_MEDIA_TYPE,
            "manifests": [
                {
                    "mediaType": _MANIFEST_MEDIA_TYPE,
                    "digest": manifest_digest,
                    "size": len(manifest_blob),
                    "platform": {"architecture": arch, "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": ref,
                        "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[-1],
                    },
                }
            ],
        }
    )
    out = _TarWriter()
    out.file("oci-layout", _json({"imageLayoutVersion": "1.0.0"}))
    out.file("index.json", index_blob)
    out.dir("blobs")
    out.dir("blobs/sha256")
    blobs = {layer_digest: layer, config_digest: config_blob, manifest_digest: manifest_blob}
    for digest in sorted(blobs):
        out.file(f"blobs/sha256/{digest.removeprefix('sha256:')}", blobs[digest])
    return out.finish(), manifest_digest, config_digest


class _TarWriter:
    """A tar writer whose output depends only on what is added, in the order added."""

    def __init__(self) -> None:
        self._buf = io.BytesIO()
        # Closed in finish(); the archive is built incrementally across calls.
        self._tar = tarfile.open(fileobj=self._buf, mode="w", format=tarfile.PAX_FORMAT)  # noqa: SIM115

    def _info(self, name: str, kind: bytes, mode: int) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.type = kind
        info.mode = mode
        info.mtime = 0
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    def dir(self, name: str, mode: int = 0o755) -> None:
        self._tar.addfile(self._info(name, tarfile.DIRTYPE, mode))

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        info = self._info(name, tarfile.REGTYPE, mode)
        info.size = len(data)
        self._tar.addfile(info, io.BytesIO(data))

    def symlink(self, name: str, target: str) -> None:
        info = self._info(name, tarfile.SYMTYPE, 0o777)
        info.linkname = target
        self._tar.addfile(info)

    def finish(self) -> bytes:
        self._tar.close()
        return self._buf.getvalue()


# -- helpers -------------------------------------------------------------------------------


def _oci_arch() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm"}.get(machine, machine)


def _key(*parts: str) -> str:
    h = hashlib.sha256(_FORMAT_VERSION.encode())
    for part in parts:
        h.update(b"\0" + part.encode())
    return h.hexdigest()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _run(argv: list[str]) -> str:
    if shutil.which(argv[0]) is None and not os.path.isabs(argv[0]):
        raise RuntimeError(f"{argv[0]} not found: run tests/lab/install.sh")
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout
