"""docs/configuration.md against the config parser, so the reference cannot drift: every key
the parser accepts has a row, every row is a key, each default is the parser's own default,
each flag exists, and every example block loads (and its hooks build)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from crihook.proxy import config as config_module
from crihook.proxy.chain.local_hooks import load_local_hook
from crihook.proxy.chain.plugins import parse_dropin
from crihook.proxy.cli import build_parser
from crihook.proxy.config import HOOK_KEYS, HookSettings, Settings, settings_from_toml
from crihook.proxy.config_doc import settings_doc

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
# Heading → the table's place in the config ("" top level, "hook" a [hooks.<name>] table).
SECTIONS = {
    "Top-level keys": "",
    "`[node]`": "node",
    "`[record]`": "record",
    "`[hooks]`": "hooks",
    "`[hooks.<name>]` and plugin drop-ins": "hook",
}
PARSER_KEYS = {
    "": config_module._TOP_KEYS - {"hooks", "node", "record"},
    "node": config_module._NODE_KEYS,
    "record": config_module._RECORD_KEYS,
    "hooks": config_module._CHAIN_KEYS,
    "hook": HOOK_KEYS,
}
_ROW = re.compile(r"^\| `([a-z_]+)` \|(.+?)\|(.*?)\| .+ \|$")


def documented() -> dict[str, dict[str, tuple[str, str]]]:
    """section → key → (default cell, flag cell)."""
    tables: dict[str, dict[str, tuple[str, str]]] = {}
    section = None
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            section = SECTIONS.get(line[3:])
            continue
        row = _ROW.match(line)
        if row and section is not None:
            key, default, flag = (cell.strip() for cell in row.groups())
            assert key not in tables.setdefault(section, {}), f"{key} twice in [{section}]"
            tables[section][key] = (default, flag)
    return tables


def examples() -> list[str]:
    return re.findall(r"```toml\n(.*?)```", DOC.read_text(), flags=re.S)


def default_of(section: str, key: str) -> Any:
    """The parser's default, as the TOML value that gives it (None: unset)."""
    if section == "hook":
        value = getattr(HookSettings(name="00-x"), key)
        return list(value) if isinstance(value, tuple) else value
    doc = settings_doc(Settings())
    table = doc.get(section, {}) if section else doc
    return table.get(key)


def test_every_section_is_found() -> None:
    assert set(documented()) == set(SECTIONS.values())


@pytest.mark.parametrize("section", list(PARSER_KEYS), ids=lambda s: s or "top")
def test_every_key_and_only_keys(section: str) -> None:
    assert set(documented()[section]) == PARSER_KEYS[section]


@pytest.mark.parametrize(
    ("section", "key"),
    [(s, k) for s, keys in PARSER_KEYS.items() for k in sorted(keys)],
    ids=[f"{s or 'top'}.{k}" for s, keys in PARSER_KEYS.items() for k in sorted(keys)],
)
def test_the_default_is_the_parsers(section: str, key: str) -> None:
    cell, _ = documented()[section][key]
    expected = default_of(section, key)
    if cell == "unset":
        assert expected is None, f"{key}: documented unset, parser default {expected!r}"
        return
    written = tomllib.loads(f"v = {cell.strip('`')}")["v"]
    assert written == expected, f"{key}: documented {cell}, parser default {expected!r}"
    assert type(written) is type(expected) or {type(written), type(expected)} == {int, float}


def test_flags_exist() -> None:
    serve = next(
        action.choices["serve"] for action in build_parser()._actions if action.dest == "command"
    )
    options = {o for action in serve._actions for o in action.option_strings}
    for table in documented().values():
        for key, (_, flag) in table.items():
            for name in re.findall(r"`(--[a-z-]+)", flag):
                assert name in options, f"{key}: {name} is not a `crihook serve` flag"


@pytest.mark.parametrize("block", examples(), ids=lambda b: b.splitlines()[0][:30])
def test_examples_load(block: str) -> None:
    doc = tomllib.loads(block)
    if "name" in doc:  # a plugin drop-in
        assert parse_dropin(Path("/etc/crihook/hooks.d/x.toml"), block).endpoint
        return
    settings = settings_from_toml(doc)
    for hook in settings.chain.hooks:
        load_local_hook(hook)


def test_the_checker_catches_drift() -> None:
    # A default that changed, a key that is not one: both would be noticed.
    assert default_of("", "shutdown_grace_seconds") == 10.0
    assert "listen" in PARSER_KEYS[""] and "order" not in PARSER_KEYS[""]
    with pytest.raises(Exception, match="unknown setting"):
        settings_from_toml({"lsiten": "/x.sock"})
