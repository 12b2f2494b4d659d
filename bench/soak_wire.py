"""Bad input on the wire: malformed gRPC payloads and broken HTTP/2, on crihook's socket and on
a plugin's (the SDK's server, hooks/remote/sdk_server.py, serving the annotate example plugin).

Two kinds of abuse, seeded:
- malformed payloads: well-framed gRPC calls whose message is not the method's protobuf
  (random bytes, a valid message cut short, a wrong wire type), to every method crihook
  decodes (the lifecycle calls) and every method the plugin serves. Each must end with a clear
  status (not UNKNOWN, no Python exception text).
- broken HTTP/2, each on its own connection: a valid request cut at a random byte (then the
  connection closed, or left open and silent), random bytes after the preface, bit flips in a
  valid request, a frame longer than the peer allows, a gRPC message prefix announcing more
  than is sent, a compressed message with no encoding, HEADERS on stream 0, DATA on a stream
  never opened. The server may answer or close; it must not crash.

Meanwhile one client on its own connection calls both servers without pause: every one of its
calls must succeed. Afterwards both processes still serve, and their fd counts are what they
were before (every broken connection closed).
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from bench.soak_common import Calls, ProbedCrihook, tracebacks, unclear_status
from crihook.api.cri.v1 import api_pb2
from crihook.api.hook.v1 import hook_pb2
from crihook.proxy.cri.events import INTERCEPTED
from tests.lab.h2_bytes import (
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    PREFACE,
    SETTINGS,
    headers_block,
)
from tests.lab.h2_bytes import frame as _frame
from tests.lab.h2_bytes import request as _request
from tests.lab.kubelet_encoding import ContainerSpec, PodSpec, container_config, sandbox_config
from tests.lab.memory_runtime import MemoryRuntime
from tests.lab.plugin_proc import Plugin

__all__ = ["WireResult", "run_wire"]

VERSION = "/runtime.v1.RuntimeService/Version"
KNOWN_FATAL = (
    "crihook's socket on the grpc data path: no bit flip in the method name. grpcio's aio "
    "server (1.85) ends its main loop on a :path that is not UTF-8; crihook then exits 1 to "
    "be restarted (tests/integration/test_wire.py), which this part would count as a crash"
)
PLUGIN_SERVICE = "crihook.hook.v1.Plugin"


def _valid(path: str, message: bytes) -> bytes:
    return PREFACE + _frame(SETTINGS, 0, 0) + _request(path, message)


def _abuses(
    rng: random.Random, path: str, message: bytes, spare_path: bool
) -> list[tuple[str, bytes, bool]]:
    """(name, bytes to send, hold the connection open after) for one round. `spare_path`:
    no bit flip in the method name (see KNOWN_FATAL)."""
    valid = _valid(path, message)
    cut = rng.randrange(1, len(valid))
    flipped = bytearray(valid)
    at = valid.index(path.encode())
    spared = range(at, at + len(path)) if spare_path else range(0)
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(PREFACE), len(flipped))
        if i not in spared:
            flipped[i] ^= 1 << rng.randrange(8)
    start = PREFACE + _frame(SETTINGS, 0, 0)
    return [
        ("truncated, closed", valid[:cut], False),
        ("truncated, left open", valid[:cut], True),
        ("garbage after the preface", PREFACE + rng.randbytes(rng.randint(1, 200)), False),
        ("bit flips", bytes(flipped), False),
        (
            "frame too long",
            start + struct.pack(">BHBBL", 0xFF, 0xFFFF, DATA, 0, 1) + b"x" * 100,
            False,
        ),
        (
            "message prefix longer than sent",
            start + _request(path, message, announced=len(message) + 1000),
            False,
        ),
        ("compressed, no encoding", start + _request(path, message, compressed=1), False),
        (
            "HEADERS on stream 0",
            start + _frame(HEADERS, END_HEADERS | END_STREAM, 0, headers_block(path)),
            False,
        ),
        (
            "DATA on a stream never opened",
            start + _frame(DATA, END_STREAM, 7, b"\x00\x00\x00\x00\x00"),
            False,
        ),
        ("no preface", rng.randbytes(rng.randint(1, 64)), False),
    ]


class _Gone(Exception):
    """A server's socket no longer accepts connections."""


