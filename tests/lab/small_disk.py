"""A small tmpfs for disk-fault tests: filled, freed, made read-only and writable again.

Needs root (mount). The mount is always undone, also when the test fails.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

__all__ = ["SmallDisk", "small_disk"]

TEMP_MARK = ".tmp-"  # what crihook's temp files carry in their name


class SmallDisk:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.filler = path / "filler"

    def fill(self) -> None:
        """Take every byte left; afterwards not one more byte can be written."""
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            for chunk in (4096, 1):
                while True:
                    try:
                        os.write(fd, b"\0" * chunk)
                    except OSError as exc:
                        if exc.errno != errno.ENOSPC:
                            raise
                        break
        finally:
            os.close(fd)
        probe = self.path / ".probe"
        try:
            probe.write_bytes(b"x")
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
        else:
            raise AssertionError(f"{self.path} is not full after filling it")
        finally:
            probe.unlink(missing_ok=True)

    def free(self) -> None:
        self.filler.unlink()

    def remount(self, mode: str) -> None:
        """`ro` or `rw`."""
        subprocess.run(["mount", "-o", f"remount,{mode}", str(self.path)], check=True)

    def files(self) -> list[str]:
        """Everything under the mount but the filler, relative, sorted."""
        return sorted(
            str(p.relative_to(self.path)) for p in self.path.rglob("*") if p != self.filler
        )

    def temp_files(self) -> list[str]:
        return [f for f in self.files() if TEMP_MARK in f]


@contextlib.contextmanager
def small_disk(path: Path, size: str = "64k") -> Iterator[SmallDisk]:
    """Mount a tmpfs of `size` at `path` (created if missing) for the block."""
    if os.geteuid() != 0:
        raise PermissionError("mounting a tmpfs needs root (run the tests as root)")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)], check=True
    )
    try:
        yield SmallDisk(path)
    finally:
        if subprocess.run(["umount", str(path)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], check=True)
