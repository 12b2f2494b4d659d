"""The loopback registry: its protocol over real HTTP, and containerd pulling through it."""

from __future__ import annotations

import http.client
import json
import tempfile
from collections.abc import Iterator

import grpc
import pytest

from crihook.api.cri.v1 import api_pb2, api_pb2_grpc
from tests.lab import peers
from tests.lab.containerd_config import REGISTRY_HOSTS, hosts_toml
from tests.lab.images import LabImages
from tests.lab.oci import MANIFEST_MEDIA_TYPE, Reference, TarWriter, build_image, parse_reference
from tests.lab.registry import Catalog, Registry, RegistryError, Request, route
from tests.lab.runtime_lab import RuntimeLab


def _image(marker: bytes) -> tuple[Catalog, str, str]:
    layer = TarWriter()
    layer.file("marker", marker)
    image = build_image([layer.finish()], {"Cmd": ["sh"]})
    catalog = Catalog()
    catalog.add(image, ["registry.k8s.io/lab/thing:1", "k8s.gcr.io/lab/thing:2"])
    return catalog, image.digest, image.config_digest


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("registry.k8s.io/pause:3.9", Reference("registry.k8s.io", "pause", "3.9")),
        ("gcr.io/k8s-staging-cri-tools/test-image-latest",
         Reference("gcr.io", "k8s-staging-cri-tools/test-image-latest", "latest")),
        ("busybox", Reference("docker.io", "library/busybox", "latest")),
        ("foo/bar:1", Reference("docker.io", "foo/bar", "1")),
        ("localhost:5000/x/y:z", Reference("localhost:5000", "x/y", "z")),
    ],
    ids=["host-tag", "no-tag", "docker-hub-library", "docker-hub-user", "host-port"],
)  # fmt: skip
def test_parse_reference(ref: str, expected: Reference) -> None:
    assert parse_reference(ref) == expected


def test_parse_reference_refuses_digests() -> None:
    with pytest.raises(ValueError, match="digest"):
        parse_reference("gcr.io/x/y@sha256:" + "0" * 64)


@pytest.mark.parametrize(
    ("method", "path", "headers", "status"),
    [
        ("GET", "/v2/", {}, 200),
        ("GET", "/v2/lab/thing/manifests/1", {}, 200),
        ("HEAD", "/v2/lab/thing/manifests/2", {}, 200),
        ("GET", "/v2/lab/thing/manifests/3", {}, 404),
        ("GET", "/v2/lab/other/manifests/1", {}, 404),
        ("GET", "/v2/lab/thing/blobs/sha256:" + "0" * 64, {}, 404),
        ("GET", "/v2/lab/thing/blobs/latest", {}, 404),
        ("PUT", "/v2/lab/thing/manifests/1", {}, 405),
        ("GET", "/v3/", {}, 404),
    ],
    ids=["base", "manifest-tag", "manifest-head", "unknown-tag", "unknown-repo",
         "unknown-blob", "blob-not-a-digest", "write", "not-v2"],
)  # fmt: skip
def test_route_status(method: str, path: str, headers: dict[str, str], status: int) -> None:
    catalog, _, _ = _image(b"x")
    assert route(catalog, Request(method, path, headers)).status == status


def test_route_serves_manifest_by_digest_and_blob_ranges() -> None:
    catalog, digest, config_digest = _image(b"hello")
    by_digest = route(catalog, Request("GET", f"/v2/lab/thing/manifests/{digest}", {}))
    assert by_digest.headers == {
        "Content-Type": MANIFEST_MEDIA_TYPE,
        "Docker-Content-Digest": digest,
    }
    config = catalog.blobs[config_digest]
    part = route(
        catalog,
        Request("GET", f"/v2/lab/thing/blobs/{config_digest}", {"range": "bytes=2-5"}),
    )
    assert (part.status, part.body, part.headers["Content-Range"]) == (
        206,
        config[2:6],
        f"bytes 2-5/{len(config)}",
    )
    past_end = Request(
        "GET", f"/v2/lab/thing/blobs/{config_digest}", {"range": f"bytes={len(config)}-"}
    )
    assert route(catalog, past_end).status == 416


def test_catalog_refuses_two_images_under_one_tag() -> None:
    catalog, _, _ = _image(b"one")
    layer = TarWriter()
    layer.file("marker", b"two")
    with pytest.raises(RegistryError, match="two different images"):
        catalog.add(build_image([layer.finish()], {}), ["registry.k8s.io/lab/thing:1"])


def test_registry_refuses_a_non_loopback_address() -> None:
    with pytest.raises(RegistryError, match="loopback only"):
        Registry(Catalog(), host="0.0.0.0")


