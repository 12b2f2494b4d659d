"""A kube-apiserver on kine (sqlite) for the test bed's real kubelet, and a small client.

:class:`ApiServer` runs kine (etcd's API on a sqlite file) and kube-apiserver on loopback
ports, under one temp dir: self-signed serving certs (``--cert-dir``), a static bearer token
(``--token-auth-file``, group system:masters), AlwaysAllow, and no ServiceAccount admission
(no controller-manager makes the default service account). No scheduler either: the tests
create pods with ``spec.nodeName`` set, and the node's kubelet runs them.

:class:`ApiClient` speaks JSON over HTTPS with the token (urllib): just the calls the node
tests make (pods: create, get, delete, patch the resize subresource; nodes: get).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from tests.lab.host import free_port
from tests.lab.runtime_lab import LabError

__all__ = ["ApiClient", "ApiError", "ApiServer"]

_POLL = 0.2


class ApiError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class ApiClient:
    """The API server's REST API with a bearer token (its certificate is self-signed)."""

    def __init__(self, server: str, token: str) -> None:
        self.server = server
        self._token = token
        self._tls = ssl.create_default_context()
        self._tls.check_hostname = False
        self._tls.verify_mode = ssl.CERT_NONE

    def request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self._token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self._tls, timeout=timeout) as resp:
                doc: dict[str, Any] = json.loads(resp.read() or b"{}")
                return doc
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")
            with contextlib.suppress(ValueError):
                text = json.loads(text).get("message", text)
            raise ApiError(exc.code, text) from None

    def create_pod(self, pod: Mapping[str, Any], namespace: str = "default") -> dict[str, Any]:
        return self.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod)

    def pod(self, name: str, namespace: str = "default") -> dict[str, Any]:
        return self.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")

    def delete_pod(self, name: str, namespace: str = "default", grace: int = 0) -> None:
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": grace}
        self.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", body)

    def pod_exists(self, name: str, namespace: str = "default") -> bool:
        try:
            self.pod(name, namespace)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def resize_pod(
        self, name: str, patch: Mapping[str, Any], namespace: str = "default"
    ) -> dict[str, Any]:
        """Patch the pod's ``resize`` subresource (in-place resize)."""
        return self.request(
            "PATCH",
            f"/api/v1/namespaces/{namespace}/pods/{name}/resize",
            patch,
            content_type="application/strategic-merge-patch+json",
        )

    def node(self, name: str) -> dict[str, Any]:
        return self.request("GET", f"/api/v1/nodes/{name}")

    def node_ready(self, name: str) -> bool:
        """The Node is registered and its Ready condition is True."""
        try:
            conditions = self.node(name)["status"].get("conditions", [])
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def delete_node(self, name: str) -> None:
        self.request("DELETE", f"/api/v1/nodes/{name}")


class ApiServer:
    """kine + kube-apiserver under a temp dir; ``start()``, ``client()``, ``cleanup()``."""

    def __init__(self, kube_apiserver: Path, kine: Path) -> None:
        self.binaries = (kube_apiserver, kine)
        self.dir = Path(tempfile.mkdtemp(prefix="crihook-api-", dir="/tmp"))
        self.token = secrets.token_hex(16)
        self.port = free_port()
        self.kine_port = free_port()
        self._procs: list[tuple[str, subprocess.Popen[bytes], IO[bytes]]] = []

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def client(self) -> ApiClient:
        return ApiClient(self.server, self.token)

    def start(self, timeout: float = 300.0) -> ApiServer:
        kube_apiserver, kine = self.binaries
        key, pub = self.dir / "sa.key", self.dir / "sa.pub"
        _openssl("genrsa", "-out", str(key), "2048")
        _openssl("rsa", "-in", str(key), "-pubout", "-out", str(pub))
        tokens = self.dir / "tokens.csv"
        tokens.write_text(f'{self.token},lab-admin,lab-admin,"system:masters"\n')
        tokens.chmod(0o600)
        self._spawn(
            "kine",
            [
                str(kine),
                "--endpoint",
                f"sqlite://{self.dir}/state.db?_journal=WAL&cache=shared",
                "--listen-address",
                f"127.0.0.1:{self.kine_port}",
                # No metrics server: its default, :8080, is one port for every kine here.
                "--metrics-bind-address",
                "0",
            ],
        )
        self._spawn(
            "kube-apiserver",
            [
                str(kube_apiserver),
                f"--etcd-servers=http://127.0.0.1:{self.kine_port}",
                "--storage-media-type=application/json",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.port}",
                f"--cert-dir={self.dir / 'certs'}",
                f"--token-auth-file={tokens}",
                "--authorization-mode=AlwaysAllow",
                "--anonymous-auth=false",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={pub}",
                f"--service-account-signing-key-file={key}",
                "--service-cluster-ip-range=10.96.0.0/24",
                "--disable-admission-plugins=ServiceAccount",
                "--enable-priority-and-fairness=false",
                "--endpoint-reconciler-type=none",
            ],
        )
        self._wait_ready(timeout)
        return self

    def cleanup(self) -> None:
        for _name, proc, log in reversed(self._procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            log.close()
        self._procs.clear()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> ApiServer:
        try:
            return self.start()
        except BaseException:  # __exit__ is not called for a failed __enter__
            self.cleanup()
            raise

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def log(self, name: str, lines: int = 40) -> str:
        try:
            text = (self.dir / f"{name}.log").read_text(errors="replace").splitlines()
        except OSError:
            return f"(no {name} log)"
        return f"--- last lines of {name}.log:\n" + "\n".join(text[-lines:])

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.dir / f"{name}.log", "ab")  # noqa: SIM115 - kept open for the process
        try:
            proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError:
            log.close()
            raise
        self._procs.append((name, proc, log))

    def _wait_ready(self, timeout: float) -> None:
        """Until /readyz answers and the default namespace exists (the pods go there)."""
        client = self.client()
        deadline = time.monotonic() + timeout
        while True:
            for name, proc, _log in self._procs:
                if proc.poll() is not None:
                    raise LabError(f"{name} exited {proc.returncode} at start\n{self.log(name)}")
            try:
                # each try may take what is left: on a loaded machine an answer can take seconds
                left = max(deadline - time.monotonic(), 1.0)
                client.request("GET", "/api/v1/namespaces/default", timeout=left)
                return
            except (ApiError, OSError):
                pass
            if time.monotonic() > deadline:
                raise LabError(
                    f"kube-apiserver not ready after {timeout:.0f}s\n{self.log('kube-apiserver')}"
                )
            time.sleep(_POLL)


def _openssl(*args: str) -> None:
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise LabError(f"openssl {' '.join(args)} failed: {proc.stderr.strip()}")
