"""Imports point one way: api (api.h2 below all) ← hooks.spec/hooks.node ← the hooks ← proxy.

Hook authors import crihook.hooks.spec and the SDK; the proxy imports the hooks. A hook that
imported the proxy would tie the plugin SDK to crihook's internals (and make cycles).
Checked on the source, every import statement included (TYPE_CHECKING blocks too).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Where each installed package's source lives (pyproject.toml's package-dir).
SOURCES = {"crihook": ROOT / "proxy/_root", "crihook.proxy": ROOT / "proxy"}
SOURCES |= {"crihook.hooks": ROOT / "hooks", "crihook.api": ROOT / "api"}


def _modules() -> dict[str, Path]:
    out = {}
    for package, base in SOURCES.items():
        for path in base.rglob("*.py"):
            parts = path.relative_to(base).with_suffix("").parts
            if package == "crihook.proxy" and parts[0] == "_root":
                continue  # the root package, mapped above
            name = ".".join((package, *parts)).removesuffix(".__init__")
            out[name] = path
    return out


def _imports(path: Path, module: str) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package, up level - 1
                package = module if path.name == "__init__.py" else module.rpartition(".")[0]
                parts = package.split(".")
                base = parts[: len(parts) - (node.level - 1)]
                found.add(".".join([*base, node.module] if node.module else base))
            elif node.module:
                found.add(node.module)
    return {name for name in found if name == "crihook" or name.startswith("crihook.")}


MODULES = _modules()

# (modules under this prefix, may import only these prefixes)
RULES = [
    # crihook's own HTTP/2 sits below the proxy (data path) and the hooks (plugin transport),
    # and knows nothing of CRI or the hook API either.
    ("crihook.api.h2", ("crihook.api.h2",)),
    ("crihook.api", ("crihook.api",)),
    ("crihook.hooks.spec", ("crihook.api", "crihook.hooks.spec", "crihook.hooks.node")),
    ("crihook.hooks.node", ("crihook.api", "crihook.hooks.spec", "crihook.hooks.node")),
    ("crihook.hooks", ("crihook.api", "crihook.hooks", "crihook")),
]


def _allowed(imported: str, prefixes: tuple[str, ...]) -> bool:
    for prefix in prefixes:
        if prefix == "crihook":  # the root package itself (__version__), not its subpackages
            if imported == "crihook":
                return True
        elif imported == prefix or imported.startswith(prefix + "."):
            return True
    return False


def _rule(module: str) -> tuple[str, tuple[str, ...]] | None:
    for prefix, allowed in RULES:
        if module == prefix or module.startswith(prefix + "."):
            return prefix, allowed
    return None


def test_the_source_tree_is_found() -> None:
    assert {"crihook.proxy.chain", "crihook.hooks.spec.hook", "crihook.api"} <= set(MODULES)
    assert "crihook.api.h2.connection" in MODULES
    assert "crihook.hooks.sdk" in MODULES


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _rule(m)))
def test_imports_point_one_way(module: str) -> None:
    rule = _rule(module)
    assert rule is not None
    prefix, allowed = rule
    wrong = sorted(i for i in _imports(MODULES[module], module) if not _allowed(i, allowed))
    assert wrong == [], f"{module} ({prefix}) may import only {allowed}, not {wrong}"


# Built-in hooks use hooks.spec, hooks.node and the shared packages below them, not one
# another (each can be left out of a chain, and none reaches into another's state). What two
# hooks both need lives in a shared package: the CPU ledger (hooks.cpus) that the cpuset hook
# is and the koordinator hook runs.
SHARED_PACKAGES = ("crihook.hooks.node", "crihook.hooks.cpus")
BUILTIN_PACKAGES = sorted(
    {
        "crihook.hooks." + p.name
        for p in (ROOT / "hooks").iterdir()
        if (p / "hook.py").exists() and p.name != "spec"  # spec/hook.py is the Hook base
    }
    | {"crihook.hooks.examples." + p.name for p in (ROOT / "hooks/examples").iterdir()
       if (p / "__init__.py").exists()}
)  # fmt: skip


def _package(module: str) -> str | None:
    return next((p for p in BUILTIN_PACKAGES if module == p or module.startswith(p + ".")), None)


def test_built_in_hooks_are_found() -> None:
    assert {"crihook.hooks.cpuset", "crihook.hooks.devices", "crihook.hooks.examples.guard"} <= (
        set(BUILTIN_PACKAGES)
    )


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _package(m)))
def test_built_in_hooks_do_not_import_one_another(module: str) -> None:
    own = _package(module)
    others = {
        (own, other)
        for i in _imports(MODULES[module], module)
        if (other := _package(i)) is not None and other != own
    }
    assert others == set(), f"{module} imports another built-in hook: {others}"


def test_shared_packages_are_no_hooks_and_import_none() -> None:
    assert not set(SHARED_PACKAGES) & set(BUILTIN_PACKAGES)
    shared = [m for m in MODULES if any(m == p or m.startswith(p + ".") for p in SHARED_PACKAGES)]
    assert "crihook.hooks.cpus.ledger" in shared
    wrong = {(m, i) for m in shared for i in _imports(MODULES[m], m) if _package(i) is not None}
    assert wrong == set()


def test_every_hooks_package_is_a_hook_or_shared_or_known() -> None:
    """A new package under hooks/ is a built-in hook (which no other may import) or a
    declared shared package, so the check above cannot be sidestepped by a package that
    merely lacks hook.py."""
    packages = {"crihook.hooks." + p.name for p in (ROOT / "hooks").iterdir()
                if (p / "__init__.py").exists()}  # fmt: skip
    infrastructure = {"crihook.hooks.spec", "crihook.hooks.remote", "crihook.hooks.examples"}
    assert packages - set(BUILTIN_PACKAGES) - set(SHARED_PACKAGES) == infrastructure


def test_the_check_catches_a_hook_importing_the_proxy(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from crihook.proxy.config import HookSettings\nimport crihook.api.cri\n"
        "from ..spec import Hook\nfrom . import views\n"
    )
    imported = _imports(bad, "crihook.hooks.remote.bad")
    assert imported == {
        "crihook.proxy.config",
        "crihook.api.cri",
        "crihook.hooks.spec",
        "crihook.hooks.remote",
    }
    _, allowed = _rule("crihook.hooks.remote.bad") or ("", ())
    assert not _allowed("crihook.proxy.config", allowed)
    assert _allowed("crihook.api.cri", allowed)


def test_the_plugin_template_teaches_no_import_of_the_proxy() -> None:
    # Plugin authors copy the template (code and README): it must show only what they may use.
    template = ROOT / "hooks/examples/template"
    texts = {p.name: p.read_text() for p in template.iterdir() if p.suffix in (".py", ".md")}
    assert {"README.md", "__init__.py", "__main__.py"} <= set(texts)
    assert [name for name, text in texts.items() if "crihook.proxy" in text] == []