def test_registry_over_http() -> None:
    catalog, digest, config_digest = _image(b"over http")
    with Registry(catalog) as registry:
        conn = http.client.HTTPConnection("127.0.0.1", registry.port, timeout=60)
        try:
            conn.request("GET", "/v2/")
            base = conn.getresponse()
            assert (base.status, base.getheader("Docker-Distribution-API-Version")) == (
                200,
                "registry/2.0",
            )
            base.read()
            conn.request("HEAD", "/v2/lab/thing/manifests/1?ns=registry.k8s.io")
            head = conn.getresponse()
            head.read()
            assert (head.status, head.getheader("Docker-Content-Digest")) == (200, digest)
            assert head.getheader("Content-Length") == str(len(catalog.manifests[digest]))
            conn.request("GET", f"/v2/lab/thing/blobs/{config_digest}")
            blob = conn.getresponse()
            assert json.loads(blob.read())["config"] == {"Cmd": ["sh"]}
            conn.request("DELETE", "/v2/lab/thing/manifests/1")
            refused = conn.getresponse()
            assert json.loads(refused.read())["errors"][0]["code"] == "UNSUPPORTED"
        finally:
            conn.close()
        assert [(m, s) for m, _, s in registry.requests] == [
            ("GET", 200),
            ("HEAD", 200),
            ("GET", 200),
            ("DELETE", 405),
        ]
    # Stopped: the port is closed again.
    with pytest.raises(OSError):
        http.client.HTTPConnection("127.0.0.1", registry.port, timeout=2).connect()


def test_hosts_toml_names_only_the_mirror() -> None:
    assert hosts_toml("http://127.0.0.1:5000") == (
        'server = "http://127.0.0.1:5000"\n'
        '\n[host."http://127.0.0.1:5000"]\n'
        '  capabilities = ["pull", "resolve"]\n'
    )
    assert set(REGISTRY_HOSTS) == {"registry.k8s.io", "k8s.gcr.io", "gcr.io", "docker.io"}


@pytest.fixture
def mirrored_containerd(
    containerd_version: str, lab_images: LabImages
) -> Iterator[tuple[RuntimeLab, Registry, str, str]]:
    """A private runtime (containerd of each version: the two read hosts.toml differently;
    CRI-O, which reads registries.conf) whose registries all resolve to a loopback
    registry."""
    catalog, manifest_digest, config_digest = _image(b"pulled through the mirror")
    with Registry(catalog) as registry:
        lab = peers.lab_runtime(
            containerd_version,
            tempfile.mkdtemp(prefix="crihook-lab-", dir="/tmp"),
            lab_images,
            registry_mirror=registry.url,
        )
        try:
            lab.start()
            yield lab, registry, manifest_digest, config_digest
        finally:
            lab.cleanup()


@pytest.mark.containerd
@pytest.mark.both_containerds
@pytest.mark.on_crio
def test_containerd_pulls_through_the_mirror_and_nowhere_else(
    mirrored_containerd: tuple[RuntimeLab, Registry, str, str],
) -> None:
    lab, registry, manifest_digest, config_digest = mirrored_containerd
    with grpc.insecure_channel(lab.endpoint) as channel:
        images = api_pb2_grpc.ImageServiceStub(channel)
        for ref in ("registry.k8s.io/lab/thing:1", "k8s.gcr.io/lab/thing:2"):
            pulled = images.PullImage(
                api_pb2.PullImageRequest(image=api_pb2.ImageSpec(image=ref)), timeout=60
            )
            # containerd answers the image id; CRI-O a repository digest (the manifest's).
            expected = (
                f"{ref.rsplit(':', 1)[0]}@{manifest_digest}" if lab.is_crio else config_digest
            )
            assert pulled.image_ref == expected
        # Not in the registry: NotFound from the mirror, no fall-back to the real host
        # (that would be a DNS error or a refused connection to the dead proxy).
        with pytest.raises(grpc.RpcError) as missing:
            images.PullImage(
                api_pb2.PullImageRequest(image=api_pb2.ImageSpec(image="gcr.io/lab/nothere:1")),
                timeout=60,
            )
        # CRI-O's words for it: "repository lab/nothere not known", from the mirror too.
        answer = str(missing.value.details())
        assert (
            ("127.0.0.1" in answer and "not known" in answer)
            if lab.is_crio
            else ("not found" in answer)
        )
        # A registry with no hosts.toml: the dead proxy stops it before any DNS lookup.
        with pytest.raises(grpc.RpcError) as unmirrored:
            images.PullImage(
                api_pb2.PullImageRequest(image=api_pb2.ImageSpec(image="quay.io/lab/thing:1")),
                timeout=60,
            )
        assert "127.0.0.1:9" in str(unmirrored.value.details())
    assert {path for _, path, _ in registry.requests} >= {
        "/v2/lab/thing/manifests/1",
        "/v2/lab/thing/manifests/2",
        "/v2/lab/nothere/manifests/1",
    }
