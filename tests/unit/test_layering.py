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
                source = ".".join([*base, node.module] if node.module else base)
            elif node.module:
                source = node.module
            else:
                continue
            found.add(source)
            # `from pkg import mod` imports the module pkg.mod, not only the package.
            found |= {f"{source}.{a.name}" for a in node.names} & KNOWN_MODULES
    return {name for name in found if name == "crihook" or name.startswith("crihook.")}


MODULES = _modules()
KNOWN_MODULES = set(MODULES)

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


# proxy/ in wings (issue 29). Each wing may import only the wings listed; the tree draws the
# architecture: the transport-free core knows no transport, recording never needs replay,
# and the operator's side sits on top. Every import counts (function level, TYPE_CHECKING).
BASE = ("config", "config_doc", "errors", "log", "sockets")
TOP = ("app", "cli", "early")
WINGS = ("cri", "state", "chain", "core", "wire", "record", "replay", "ops")
WING_RULES: dict[str, tuple[str, ...]] = {
    "base": ("base",),
    "cri": ("base", "cri"),
    "state": ("base", "cri", "state"),
    "chain": ("base", "cri", "chain"),
    "core": ("base", "cri", "state", "chain", "core"),
    "wire": ("base", "cri", "wire"),
    "record": ("base", "cri", "state", "chain", "core", "record"),
    "replay": ("base", "cri", "state", "chain", "core", "record", "replay"),
    "ops": ("base", "cri", "state", "chain", "core", "wire", "ops"),
}
# The record line format is a leaf: the renderer process loads it, and nothing heavy.
LEAVES = {
    "crihook.proxy.record.lines": (
        "base", "cri", "crihook.proxy.record.redact", "crihook.proxy.record.render",
    ),
}  # fmt: skip
# Imports the layout does not allow yet, each fixed by a later step of issue 29. Exact: an
# entry that no longer occurs fails too, so each fix deletes its line.
KNOWN_VIOLATIONS: set[tuple[str, str]] = {
    # Symbols in the wrong wing (step 2): Readiness, read_topology, the grant grammar,
    # the handler and observer protocols, and record.lines' header part.
    ("crihook.proxy.config", "crihook.proxy.chain.permissions"),
    ("crihook.proxy.core.pipeline", "crihook.proxy.wire.grpc.passthrough"),
    ("crihook.proxy.replay.runner", "crihook.proxy.wire.grpc.passthrough"),
    ("crihook.proxy.ops.check", "crihook.proxy.app"),
    ("crihook.proxy.record.lines", "crihook.proxy.chain.chain"),
    ("crihook.proxy.record.lines", "crihook.proxy.chain.breaker"),
    ("crihook.proxy.record.lines", "crihook.proxy.chain.merge"),
    ("crihook.proxy.record.lines", "crihook.proxy.core.observe"),
    ("crihook.proxy.record.lines", "crihook.proxy.state.store"),
    ("crihook.proxy.wire.grpc.server", "crihook.proxy.core.pipeline"),
    ("crihook.proxy.wire.grpc.server", "crihook.proxy.ops.metrics"),
    ("crihook.proxy.wire.h2.server", "crihook.proxy.core.pipeline"),
    ("crihook.proxy.wire.h2.server", "crihook.proxy.ops.metrics"),
    # Built-in hooks by name (step 3): their reports move behind the registry.
    ("crihook.proxy.ops.cpu_map", "crihook.hooks.devices.pools"),
    ("crihook.proxy.ops.cpu_map", "crihook.hooks.numa"),
    ("crihook.proxy.ops.cpu_map", "crihook.hooks.numa.saved"),
    ("crihook.proxy.ops.node_doc", "crihook.hooks.devices.policy"),
    ("crihook.proxy.ops.node_doc", "crihook.hooks.koordinator.options"),
    ("crihook.proxy.ops.node_doc", "crihook.hooks.numa.hook"),
    ("crihook.proxy.record.recorder", "crihook.hooks.devices.policy"),
    # The control path on the concrete gRPC client (step 5): a Runtime protocol instead.
    ("crihook.proxy.core.sync", "crihook.proxy.wire.grpc.runtime_client"),
    ("crihook.proxy.state.store", "crihook.proxy.wire.grpc.runtime_client"),
}


