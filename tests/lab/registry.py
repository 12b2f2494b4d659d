"""A small read-only OCI distribution registry on 127.0.0.1, for containerd's pulls.

It serves the pull half of the OCI distribution spec, which is all containerd's resolver
and fetcher use:

- ``GET|HEAD /v2/``: 200, ``Docker-Distribution-API-Version: registry/2.0``;
- ``GET|HEAD /v2/<name>/manifests/<tag|digest>``: the manifest with its media type as
  Content-Type and ``Docker-Content-Digest``;
- ``GET|HEAD /v2/<name>/blobs/<digest>``: the blob (``Range: bytes=N-[M]`` answered 206);
- anything else: a 404 with the spec's JSON error body, or 405 for writes.

Repositories are keyed by path only (``e2e-test-images/busybox``): containerd asks a
``server`` from hosts.toml without the registry host, and the stand-ins never give one
path two contents (:class:`Catalog` refuses that). It binds loopback only, logs through
``logging``, and records every request in :attr:`Registry.requests` for tests.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import re
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

from tests.lab.oci import MANIFEST_MEDIA_TYPE, Image, Reference, parse_reference

__all__ = ["Catalog", "Registry", "RegistryError", "Request", "Response", "route"]

log = logging.getLogger(__name__)

_NAME = r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
_ROUTE = re.compile(rf"^/v2/(?P<name>{_NAME})/(?P<kind>manifests|blobs)/(?P<ref>[^/]+)$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


class RegistryError(RuntimeError):
    """The registry could not start, or was given contents that contradict each other."""


@dataclass
class Catalog:
    """What the registry serves: tags per repository path, and blobs by digest."""

    tags: dict[str, dict[str, str]] = field(default_factory=dict)  # path -> tag -> digest
    manifests: dict[str, bytes] = field(default_factory=dict)  # digest -> manifest
    repo_blobs: dict[str, set[str]] = field(default_factory=dict)  # path -> digests
    blobs: dict[str, bytes] = field(default_factory=dict)

    def add(self, image: Image, refs: Iterable[str | Reference]) -> None:
        """Serve ``image`` under every reference in ``refs`` (tags; the host is dropped)."""
        for item in refs:
            ref = parse_reference(item) if isinstance(item, str) else item
            tags = self.tags.setdefault(ref.path, {})
            known = tags.get(ref.tag)
            if known is not None and known != image.digest:
                raise RegistryError(f"{ref}: two different images for {ref.path}:{ref.tag}")
            tags[ref.tag] = image.digest
            self.repo_blobs.setdefault(ref.path, set()).update(image.blobs())
        self.manifests[image.digest] = image.manifest
        self.blobs.update(image.blobs())

    def manifest(self, path: str, ref: str) -> tuple[str, bytes] | None:
        """(digest, manifest) for a tag or digest of repository ``path``."""
        tags = self.tags.get(path)
        if tags is None:
            return None
        digest = ref if _DIGEST.match(ref) else tags.get(ref)
        if digest is None or digest not in tags.values():
            return None
        return digest, self.manifests[digest]

    def blob(self, path: str, digest: str) -> bytes | None:
        if digest not in self.repo_blobs.get(path, ()):
            return None
        return self.blobs.get(digest)


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # without the query string
    headers: dict[str, str]  # lower-case names


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes = b""


def _error(status: int, code: str, message: str) -> Response:
    body = json.dumps({"errors": [{"code": code, "message": message}]}).encode()
    return Response(status, {"Content-Type": "application/json"}, body)


def route(catalog: Catalog, request: Request) -> Response:
    """The whole protocol as a pure function: request in, response out (HEAD gets the
    GET headers; the server drops the body)."""
    if request.method not in ("GET", "HEAD"):
        return _error(405, "UNSUPPORTED", "this registry is read-only")
    if request.path in ("/v2", "/v2/"):
        return Response(200, {"Content-Type": "application/json"}, b"{}")
    m = _ROUTE.match(request.path)
    if m is None:
        return _error(404, "NAME_UNKNOWN", f"no route for {request.path}")
    name, kind, ref = m.group("name", "kind", "ref")
    if name not in catalog.tags:
        return _error(404, "NAME_UNKNOWN", f"repository {name} not known")
    if kind == "manifests":
        found = catalog.manifest(name, ref)
        if found is None:
            return _error(404, "MANIFEST_UNKNOWN", f"manifest {name}:{ref} not known")
        digest, body = found
        return Response(
            200,
            {"Content-Type": MANIFEST_MEDIA_TYPE, "Docker-Content-Digest": digest},
            body,
        )
    if not _DIGEST.match(ref):
        return _error(404, "DIGEST_INVALID", f"{ref} is not a sha256 digest")
    blob = catalog.blob(name, ref)
    if blob is None:
        return _error(404, "BLOB_UNKNOWN", f"blob {ref} not known in {name}")
    headers = {
        "Content-Type": "application/octet-stream",
        "Docker-Content-Digest": ref,
        "Accept-Ranges": "bytes",
    }
    wanted = _RANGE.match(request.headers.get("range", ""))
    if wanted is None:
        return Response(200, headers, blob)
    start = int(wanted.group(1))
    end = int(wanted.group(2)) if wanted.group(2) else len(blob) - 1
    if start >= len(blob) or end < start:
        return Response(416, {"Content-Range": f"bytes */{len(blob)}"})
    end = min(end, len(blob) - 1)
    headers["Content-Range"] = f"bytes {start}-{end}/{len(blob)}"
    return Response(206, headers, blob[start : end + 1])


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: tuple[str, int]) -> None:
        # CRI-O's image library tries TLS first on an insecure registry, then plain HTTP: the
        # TLS hello is not HTTP and the client resets. Not worth socketserver's traceback.
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError):
            log.debug("lab registry: %s from %s", exc, client_address)
            return
        super().handle_error(request, client_address)


class Registry:
    """The catalog served over HTTP on ``host`` (loopback only), port ``port`` (0: any).

    Use as a context manager, or ``start()`` / ``stop()``. :attr:`url` is what
    hosts.toml's ``server`` takes.
    """

    def __init__(self, catalog: Catalog, host: str = "127.0.0.1", port: int = 0) -> None:
        if not ipaddress.ip_address(host).is_loopback:
            raise RegistryError(f"the lab registry serves loopback only, not {host}")
        self.catalog = catalog
        self.host = host
        self.port = port
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> Registry:
        if self._server is not None:
            raise RegistryError("the registry is already running")
        try:
            server = _Server((self.host, self.port), self._handler_class())
        except OSError as exc:
            raise RegistryError(f"cannot listen on {self.host}:{self.port}: {exc}") from exc
        server.daemon_threads = True
        self._server = server
        self.port = server.server_address[1]
        self._thread = threading.Thread(
            target=server.serve_forever, name=f"lab-registry-{self.port}", daemon=True
        )
        self._thread.start()
        log.info("lab registry serving %d repositories on %s", len(self.catalog.tags), self.url)
        return self

    def stop(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(10)

    def __enter__(self) -> Registry:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _record(self, method: str, path: str, status: int) -> None:
        with self._lock:
            self.requests.append((method, path, status))

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        registry = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            server_version = "crihook-lab-registry"

            def _serve(self) -> None:
                path = self.path.split("?", 1)[0]
                request = Request(
                    self.command, path, {k.lower(): v for k, v in self.headers.items()}
                )
                response = route(registry.catalog, request)
                self.send_response(response.status)
                self.send_header("Docker-Distribution-API-Version", "registry/2.0")
                for key, value in response.headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(response.body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(response.body)
                registry._record(self.command, path, response.status)

            do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _serve

            def log_message(self, format: str, *args: object) -> None:
                log.debug("lab registry: " + format, *args)

        return Handler