def _send(sock_path: Path, data: bytes, hold: bool) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as peer:
        peer.settimeout(2)
        try:
            peer.connect(str(sock_path))
        except OSError as exc:
            raise _Gone(f"cannot connect to {sock_path}: {exc}") from exc
        try:
            peer.sendall(data)
            deadline = time.monotonic() + (0.3 if hold else 0.1)
            peer.settimeout(0.05)
            while time.monotonic() < deadline:  # read what the server answers, until it closes
                try:
                    if not peer.recv(65536):
                        break
                except TimeoutError:
                    continue
        except (TimeoutError, ConnectionError):
            pass


def _payloads(rng: random.Random, valid: bytes) -> list[tuple[str, bytes]]:
    return [
        ("random bytes", rng.randbytes(rng.randint(1, 300))),
        (
            "a valid message cut short",
            valid[: rng.randrange(1, len(valid))] if len(valid) > 1 else b"\x0a",
        ),
        ("wrong wire type", b"\x0d\x01\x02\x03\x04" + valid),  # field 1 as fixed32
        ("length past the end", b"\x0a\xff\xff\xff\x0f" + valid[:10]),
    ]


def _cri_messages() -> dict[str, bytes]:
    """A valid request for each intercepted method (what the malformed ones are made from)."""
    spec = PodSpec(name="wire", containers=[ContainerSpec("app", cpu_request=100)])
    sandbox = sandbox_config(spec)
    config = container_config(spec, spec.containers[0], node_memory=1 << 34)
    cid = "f" * 64
    valid = {
        "RunPodSandbox": api_pb2.RunPodSandboxRequest(config=sandbox),
        "CreateContainer": api_pb2.CreateContainerRequest(
            pod_sandbox_id=cid, config=config, sandbox_config=sandbox
        ),
        "UpdateContainerResources": api_pb2.UpdateContainerResourcesRequest(
            container_id=cid, linux=config.linux.resources
        ),
    }
    out = {}
    for intercepted in INTERCEPTED.values():
        name = intercepted.event.value
        message = valid.get(name) or intercepted.request()
        out[intercepted.path] = message.SerializeToString() or b"\x0a\x01x"
    return out


def _plugin_messages() -> dict[str, bytes]:
    service = hook_pb2.DESCRIPTOR.services_by_name["Plugin"]
    out = {}
    for method in service.methods:
        if method.client_streaming:
            continue  # Stream: a bidi call; its framing is abused like the others'
        request = hook_pb2.DESCRIPTOR.message_types_by_name[method.input_type.name]
        from google.protobuf.message_factory import GetMessageClass

        message = GetMessageClass(request)()
        out[f"/{PLUGIN_SERVICE}/{method.name}"] = message.SerializeToString() or b""
    return out


