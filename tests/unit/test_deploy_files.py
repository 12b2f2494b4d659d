"""Consistency checks for the deployment files against the CLI, the packaging and each other.

systemd/crihook.service, systemd/kubelet.service.d/10-crihook.conf, Dockerfile,
.dockerignore and deploy/config.toml are plain text nobody executes in CI; these tests
catch the drift that would only show up on a node (a renamed flag, a moved socket).
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import shlex
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from packaging.specifiers import SpecifierSet

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd" / "crihook.service"
DROPIN = REPO / "systemd" / "kubelet.service.d" / "10-crihook.conf"
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
CONFIG = REPO / "deploy" / "config.toml"
PYPROJECT = REPO / "pyproject.toml"

Unit = dict[str, dict[str, list[str]]]


# --- systemd ---------------------------------------------------------------------------


def parse_unit(path: Path) -> Unit:
    """Parse a systemd unit/drop-in: sections of repeated keys, in file order.

    Follows systemd.syntax(7) as far as these files need: '#'/';' comments,
    backslash-newline continuation (comment lines inside it are dropped), and an empty
    assignment resetting the list built so far.
    """
    sections: Unit = {}
    current: dict[str, list[str]] | None = None
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        stripped = raw.strip()
        if stripped.startswith(("#", ";")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        line = (pending + stripped).strip()
        pending = ""
        if not line:
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"{path.name}: assignment outside a section: {line!r}"
        assert "=" in line, f"{path.name}: not an assignment: {line!r}"
        key, value = (part.strip() for part in line.split("=", 1))
        values = current.setdefault(key, [])
        if value:
            values.append(value)
        else:
            values.clear()
    assert not pending, f"{path.name}: dangling line continuation"
    return sections


def words(unit: Unit, section: str, key: str) -> list[str]:
    """All space-separated words of a list-valued key (After=, Wants=, ...)."""
    return [word for value in unit.get(section, {}).get(key, []) for word in value.split()]


def runtime_dirs(unit: Unit) -> set[PurePosixPath]:
    return {PurePosixPath("/run") / name for name in words(unit, "Service", "RuntimeDirectory")}


def state_dirs(unit: Unit) -> set[PurePosixPath]:
    return {PurePosixPath("/var/lib") / name for name in words(unit, "Service", "StateDirectory")}


def single(unit: Unit, section: str, key: str) -> str:
    values = unit.get(section, {}).get(key, [])
    assert len(values) == 1, f"[{section}] {key}= expected once, got {values!r}"
    return values[0]


_TIME_UNITS = {"ms": 0.001, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def timespan_seconds(value: str) -> float:
    """systemd.time(7) span: '15', '15s', '1min 30s'."""
    total = 0.0
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value)
    assert parts, f"not a time span: {value!r}"
    for number, unit in parts:
        assert unit in _TIME_UNITS or unit == "", f"unsupported time unit in {value!r}"
        total += float(number) * _TIME_UNITS.get(unit, 1.0)
    return total


def exec_argv(value: str) -> list[str]:
    """ExecStart= command line without systemd's '-@:+!' prefixes."""
    return shlex.split(value.lstrip("-@:+!"))


def long_options(argv: list[str]) -> dict[str, str | None]:
    """'--flag value' / '--flag=value' pairs of a command line (value None for switches)."""
    found: dict[str, str | None] = {}
    for index, token in enumerate(argv):
        if not token.startswith("--"):
            continue
        name, sep, inline = token.partition("=")
        if sep:
            found[name] = inline
        elif index + 1 < len(argv) and not argv[index + 1].startswith("-"):
            found[name] = argv[index + 1]
        else:
            found[name] = None
    return found


def socket_path(endpoint: str) -> PurePosixPath:
    assert endpoint.startswith("unix://"), f"not a unix endpoint: {endpoint!r}"
    return PurePosixPath(endpoint.removeprefix("unix://"))


