"""What `pip install .` installs: every package of the tree, and every built-in hook.

The folders install under `crihook.*` through setuptools' package-dir mapping, which needs
each package listed in pyproject.toml; an editable install finds unlisted ones anyway, so only
a real wheel shows a package that was forgotten.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from crihook.hooks.builtin import BUILTIN_HOOKS

ROOT = Path(__file__).resolve().parents[2]
PREFIXES = {"proxy": "crihook.proxy", "hooks": "crihook.hooks", "api": "crihook.api"}


def source_packages() -> Iterator[str]:
    """Dotted names of every package folder under proxy/, hooks/ and api/."""
    for folder, dotted in PREFIXES.items():
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            rel = init.parent.relative_to(ROOT / folder)
            if rel.parts[:1] == ("_root",):
                yield "crihook"
                continue
            yield ".".join((dotted, *rel.parts)) if rel.parts else dotted


def test_every_package_folder_is_listed_in_pyproject() -> None:
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    missing = sorted(set(source_packages()) - listed)
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {missing}"


@pytest.fixture(scope="module")
def wheel_files(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    # Built from a copy: setuptools writes build/ and *.egg-info next to the sources.
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for folder in PREFIXES:
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        cwd=src,
    )
    (wheel,) = out.glob("crihook-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        return set(zf.namelist())


def test_the_wheel_holds_every_module(wheel_files: set[str]) -> None:
    expected = set()
    for folder in PREFIXES:
        for module in (ROOT / folder).rglob("*.py"):
            rel = module.relative_to(ROOT / folder)
            if rel.parts[:1] == ("_root",):
                expected.add("/".join(("crihook", *rel.parts[1:])))
            elif (module.parent / "__init__.py").exists():
                expected.add("/".join(("crihook", folder, *rel.parts)))
    missing = sorted(expected - wheel_files)
    assert not missing, f"the wheel lacks {missing}"


@pytest.mark.parametrize("name", sorted(BUILTIN_HOOKS))
def test_every_builtin_hook_is_in_the_wheel(name: str, wheel_files: set[str]) -> None:
    module = BUILTIN_HOOKS[name].target.partition(":")[0]
    path = module.replace(".", "/")
    assert f"{path}/__init__.py" in wheel_files or f"{path}.py" in wheel_files
