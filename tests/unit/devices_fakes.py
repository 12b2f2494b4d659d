"""A host's files for the devices hook's unit tests: paths, symlinks and device nodes in a
table (`FakeFiles`), resolved as `os.path.realpath(strict=True)` resolves them."""

from __future__ import annotations

import errno
import posixpath

from crihook.hooks.devices.host import DeviceNode

__all__ = ["FakeFiles"]


class FakeFiles:
    """`nodes`: path → DeviceNode (a device node) or None (a file or directory); `links`:
    path → target (absolute or relative, as a symlink holds it). Records every question."""

    def __init__(
        self,
        nodes: dict[str, DeviceNode | None] | None = None,
        links: dict[str, str] | None = None,
    ) -> None:
        self.nodes = dict(nodes or {})
        self.links = dict(links or {})
        self.asked: list[tuple[str, str]] = []

    def add_dir(self, *paths: str) -> FakeFiles:
        for path in paths:
            self.nodes[path] = None
        return self

    def resolve(self, path: str) -> str:
        self.asked.append(("resolve", path))
        return self._resolve(path, 0)

    def _resolve(self, path: str, depth: int) -> str:
        if depth > 40:
            raise OSError(errno.ELOOP, "Too many levels of symbolic links")
        done = "/"
        parts = [p for p in path.split("/") if p]
        while parts:
            part = parts.pop(0)
            if part == ".":
                continue
            if part == "..":
                done = posixpath.dirname(done)
                continue
            here = posixpath.join(done, part)
            target = self.links.get(here)
            if target is not None:
                absolute = target if target.startswith("/") else posixpath.join(done, target)
                resolved = self._resolve(absolute, depth + 1)
                rest = "/".join(parts)
                return (
                    self._resolve(posixpath.join(resolved, rest), depth + 1) if rest else resolved
                )
            if here not in self.nodes and not self._is_dir(here):
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
            done = here
        return done

    def _is_dir(self, path: str) -> bool:
        return any(n.startswith(path + "/") for n in (*self.nodes, *self.links))

    def nonblocking(self) -> FakeFiles:
        return self  # in memory: never waits

    def device(self, path: str) -> DeviceNode | None:
        self.asked.append(("device", path))
        if path in self.links:
            return None  # a symlink is not followed
        if path not in self.nodes:
            if self._is_dir(path):
                return None  # a directory
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        return self.nodes[path]
