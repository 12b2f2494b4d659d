"""The annotate example plugin (crihook.hooks.examples.annotate) as its own process, and
the drop-in that plugs it into a crihook under test."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from tests.lab.crihook_proc import PATIENCE, short_tmpdir, wait_for

__all__ = ["KEY", "Plugin"]

KEY = "example.com/annotated"


class Plugin:
    """The annotate example plugin, as its own process."""

    def __init__(self, *extra: str, value: str = "by-plugin", key: str = KEY) -> None:
        self.dir = short_tmpdir("pl-")
        self.socket = self.dir / "annotate.sock"
        self.extra = extra
        self.key, self.value = key, value
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Plugin:
        self.socket.unlink(missing_ok=True)
        with open(self.dir / "plugin.log", "ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "crihook.hooks.examples.annotate",
                    "--socket",
                    str(self.socket),
                    "--key",
                    self.key,
                    "--value",
                    self.value,
                    *self.extra,
                ],
                stdout=log,
                stderr=log,
            )
        wait_for(self.socket.exists, PATIENCE, "the plugin's socket")
        return self

    def stop(self, sig: int = 15) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(10)
        self.proc = None

    def close(self, sig: int = 15) -> None:
        """Stopped for good: its directory (socket, log) is removed too. Tests need not call
        it (tests/lab/fixtures.py removes what a test made); runs outside pytest do."""
        self.stop(sig)
        shutil.rmtree(self.dir, ignore_errors=True)

    def dropin(self, name: str, policy: str, timeout_ms: int = 1000, **more: object) -> str:
        lines = [
            f'name = "{name}"',
            f'endpoint = "unix://{self.socket}"',
            f'failure_policy = "{policy}"',
            f"timeout_ms = {timeout_ms}",
        ]
        lines += [f"{k} = {json.dumps(v)}" for k, v in more.items()]
        return "\n".join(lines) + "\n"
