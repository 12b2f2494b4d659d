"""The lab's NRI plugin (tests/lab/nri_plugin, built by tests.lab.peers) as its own process,
connected to a containerd 2.x started with ``Containerd(..., nri_socket=...)``.

What it does to each container (see its main.go): adds the env var and the annotation it is
given, and ``NRI_SAW=<value>``: the value of one annotation as NRI received the container.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from tests.lab import peers
from tests.lab.crihook_proc import wait_for

__all__ = ["NriPlugin"]


class NriPlugin:
    """``NriPlugin(socket, log, env=(k, v), annotation=(k, v), report=key).start()``."""

    def __init__(
        self,
        socket: Path,
        log: Path,
        *,
        env: tuple[str, str],
        annotation: tuple[str, str],
        report: str,
        name: str = "crihook-lab",
    ) -> None:
        self.socket = socket
        self.log_path = log
        self.args = [
            f"-socket={socket}",
            f"-name={name}",
            f"-env={env[0]}={env[1]}",
            f"-annotation={annotation[0]}={annotation[1]}",
            f"-report={report}",
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30) -> NriPlugin:
        """Start it and wait until containerd has registered and synchronized it."""
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [str(peers.nri_plugin()), *self.args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        try:
            wait_for(self._synchronized, timeout, f"the NRI plugin to register\n{self.log()}")
        except BaseException:
            self.stop()
            raise
        return self

    def _synchronized(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"the NRI plugin exited {self.proc.returncode}:\n{self.log()}")
        return "synchronized" in self.log()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = 10) -> int | None:
        """SIGTERM and wait (SIGKILL after ``timeout``); its exit code, None if never started."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode
