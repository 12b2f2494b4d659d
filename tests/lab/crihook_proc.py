"""Runs a real crihook process (`python -m crihook serve`) for tests, on temp sockets."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from crihook.hooks.node.staging import LinuxStaging
from crihook.proxy.config import ServerSettings
from crihook.proxy.ops.state_cli import load_state

__all__ = [
    "DATA_PATHS",
    "DATA_PATH_ENV",
    "PATIENCE",
    "CrihookProcess",
    "clean_up_after",
    "default_data_path",
    "made_so_far",
    "short_tmpdir",
    "wait_for",
]

_VERSION = "/runtime.v1.RuntimeService/Version"

DATA_PATHS = ("grpc", "h2")
DATA_PATH_ENV = "CRIHOOK_TEST_DATA_PATH"
"""Which data path a CrihookProcess runs when its test does not say (`--data-path` of pytest
sets it; unset: crihook's own default): so the whole suite can run on either."""


def default_data_path() -> str:
    return os.environ.get(DATA_PATH_ENV) or ServerSettings().data_path


_CREATED: list[Path] = []
_STARTED: list[CrihookProcess] = []


def short_tmpdir(prefix: str = "ch-") -> Path:
    """A fresh directory under /tmp: unix socket paths must stay under 107 bytes. Removed
    after the test (or the module or session fixture) that made it: tests/lab/fixtures.py
    calls clean_up_after."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    _CREATED.append(path)
    return path


def made_so_far() -> tuple[int, int]:
    """A mark for clean_up_after: what exists now belongs to an earlier (wider) scope."""
    return len(_CREATED), len(_STARTED)


def clean_up_after(mark: tuple[int, int] = (0, 0)) -> None:
    """Kill every crihook started, and remove every short temp dir made, since `mark`: a
    test that failed between start and its `with` block leaves no server behind."""
    dirs, procs = mark
    while len(_STARTED) > procs:
        proc = _STARTED.pop()
        proc.kill()
        release_staging(proc.staging_dir)
    while len(_CREATED) > dirs:
        shutil.rmtree(_CREATED.pop(), ignore_errors=True)


def staging_dir_of(workdir: Path) -> Path:
    """Where a crihook of `workdir` pins host paths (`--staging-dir`): the same for every
    crihook started on that workdir (a restart finds its mounts), and outside every workdir
    and temp tree a test removes, so that removing one never reaches into a bind mount of a
    host tree. Released when the test that started the crihook ends (`clean_up_after`)."""
    digest = hashlib.sha256(str(workdir).encode()).hexdigest()[:12]
    return Path(f"/tmp/ch-staging-{digest}")


def release_staging(staging_dir: Path) -> None:
    """Unmount and remove what a crihook left staged (killed before its pods were removed)."""
    if not staging_dir.is_dir():
        return
    staging = LinuxStaging(str(staging_dir))
    for pod in sorted({key.split("/")[0] for key in staging.keys()}):  # noqa: SIM118
        staging.release(pod)
    staging_dir.rmdir()


PATIENCE = 120.0
"""How long a wait for something that should happen soon may take: the suite must pass on a
loaded 2-core machine (load ~10, other builds and labs beside it), where a process start, a
subprocess's imports or a write-behind can take seconds. A wait returns as soon as its
condition holds, so a generous bound costs a passing test nothing."""


def wait_for(predicate: object, timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class CrihookProcess:
    def __init__(
        self,
        runtime_endpoint: str,
        workdir: Path | None = None,
        args: Sequence[str] = (),
        config: str | None = None,
        hooks: str | None = "none",
        data_path: str | None = None,
    ) -> None:
        self.data_path = data_path or default_data_path()
        self.workdir = workdir or short_tmpdir()
        self.socket_path = self.workdir / "crihook.sock"
        self.state_dir = self.workdir / "state"
        self.plugins_dir = self.workdir / "hooks.d"
        self.plugins_dir.mkdir(exist_ok=True)
        self.log_path = self.workdir / "crihook.log"
        self.staging_dir = staging_dir_of(self.workdir)
        self.runtime_endpoint = runtime_endpoint
        self.args = list(args)
        self.config_path: Path | None = None
        if config is not None:
            self.config_path = self.workdir / "config.toml"
            self.config_path.write_text(config)
        self.hooks = hooks
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket_path}"

    def command(self) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "crihook",
            "serve",
            "--listen",
            self.endpoint,
            "--runtime-endpoint",
            self.runtime_endpoint,
            "--state-dir",
            str(self.state_dir),
            "--plugins-dir",
            str(self.plugins_dir),
            "--log-level",
            "debug",
            "--data-path",
            self.data_path,
            "--staging-dir",
            str(self.staging_dir),
        ]
        if self.config_path is not None:
            cmd += ["--config", str(self.config_path)]
        else:
            # Never read the host's /etc/crihook/config.toml in tests.
            empty = self.workdir / "empty.toml"
            empty.write_text("")
            cmd += ["--config", str(empty)]
        if self.hooks is not None:
            cmd += ["--hooks", self.hooks]
        return cmd + self.args

    def start(self, wait: bool = True, ready: bool = True) -> CrihookProcess:
        log = open(self.log_path, "ab")  # noqa: SIM115 - kept open for the process
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=log, start_new_session=True)
        log.close()
        if self not in _STARTED:  # restarted: stays in the scope that first started it
            _STARTED.append(self)
        if wait:
            wait_for(
                lambda: self.socket_path.exists() or self.proc.poll() is not None,
                PATIENCE,  # type: ignore[union-attr]
                "crihook's socket",
            )
            if self.proc.poll() is not None:
                raise AssertionError(f"crihook exited {self.proc.returncode}:\n{self.log()}")
            if ready:
                wait_for(self._answers, PATIENCE, f"crihook ready\n{self.log()}")
        return self

    def _answers(self) -> bool:
        with grpc.insecure_channel(self.endpoint) as channel:
            try:
                channel.unary_unary(_VERSION)(b"", timeout=2)
                return True
            except grpc.RpcError:
                return False

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, timeout: float = PATIENCE) -> int:
        """SIGTERM and wait; returns the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"crihook did not stop within {timeout}s:\n{self.log()}") from None

    def updates_sent(self, timeout: float = PATIENCE) -> None:
        """Until crihook says, in a status.json written from now on (every second), that no
        update to other containers is due or on its way: what the calls made so far issued
        went out (updates = "after-answer" sends them after kubelet's answer)."""
        since = time.time()

        def sent() -> bool:
            try:
                status = json.loads((self.state_dir / "status.json").read_text())
            except (OSError, ValueError):
                return False
            return bool(status.get("updated_at", 0) > since and status.get("updates_due") == 0)

        wait_for(sent, timeout, "crihook's updates to other containers sent")

    def hook_state(self, name: str) -> dict[str, Any]:
        """A hook's state as crihook persisted it so far: its state file with the journal
        lines written ahead since the last checkpoint (what `crihook state` shows)."""
        doc = load_state(self.state_dir)["hook_states"].get(name)
        return doc if isinstance(doc, dict) else {}

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def __enter__(self) -> CrihookProcess:
        return self if self.proc is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()
