"""The stand-ins for critest's images: what each one holds, as cri-tools' specs need it."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from tests.lab.images import LabImages
from tests.lab.oci import Image, oci_arch, parse_reference
from tests.lab.registry import Catalog
from tests.lab.standins import E2E, STAGING, StandIn, build_standins

# Every reference cri-tools v1.37.0's validation specs pull (pkg/validate, pkg/framework),
# except the digest-pinned test-image-digest@sha256:9700f9..., which cannot be rebuilt.
CRITEST_REFS = [
    E2E + "busybox:1.29-2",
    E2E + "nginx:1.14-2",
    E2E + "httpd:2.4.39-4",
    E2E + "nonewprivs:1.3",
    STAGING + "test-image-user-uid",
    STAGING + "test-image-user-username",
    STAGING + "test-image-user-uid-group",
    STAGING + "test-image-user-username-group",
    STAGING + "test-image-predefined-group",
    STAGING + "test-image-latest",
    STAGING + "test-image-tag:test",
    STAGING + "test-image-tag:all",
    STAGING + "test-image-1:latest",
    STAGING + "test-image-2:latest",
    STAGING + "test-image-3:latest",
    STAGING + "test-image-tags:1",
    STAGING + "test-image-tags:2",
    STAGING + "test-image-tags:3",
    STAGING + f"hostnet-nginx-{oci_arch()}",
    "registry.k8s.io/pause:3.9",
    "k8s.gcr.io/pause:3.9",
]


@pytest.fixture(scope="module")
def standins() -> dict[str, StandIn]:
    return {s.name: s for s in build_standins()}


def _config(image: Image) -> dict[str, object]:
    config: dict[str, object] = json.loads(image.config)["config"]
    return config


def _members(layer: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        return {m.name: m for m in tar.getmembers()}


def _read(layer: bytes, name: str) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        f = tar.extractfile(name)
        assert f is not None
        return f.read()


def test_every_critest_image_is_served(standins: dict[str, StandIn]) -> None:
    catalog = Catalog()
    for s in standins.values():
        catalog.add(s.image, s.refs)
    for ref in CRITEST_REFS:
        parsed = parse_reference(ref)
        assert catalog.manifest(parsed.path, parsed.tag) is not None, ref


def test_busybox_applets_are_hard_links(standins: dict[str, StandIn]) -> None:
    base = standins["busybox"].image.layers[0]
    members = _members(base)
    assert members["bin/busybox"].isreg()
    for applet in ("bin/sh", "bin/ls", "usr/bin/id", "bin/netstat", "usr/sbin/httpd"):
        assert members[applet].islnk() and members[applet].linkname == "bin/busybox", applet
    assert members["tmp"].mode == 0o1777
    assert b"www-data:x:33:33:" in _read(base, "etc/passwd")


@pytest.mark.parametrize(
    ("name", "user"),
    [
        ("user-uid", "1002"),
        ("user-username", "www-data"),
        ("user-uid-group", "1003:1004"),
        ("user-username-group", "www-data:1004"),
        ("predefined-group", "1000"),
    ],
    ids=["uid", "username", "uid-group", "username-group", "predefined-group"],
)
def test_user_images(standins: dict[str, StandIn], name: str, user: str) -> None:
    assert _config(standins[name].image)["User"] == user


def test_predefined_group_is_in_the_image(standins: dict[str, StandIn]) -> None:
    layer = standins["predefined-group"].image.layers[1]
    assert b"\ngroup-defined-in-image:x:50000:default-user\n" in _read(layer, "etc/group")
    assert b"\ndefault-user:x:1000:1000:" in _read(layer, "etc/passwd")


def test_images_differ_where_critest_counts_them(standins: dict[str, StandIn]) -> None:
    ids = [s.image.config_digest for s in standins.values()]
    assert len(ids) == len(set(ids)), "two stand-ins are the same image"
    assert standins["tags"].refs == tuple(STAGING + f"test-image-tags:{t}" for t in (1, 2, 3))


def test_pause_is_not_the_sandbox_image(
    standins: dict[str, StandIn], lab_images: LabImages
) -> None:
    # "removing image from one registry" counts the tags of pause:3.9: the sandbox image
    # must be another image, or it would show up as a third tag.
    assert standins["pause"].image.config_digest != lab_images.pause.config_digest


@pytest.mark.parametrize(
    ("name", "port"), [("nginx", "80"), ("hostnet-nginx", "12003")], ids=["nginx", "hostnet"]
)
def test_nginx_stand_ins(standins: dict[str, StandIn], name: str, port: str) -> None:
    image = standins[name].image
    config = _config(image)
    assert config["Cmd"] == ["nginx", "-g", "daemon off;"]
    assert f"NGINX_PORT={port}" in config["Env"]  # type: ignore[operator]
    members = _members(image.layers[1])
    assert members["usr/sbin/nginx"].mode == 0o755
    assert "usr/share/nginx/html/index.html" in members


def test_nonewprivs_is_setuid_root(standins: dict[str, StandIn]) -> None:
    image = standins["nonewprivs"].image
    nnp = _members(image.layers[1])["usr/local/bin/nnp"]
    assert (nnp.mode, nnp.uid) == (0o4755, 0)
    assert _config(image)["Entrypoint"] == ["/usr/local/bin/nnp"]
    assert "Cmd" not in _config(image)


def test_httpd_says_httpd(standins: dict[str, StandIn]) -> None:
    image = standins["httpd"].image
    script = _read(image.layers[1], "usr/local/bin/httpd-foreground")
    assert b'echo "httpd' in script and b"exec httpd -f -p 80" in script
