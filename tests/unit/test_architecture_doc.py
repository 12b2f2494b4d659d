"""docs/architecture.md draws proxy/ as a tree, one line per module: it must name every module
there is, and none that is gone, or the map a newcomer reads first is wrong."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs/architecture.md"


def _tree() -> list[str]:
    """The code block that starts with `proxy/`."""
    blocks = re.findall(r"```\n(proxy/\n.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 1, "docs/architecture.md should draw proxy/ once"
    return blocks[0].splitlines()


def drawn_modules(lines: list[str]) -> set[str]:
    """Module paths under proxy/, from a tree drawn two spaces per level."""
    found: set[str] = set()
    folders: list[str] = []
    for line in lines[1:]:
        depth = (len(line) - len(line.lstrip(" "))) // 2
        name = line.split()[0]
        folders = folders[: depth - 1]
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
        else:
            found.add("/".join([*folders, name]))
    return found


def test_the_tree_parses_folders_and_nested_paths() -> None:
    lines = [
        "proxy/",
        "  app.py  x",
        "  cri/  y",
        "    events.py  z",
        "  wire/",
        "    h2/server.py  w",
    ]
    assert drawn_modules(lines) == {"app.py", "cri/events.py", "wire/h2/server.py"}


def test_the_tree_names_every_module_of_proxy_and_no_other() -> None:
    actual = {
        str(p.relative_to(ROOT / "proxy"))
        for p in (ROOT / "proxy").rglob("*.py")
        if p.name != "__init__.py" and "_root" not in p.parts
    }
    drawn = drawn_modules(_tree())
    assert sorted(actual - drawn) == [], "modules missing from the tree"
    assert sorted(drawn - actual) == [], "the tree names modules that do not exist"