def _wing(module: str) -> str | None:
    """The wing of a proxy module; None for the top (app, cli, early) and the package."""
    rest = module.removeprefix("crihook.proxy.")
    if module == "crihook.proxy" or rest in TOP:
        return None
    if rest in BASE:
        return "base"
    head = rest.split(".")[0]
    return head if head in WINGS else "unplaced"


PROXY_MODULES = sorted(m for m in MODULES if m == "crihook.proxy" or m.startswith("crihook.proxy."))


def _allowed_in_proxy(module: str, imported: str) -> bool:
    wing = _wing(module)
    if wing is None:
        return True
    allowed = LEAVES.get(module, WING_RULES[wing])
    if imported in allowed:
        return True
    return _wing(imported) in allowed and imported != "crihook.proxy"


def _proxy_breaches(module: str) -> set[tuple[str, str]]:
    imported = {i for i in _imports(MODULES[module], module) if i.startswith("crihook.proxy")}
    return {(module, i) for i in imported if not _allowed_in_proxy(module, i)}


def test_every_proxy_module_is_in_a_wing() -> None:
    unplaced = [m for m in PROXY_MODULES if _wing(m) == "unplaced"]
    assert unplaced == [], f"place these in a wing of proxy/ (test_layering.WINGS): {unplaced}"
    assert {"crihook.proxy.core.pipeline", "crihook.proxy.wire.grpc.server"} <= set(PROXY_MODULES)


@pytest.mark.parametrize("module", PROXY_MODULES)
def test_proxy_wings_point_one_way(module: str) -> None:
    wrong = _proxy_breaches(module) - KNOWN_VIOLATIONS
    wing = _wing(module)
    allowed = LEAVES.get(module, WING_RULES.get(wing or "", ()))
    assert wrong == set(), f"{module} ({wing}) may import only {allowed}: {sorted(wrong)}"


def test_known_violations_are_still_real() -> None:
    found = set().union(*(_proxy_breaches(m) for m in PROXY_MODULES))
    found |= {(m, i) for m in PROXY_MODULES for i in _imports(MODULES[m], m) if _package(i)}
    assert KNOWN_VIOLATIONS - found == set(), "fixed: delete these from KNOWN_VIOLATIONS"


@pytest.mark.parametrize("module", PROXY_MODULES)
def test_the_proxy_imports_no_built_in_hook(module: str) -> None:
    """The proxy reaches a built-in hook only through the registry (crihook.hooks.builtin),
    so a node without that hook never loads its code, and a new hook needs no proxy change."""
    wrong = {(module, i) for i in _imports(MODULES[module], module) if _package(i)}
    assert wrong - KNOWN_VIOLATIONS == set()


def test_the_wing_check_catches_core_importing_a_transport(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from crihook.proxy.wire.grpc import passthrough\n")
    imported = _imports(bad, "crihook.proxy.core.bad")
    assert "crihook.proxy.wire.grpc.passthrough" in imported
    assert not _allowed_in_proxy("crihook.proxy.core.bad", "crihook.proxy.wire.grpc.passthrough")
    assert _allowed_in_proxy("crihook.proxy.ops.bad", "crihook.proxy.wire.grpc.passthrough")
    assert not _allowed_in_proxy("crihook.proxy.record.bad", "crihook.proxy.replay.runner")


@pytest.mark.parametrize("package", [m for m in PROXY_MODULES if MODULES[m].name == "__init__.py"])
def test_proxy_packages_hold_a_docstring_only(package: str) -> None:
    """A wing's __init__ that imported would load its modules (and grpc) before early.py has
    bound kubelet's socket; importing a wing must cost nothing."""
    body = ast.parse(MODULES[package].read_text()).body
    assert len(body) == 1 and isinstance(body[0], ast.Expr), package


def test_logger_names_follow_module_paths_except_the_pinned_ones() -> None:
    """Operators filter on logger names: two are promised (README), the rest are the module's."""
    literal = {}
    for module in PROXY_MODULES:
        for node in ast.walk(ast.parse(MODULES[module].read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "getLogger"
                    and node.args and isinstance(node.args[0], ast.Constant)):  # fmt: skip
                literal.setdefault(module, set()).add(node.args[0].value)
    assert literal == {
        "crihook.proxy.ops.call_log": {"crihook.proxy.call_log"},
        "crihook.proxy.record.recorder": {"crihook.proxy.record"},
        # Run as __main__ (python -m), so __name__ would not name it.
        "crihook.proxy.record.worker": {"crihook.proxy.record.worker"},
        "crihook.proxy.log": {"grpc"},
    }
