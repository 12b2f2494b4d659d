"""OCI image pieces in memory: deterministic layer tars, config, manifest, references.

An :class:`Image` is what a registry serves: the manifest, the config and the layers as
blobs keyed by digest. Bytes depend only on what was added, in order (fixed mtimes and
owners, sorted JSON), so the same inputs give the same digests on every machine run.
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "CONFIG_MEDIA_TYPE",
    "LAYER_MEDIA_TYPE",
    "MANIFEST_MEDIA_TYPE",
    "Image",
    "Reference",
    "TarWriter",
    "build_image",
    "digest_of",
    "oci_arch",
    "parse_reference",
]

LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"

_DOCKER_HUB = "docker.io"


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def oci_arch() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm"}.get(machine, machine)


def _json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Reference:
    """A parsed image reference: ``registry.k8s.io`` / ``e2e-test-images/busybox`` / tag."""

    host: str
    path: str
    tag: str

    def __str__(self) -> str:
        return f"{self.host}/{self.path}:{self.tag}"


def parse_reference(ref: str) -> Reference:
    """Docker's rules, tags only: a first component with '.' or ':' (or localhost) is the
    registry host, else docker.io; docker.io's one-component names live under library/;
    no tag means ``latest``. Digest references are refused: stand-ins are served by tag."""
    if "@" in ref:
        raise ValueError(f"{ref!r}: digest references cannot name a stand-in")
    first, _, rest = ref.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        host, remainder = first, rest
    else:
        host, remainder = _DOCKER_HUB, ref
    name, colon, tag = remainder.rpartition(":")
    if not colon or "/" in tag:
        name, tag = remainder, "latest"
    if host == _DOCKER_HUB and "/" not in name:
        name = f"library/{name}"
    if not name or name != name.lower():
        raise ValueError(f"{ref!r}: invalid repository name {name!r}")
    return Reference(host, name, tag)


class TarWriter:
    """A tar writer whose output depends only on what is added, in the order added."""

    def __init__(self) -> None:
        self._buf = io.BytesIO()
        # Closed in finish(); the archive is built incrementally across calls.
        self._tar = tarfile.open(fileobj=self._buf, mode="w", format=tarfile.PAX_FORMAT)  # noqa: SIM115

    def _info(self, name: str, kind: bytes, mode: int, uid: int, gid: int) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.type = kind
        info.mode = mode
        info.mtime = 0
        info.uid, info.gid = uid, gid
        info.uname = info.gname = ""
        return info

    def dir(self, name: str, mode: int = 0o755, uid: int = 0, gid: int = 0) -> None:
        self._tar.addfile(self._info(name, tarfile.DIRTYPE, mode, uid, gid))

    def file(self, name: str, data: bytes, mode: int = 0o644, uid: int = 0, gid: int = 0) -> None:
        info = self._info(name, tarfile.REGTYPE, mode, uid, gid)
        info.size = len(data)
        self._tar.addfile(info, io.BytesIO(data))

    def hardlink(self, name: str, target: str) -> None:
        """``name`` is another name of the earlier entry ``target`` (same inode)."""
        info = self._info(name, tarfile.LNKTYPE, 0o755, 0, 0)
        info.linkname = target
        self._tar.addfile(info)

    def symlink(self, name: str, target: str) -> None:
        info = self._info(name, tarfile.SYMTYPE, 0o777, 0, 0)
        info.linkname = target
        self._tar.addfile(info)

    def finish(self) -> bytes:
        self._tar.close()
        return self._buf.getvalue()


@dataclass(frozen=True)
class Image:
    manifest: bytes
    config: bytes
    layers: tuple[bytes, ...]

    @property
    def digest(self) -> str:
        """The manifest digest: what a pull by this image's tag resolves to."""
        return digest_of(self.manifest)

    @property
    def config_digest(self) -> str:
        """The image id containerd reports."""
        return digest_of(self.config)

    def blobs(self) -> dict[str, bytes]:
        return {digest_of(b): b for b in (self.config, *self.layers)}


def build_image(layers: Sequence[bytes], config: Mapping[str, object]) -> Image:
    """An image of ``layers`` (uncompressed tars, bottom first) and the runtime ``config``
    (the OCI config's ``config`` object: User, Env, Entrypoint, Cmd, Labels, ...)."""
    config_blob = _json(
        {
            "architecture": oci_arch(),
            "os": "linux",
            "config": dict(config),
            "rootfs": {"type": "layers", "diff_ids": [digest_of(layer) for layer in layers]},
        }
    )
    manifest = _json(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "config": {
                "mediaType": CONFIG_MEDIA_TYPE,
                "digest": digest_of(config_blob),
                "size": len(config_blob),
            },
            "layers": [
                {"mediaType": LAYER_MEDIA_TYPE, "digest": digest_of(layer), "size": len(layer)}
                for layer in layers
            ],
        }
    )
    return Image(manifest=manifest, config=config_blob, layers=tuple(layers))