# --- Dockerfile ------------------------------------------------------------------------


def parse_dockerfile(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs; continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        stripped = raw.strip()
        # Docker drops comment and blank lines, also in the middle of a continuation.
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        line = pending + stripped
        pending = ""
        keyword, _, args = line.partition(" ")
        instructions.append((keyword.upper(), args.strip()))
    assert not pending, "Dockerfile ends inside a line continuation"
    return instructions


def last(instructions: list[tuple[str, str]], keyword: str) -> str:
    found = [args for kw, args in instructions if kw == keyword]
    assert found, f"Dockerfile has no {keyword}"
    return found[-1]


def exec_form(args: str, keyword: str) -> list[str]:
    try:
        value = json.loads(args)
    except json.JSONDecodeError:
        pytest.fail(f"{keyword} must be JSON exec form (signals reach crihook), got {args!r}")
    assert isinstance(value, list) and value, f"{keyword} must be a non-empty JSON array"
    assert all(isinstance(item, str) for item in value), f"{keyword} items must be strings"
    return value


def _ignore_regex(pattern: str) -> re.Pattern[str]:
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def dockerignored(relpath: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore rule: the last matching pattern wins; '!' re-includes.

    A pattern matching a directory excludes everything under it.
    """
    parts = PurePosixPath(relpath).parts
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        body = pattern[1:] if negate else pattern
        body = body.strip().strip("/")
        if not body:
            continue
        regex = _ignore_regex(body)
        if any(regex.match(candidate) for candidate in candidates):
            excluded = not negate
    return excluded


def dockerignore_patterns() -> list[str]:
    lines = DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


# --- shared fixtures -------------------------------------------------------------------


@pytest.fixture(scope="module")
def unit() -> Unit:
    return parse_unit(UNIT)


@pytest.fixture(scope="module")
def dropin() -> Unit:
    return parse_unit(DROPIN)


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    with CONFIG.open("rb") as fh:
        return tomllib.load(fh)


@pytest.fixture(scope="module")
def pyproject() -> dict[str, Any]:
    with PYPROJECT.open("rb") as fh:
        return tomllib.load(fh)


@pytest.fixture(scope="module")
def dockerfile() -> list[tuple[str, str]]:
    return parse_dockerfile(DOCKERFILE)


@pytest.fixture(scope="module")
def cli_parser() -> argparse.ArgumentParser:
    """The owner's `crihook.proxy.cli.build_parser()`; these tests fail until it exists."""
    try:
        cli = importlib.import_module("crihook.proxy.cli")
    except ImportError as exc:
        pytest.fail(f"crihook.proxy.cli is not importable: {exc}")
    build_parser = getattr(cli, "build_parser", None)
    if not callable(build_parser):
        pytest.fail("crihook.proxy.cli.build_parser() is missing")
    parser = build_parser()
    assert isinstance(parser, argparse.ArgumentParser)
    return parser


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    # argparse has no public accessor for subparsers; _actions is stable since 3.2.
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def parse_cli(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"crihook rejects {argv!r} (exit {exc.code})")


def exec_start(unit: Unit) -> list[str]:
    return exec_argv(single(unit, "Service", "ExecStart"))


# --- crihook.service -------------------------------------------------------------------


def test_unit_is_type_notify(unit: Unit) -> None:
    assert single(unit, "Service", "Type") == "notify"
    # Only crihook itself may report readiness, not hook plugins it might spawn.
    assert single(unit, "Service", "NotifyAccess") == "main"


def test_unit_execstart_runs_crihook(unit: Unit) -> None:
    argv = exec_start(unit)
    binary = PurePosixPath(argv[0])
    assert binary.is_absolute(), "ExecStart binary should be an absolute path"
    assert binary.name == "crihook"
    assert argv[1:2] == ["serve"]


def test_unit_execstart_subcommand_exists(unit: Unit, cli_parser: argparse.ArgumentParser) -> None:
    argv = exec_start(unit)
    commands = subcommands(cli_parser)
    assert argv[1] in commands, f"{argv[1]!r} is not one of {sorted(commands)}"


def test_unit_execstart_flags_are_accepted(unit: Unit, cli_parser: argparse.ArgumentParser) -> None:
    argv = exec_start(unit)
    serve = subcommands(cli_parser)[argv[1]]
    # Exact names: argparse would also accept an abbreviation that a later flag could break.
    known = option_strings(serve) | option_strings(cli_parser)
    unknown = sorted(set(long_options(argv[1:])) - known)
    assert not unknown, f"ExecStart flags unknown to `crihook {argv[1]}`: {unknown}"
    parse_cli(cli_parser, argv[1:])


def test_unit_reads_the_default_config_which_may_be_absent(
    unit: Unit, cli_parser: argparse.ArgumentParser
) -> None:
    # An explicit --config that is missing is an error (exit 2, restart loop); the unit relies
    # on the default path, which crihook reads when present and skips when absent.
    assert "--config" not in long_options(exec_start(unit))
    from crihook.proxy.config import DEFAULT_CONFIG_PATH

    assert str(DEFAULT_CONFIG_PATH) == "/etc/crihook/config.toml"
    assert getattr(parse_cli(cli_parser, ["serve"]), "config", None) is None


def test_unit_ordering_and_restart(unit: Unit) -> None:
    assert "containerd.service" in words(unit, "Unit", "After")
    wanted = words(unit, "Unit", "Wants") + words(unit, "Unit", "Requires")
    assert "containerd.service" in wanted
    assert "kubelet.service" in words(unit, "Unit", "Before")
    assert single(unit, "Service", "Restart") == "always"
    assert single(unit, "Service", "KillSignal") in {"SIGTERM", "TERM", "15"}
    assert "multi-user.target" in words(unit, "Install", "WantedBy")


def test_unit_stop_timeout_covers_grace(unit: Unit, config: dict[str, Any]) -> None:
    timeout = timespan_seconds(single(unit, "Service", "TimeoutStopSec"))
    grace = float(config["shutdown_grace_seconds"])
    # systemd SIGKILLs at TimeoutStopSec; crihook must be able to finish its drain first.
    assert timeout > grace, f"TimeoutStopSec={timeout}s does not cover the {grace}s grace"


def test_unit_directories_match_config(unit: Unit, config: dict[str, Any]) -> None:
    # systemd creates (and on stop removes) RuntimeDirectory; the socket must live in it.
    assert socket_path(config["listen"]).parent in runtime_dirs(unit)
    assert PurePosixPath(config["state_dir"]) in state_dirs(unit)


def test_unit_keeps_the_runtime_directory_across_restarts(
    unit: Unit, config: dict[str, Any]
) -> None:
    # The devices hook's staging mounts live there: a restart must find them to release
    # those of containers that are gone, and keep those of containers not started yet.
    staging = PurePosixPath(config.get("node", {}).get("staging_dir", "/run/crihook/mounts"))
    assert any(d in staging.parents for d in runtime_dirs(unit))
    assert single(unit, "Service", "RuntimeDirectoryPreserve") == "yes"


def test_unit_state_directory_is_root_s_alone(unit: Unit) -> None:
    # store.json holds pods' annotations as kubelet sent them: systemd makes the directory
    # 0755 unless told otherwise (crihook would fix it at start, a moment later).
    assert single(unit, "Service", "StateDirectoryMode") == "0700"


# --- kubelet drop-in -------------------------------------------------------------------


def kubelet_flags(dropin: Unit) -> dict[str, str | None]:
    env: dict[str, str] = {}
    for value in dropin.get("Service", {}).get("Environment", []):
        for assignment in shlex.split(value):
            name, _, content = assignment.partition("=")
            env[name] = content
    assert "KUBELET_EXTRA_ARGS" in env, "drop-in must set KUBELET_EXTRA_ARGS"
    return long_options(shlex.split(env["KUBELET_EXTRA_ARGS"]))


def test_dropin_orders_kubelet_after_crihook(dropin: Unit) -> None:
    assert "crihook.service" in words(dropin, "Unit", "After")
    assert "crihook.service" in words(dropin, "Unit", "Requires")


def test_dropin_points_kubelet_at_crihook(dropin: Unit, config: dict[str, Any]) -> None:
    flags = kubelet_flags(dropin)
    assert flags.get("--container-runtime-endpoint") == config["listen"]
    image = flags.get("--image-service-endpoint")
    if image is not None:
        assert image in {config["listen"], config["runtime_endpoint"], config["image_endpoint"]}


def test_dropin_socket_is_crihook_listen_default(
    unit: Unit, dropin: Unit, cli_parser: argparse.ArgumentParser
) -> None:
    endpoint = kubelet_flags(dropin)["--container-runtime-endpoint"]
    listen_flag = long_options(exec_start(unit)).get("--listen")
    if listen_flag is not None:
        assert listen_flag == endpoint
    # Without a config file crihook falls back to its flag default; it must agree too.
    default = getattr(parse_cli(cli_parser, ["serve"]), "listen", None)
    if default is not None:
        assert str(default) == endpoint


# --- Dockerfile ------------------------------------------------------------------------


def test_dockerfile_from(dockerfile: list[tuple[str, str]], pyproject: dict[str, Any]) -> None:
    first = next(kw for kw, _ in dockerfile if kw != "ARG")
    assert first == "FROM"
    # FROM [--platform=...] image [AS name]
    images = [
        next(word for word in args.split() if not word.startswith("--"))
        for kw, args in dockerfile
        if kw == "FROM"
    ]
    assert images, "no FROM"
    final = images[-1]
    assert final == "python:3.11-slim-bookworm"
    python_version = final.split(":", 1)[1].split("-", 1)[0]
    assert python_version in SpecifierSet(pyproject["project"]["requires-python"])


def test_dockerfile_entrypoint_is_crihook(dockerfile: list[tuple[str, str]]) -> None:
    entrypoint = exec_form(last(dockerfile, "ENTRYPOINT"), "ENTRYPOINT")
    assert PurePosixPath(entrypoint[0]).name == "crihook"


def test_console_script_is_importable(pyproject: dict[str, Any]) -> None:
    target = pyproject["project"]["scripts"]["crihook"]
    module_name, _, attr_path = target.partition(":")
    module = importlib.import_module(module_name)
    obj: Any = module
    for attr in attr_path.split("."):
        obj = getattr(obj, attr)
    assert callable(obj), f"{target} is not callable"


def test_dockerfile_cmd_is_a_subcommand(
    dockerfile: list[tuple[str, str]], cli_parser: argparse.ArgumentParser
) -> None:
    entrypoint = exec_form(last(dockerfile, "ENTRYPOINT"), "ENTRYPOINT")
    cmd = exec_form(last(dockerfile, "CMD"), "CMD")
    assert cmd[0] in subcommands(cli_parser)
    parse_cli(cli_parser, entrypoint[1:] + cmd)


def test_dockerfile_stopsignal_and_install(dockerfile: list[tuple[str, str]]) -> None:
    assert last(dockerfile, "STOPSIGNAL") in {"SIGTERM", "15"}
    installs = [args for kw, args in dockerfile if kw == "RUN" and "pip install" in args]
    assert installs, "no pip install"
    assert not any(re.search(r"(^|\s)(-e|--editable)(\s|$)", args) for args in installs)


def test_dockerfile_copy_sources_reach_the_context(dockerfile: list[tuple[str, str]]) -> None:
    patterns = dockerignore_patterns()
    for keyword, args in dockerfile:
        if keyword not in {"COPY", "ADD"} or "--from" in args:
            continue
        tokens = [token for token in shlex.split(args) if not token.startswith("--")]
        for source in tokens[:-1]:
            if source in {".", "./"}:
                continue
            assert (REPO / source).exists(), f"{keyword} {source}: no such file"
            assert not dockerignored(source, patterns), f"{keyword} {source}: in .dockerignore"


def test_dockerignore_keeps_build_inputs(pyproject: dict[str, Any]) -> None:
    patterns = dockerignore_patterns()
    needed = ["pyproject.toml", "deploy/config.toml"]
    readme = pyproject["project"].get("readme")
    if isinstance(readme, str):
        needed.append(readme)
    package_dirs = pyproject["tool"]["setuptools"]["package-dir"].values()
    needed += [f"{folder}/__init__.py" for folder in package_dirs]
    kept_out = [path for path in needed if dockerignored(path, patterns)]
    assert not kept_out, f".dockerignore drops build inputs: {kept_out}"
    for path in ["tests/unit/test_deploy_files.py", ".git/HEAD", "venv/bin/python"]:
        assert dockerignored(path, patterns), f"{path} would be sent to the build"


def test_dockerignore_matcher() -> None:
    patterns = ["**/__pycache__", "tests", "*.egg-info", "docs", "!docs/keep.md"]
    assert dockerignored("proxy/__pycache__/x.pyc", patterns)
    assert dockerignored("__pycache__/x.pyc", patterns)
    assert dockerignored("tests/unit/a.py", patterns)
    assert dockerignored("crihook.egg-info/PKG-INFO", patterns)
    assert not dockerignored("proxy/tests.py", patterns)
    assert not dockerignored("docs/keep.md", patterns)


# --- deploy/config.toml ----------------------------------------------------------------


def test_config_values(config: dict[str, Any]) -> None:
    for key in ("listen", "runtime_endpoint", "image_endpoint"):
        socket_path(config[key])
    mode = int(config["socket_mode"], 8)
    assert 0 < mode <= 0o777
    assert config["log_format"] in {"plain", "json"}
    assert config["log_level"] in {"debug", "info", "warning", "error"}
    assert config["dry_run"] is False
    assert config["shutdown_grace_seconds"] == 10
    assert config["runtime_startup_wait_max_seconds"] > 0
    assert config["plugins_dir"] == "/etc/crihook/hooks.d"
    hooks = config["hooks"]
    assert hooks["order"] == []
    assert hooks["conflict"] == "error"
    assert "kube-system" in hooks["exempt_namespaces"]


def owner_config_module() -> Any:
    try:
        return importlib.import_module("crihook.proxy.config")
    except ImportError as exc:
        pytest.fail(f"crihook.proxy.config is not importable: {exc}")


def test_config_loads_with_crihook_loader(unit: Unit, dropin: Unit) -> None:
    load_config = getattr(owner_config_module(), "load_config", None)
    if not callable(load_config):
        pytest.fail("crihook.proxy.config.load_config(path) is missing")
    settings = load_config(CONFIG)
    assert settings.server.listen == kubelet_flags(dropin)["--container-runtime-endpoint"]
    timeout = timespan_seconds(single(unit, "Service", "TimeoutStopSec"))
    assert settings.server.shutdown_grace_seconds < timeout


def test_crihook_defaults_match_deploy_files(unit: Unit, dropin: Unit) -> None:
    # A node without /etc/crihook/config.toml (or a `crihook serve` without --config)
    # must still serve where kubelet dials and keep state where systemd made room.
    module = owner_config_module()
    defaults = module.Settings()
    assert defaults.server.listen == kubelet_flags(dropin)["--container-runtime-endpoint"]
    assert PurePosixPath(defaults.state_dir) in state_dirs(unit)
    assert socket_path(defaults.server.listen).parent in runtime_dirs(unit)