@dataclass
class WireResult:
    seed: int
    rounds: int
    payload_calls: Calls = field(default_factory=Calls)
    abuses: int = 0
    bystander: Calls = field(default_factory=Calls)
    fds: dict[str, tuple[int, int]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    spared_path: bool = False
    """No bit flip in crihook's method names (the grpc data path, KNOWN_FATAL)."""

    def summary(self) -> str:
        lines = [
            f"wire: seed {self.seed}, {self.rounds} rounds: {self.payload_calls.total} calls "
            f"with malformed payloads, {self.abuses} broken HTTP/2 connections",
            self.payload_calls.table(),
            f"  bystander connections: {self.bystander.total} calls, "
            f"{sum(n for (_, code), n in self.bystander.outcomes.items() if code == 'OK')} OK",
            "  fds before -> after: "
            + ", ".join(f"{k} {a} -> {b}" for k, (a, b) in self.fds.items()),
            f"  left out: {KNOWN_FATAL}" if self.spared_path else "  left out: nothing",
            "  invariants: " + ("all hold" if not self.problems else "VIOLATED"),
        ]
        lines += [f"    - {p}" for p in self.problems[:20]]
        return "\n".join(lines)


def _bystander(
    endpoints: list[tuple[str, str, bytes]], calls: Calls, stop: threading.Event
) -> None:
    channels = [grpc.insecure_channel(e) for e, _, _ in endpoints]
    try:
        while not stop.is_set():
            for channel, (_, path, message) in zip(channels, endpoints, strict=True):
                with contextlib.suppress(grpc.RpcError):  # recorded
                    calls.call(path, channel.unary_unary(path), message, timeout=10)
            time.sleep(0.01)
    finally:
        for channel in channels:
            channel.close()


def _fd_count(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def run_wire(
    workdir: Path, rounds: int, seed: int, progress: Callable[[str], None] = lambda _: None
) -> WireResult:
    result = WireResult(seed, rounds)
    rng = random.Random(seed)
    runtime = MemoryRuntime(workdir / "rt.sock").start()
    plugin = Plugin()
    crihook = ProbedCrihook(
        runtime.endpoint, workdir=workdir, hooks="oom", args=["--log-level", "warning"]
    )
    (crihook.plugins_dir / "annotate.toml").write_text(plugin.dropin("50-annotate", "fail"))
    try:
        plugin.start()
        crihook.start()
        assert crihook.proc is not None and plugin.proc is not None
        pids = {"crihook": crihook.proc.pid, "plugin": plugin.proc.pid}
        cri, hooks = _cri_messages(), _plugin_messages()
        configure = hook_pb2.ConfigureRequest().SerializeToString()
        stop = threading.Event()
        by = threading.Thread(
            target=_bystander,
            name="wire-bystander",
            args=(
                [
                    (crihook.endpoint, VERSION, b""),
                    (f"unix://{plugin.socket}", f"/{PLUGIN_SERVICE}/Configure", configure),
                ],
                result.bystander,
                stop,
            ),
        )
        by.start()
        time.sleep(1)  # the bystander's connections are up: they count in "before"
        before = {name: _fd_count(pid) for name, pid in pids.items()}
        result.spared_path = crihook.data_path == "grpc"
        targets = [
            (crihook.endpoint, crihook.socket_path, cri, result.spared_path),
            (f"unix://{plugin.socket}", plugin.socket, hooks, False),
        ]
        try:
            for n in range(rounds):
                for endpoint, sock_path, methods, spare_path in targets:
                    path = rng.choice(sorted(methods))
                    with grpc.insecure_channel(endpoint) as channel:
                        for what, payload in _payloads(rng, methods[path]):
                            try:
                                result.payload_calls.call(
                                    path.rsplit("/", 1)[1],
                                    channel.unary_unary(path),
                                    payload,
                                    timeout=10,
                                )
                            except grpc.RpcError as exc:
                                if unclear_status(exc.code(), exc.details() or ""):
                                    result.problems.append(
                                        f"{path} with {what}: {exc.code().name}: {exc.details()}"
                                    )
                    for what, data, hold in _abuses(rng, path, methods[path], spare_path):
                        try:
                            _send(sock_path, data, hold)
                        except _Gone as exc:
                            raise _Gone(f"after {what!r} ({data!r}): {exc}") from None
                        result.abuses += 1
                if n % max(1, rounds // 5) == 0:
                    progress(f"wire: round {n + 1} of {rounds}")
        except _Gone as exc:
            result.problems.append(str(exc))
        finally:
            stop.set()
            by.join()
        for name, proc, log in (
            ("crihook", crihook.proc, crihook.log_path),
            ("plugin", plugin.proc, plugin.dir / "plugin.log"),
        ):
            if proc.poll() is not None:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
                result.problems.append(f"{name} exited with {proc.returncode}:\n{tail}")
                return result
        time.sleep(1)  # connections the servers are closing
        after = {name: _fd_count(pid) for name, pid in pids.items()}
        result.fds = {name: (before[name], after[name]) for name in pids}
        for name in pids:
            if after[name] > before[name]:
                result.problems.append(f"{name} holds {after[name] - before[name]} more fds")
        result.problems += tracebacks("crihook", crihook.log())
        result.problems += tracebacks("the plugin", (plugin.dir / "plugin.log").read_text())
        failed = {k: n for k, n in result.bystander.outcomes.items() if k[1] != "OK"}
        if failed or not result.bystander.total:
            result.problems.append(f"the bystander's calls failed: {failed}")
        with grpc.insecure_channel(crihook.endpoint) as channel:
            try:
                channel.unary_unary(VERSION)(b"", timeout=5)
            except grpc.RpcError as exc:
                result.problems.append(
                    f"crihook no longer answers: {exc.code().name}: {exc.details()}"
                )
        return result
    finally:
        crihook.kill()
        plugin.close(sig=9)
        runtime.stop()
