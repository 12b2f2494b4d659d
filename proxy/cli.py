"""Command line: `crihook serve` runs the proxy, `crihook state` shows what it knows,
`crihook replay` runs a recording through the chain, `crihook check` checks a node.

Flags override the config file. Any bad setting or flag is one line on stderr naming it,
and exit code 2.
"""

from __future__ import annotations

import os

from crihook.grpc_tuning import CLASSIC_ENDPOINTS

# Before anything below loads grpc; an operator's own GRPC_EXPERIMENTS wins.
os.environ.setdefault("GRPC_EXPERIMENTS", CLASSIC_ENDPOINTS)

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from crihook import __version__
from crihook.proxy.config import DEFAULT_STATE_DIR, apply_flags, load_config
from crihook.proxy.errors import ConfigError, SocketInUseError, StateDirInUseError
from crihook.proxy.log import configure_logging

__all__ = ["build_parser", "main"]


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._subcommands: dict[str, argparse.ArgumentParser] = {}

    def error(self, message: str) -> NoReturn:
        # One line, like every other configuration error. `prog` is "crihook" or
        # "crihook serve": the help to read is that command's.
        self.exit(2, f"crihook: {message} (see {self.prog} --help)\n")

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        # argparse reports a subcommand's unknown flag from the top: point at the
        # subcommand's help instead.
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            command = self._subcommands.get(getattr(parsed, "command", ""), self)
            command.error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="crihook", description="A CRI runtime proxy with hook plugins.")
    parser.add_argument("--version", action="version", version=f"crihook {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    serve = sub.add_parser("serve", help="run the proxy in front of the runtime")
    serve.add_argument(
        "--config",
        type=Path,
        default=None,
        help="TOML config file (default /etc/crihook/config.toml, may be absent)",
    )
    serve.add_argument("--listen", help="kubelet-facing socket, unix:///run/crihook/crihook.sock")
    serve.add_argument(
        "--runtime-endpoint", help="the runtime's socket, unix:///run/containerd/containerd.sock"
    )
    serve.add_argument(
        "--image-endpoint", help="a separate image service socket (default: the runtime's)"
    )
    serve.add_argument(
        "--hooks",
        help="comma-separated hooks for the chain: NN-name, or built-in names "
        "(cpuset,numa,oom) at their default positions; none for no hooks",
    )
    serve.add_argument(
        "--plugins-dir",
        help="drop-in directory of out-of-process plugins (default /etc/crihook/hooks.d)",
    )
    serve.add_argument("--state-dir", help="where state is kept (default /var/lib/crihook)")
    serve.add_argument(
        "--max-message-bytes",
        type=int,
        help="largest request accepted from kubelet; bigger ones get RESOURCE_EXHAUSTED "
        "(default 25165824, 24 MiB)",
    )
    serve.add_argument(
        "--data-path",
        choices=("grpc", "h2"),
        help="how calls cross crihook: h2 (crihook's own HTTP/2, the default) or grpc (grpc.aio)",
    )
    serve.add_argument(
        "--updates",
        choices=("after-answer", "before-answer"),
        help="when updates to other containers (shared pools) go out: after-answer (in the "
        "background, the default) or before-answer (the call that caused them waits)",
    )
    serve.add_argument(
        "--sysfs-root",
        help="where the node topology is read: <root>/devices/system/{cpu,node} (default /sys)",
    )
    serve.add_argument(
        "--cgroup-root",
        help="where the cgroup file system is (default /sys/fs/cgroup; a fake tree for tests)",
    )
    serve.add_argument(
        "--staging-dir",
        help="where the devices hook pins checked host paths for the runtime "
        "(default /run/crihook/mounts)",
    )
    serve.add_argument(
        "--dry-run", action="store_true", help="run hooks and log their adjustments, apply nothing"
    )
    serve.add_argument(
        "--record",
        metavar="FILE",
        help="append every intercepted call to FILE, one JSON line each (see crihook replay); "
        "written by a renderer process at idle CPU priority: when it falls behind, past "
        "10,000 lines waiting, lines are dropped, counted and the gap is marked, calls never wait",
    )
    serve.add_argument("--record-all", action="store_true", help="record pass-through calls too")
    serve.add_argument(
        "--record-secrets",
        action="store_true",
        help="keep env values and secret-looking annotations in the recording",
    )
    serve.add_argument(
        "--metrics-listen",
        metavar="ADDR",
        help="serve Prometheus metrics (GET /metrics) on unix:///path or HOST:PORT (default: off)",
    )
    serve.add_argument("--log-format", choices=("plain", "json"))
    serve.add_argument("--log-level", type=str.lower, choices=("debug", "info", "warning", "error"))

    state = sub.add_parser("state", help="show pods, containers, owners and hook states")
    state.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    state.add_argument("--json", action="store_true", help="machine-readable output")
    state.add_argument(
        "--cpus",
        action="store_true",
        help="a map of the machine: sockets, NUMA nodes, cores and threads, each CPU reserved, "
        "shared or held by a container, with NUMA memory and pooled devices",
    )

    replay = sub.add_parser(
        "replay",
        help="run a recording (crihook serve --record) through the chain and compare; "
        "exit 0 same, 1 different, 2 unreadable file",
    )
    replay.add_argument("file", type=Path, help="the recording")
    replay.add_argument(
        "--config",
        type=Path,
        default=None,
        help="replay with this config and the plugin drop-ins of its plugins_dir (default: "
        "recorded)",
    )
    replay.add_argument(
        "--hooks", help="replay with these in-process hooks instead (or none); plugins stay"
    )
    replay.add_argument(
        "--update", action="store_true", help="rewrite the recording's expectations"
    )
    replay.add_argument(
        "--explain", action="append", default=[], metavar="HOOK",
        help="also show, per container, what HOOK set and why (repeatable; the exit status "
        "stays that of the comparison)",
    )  # fmt: skip
    replay.add_argument(
        "--log-level", type=str.lower, choices=("debug", "info", "warning", "error"),
        default="error", help="crihook's own log while replaying (default error)",
    )  # fmt: skip
    # Every flag of serve, shared (not copied), so the unit's ExecStart arguments can be
    # checked as they are.
    check = sub.add_parser(
        "check",
        parents=[serve],
        add_help=False,
        description="Validate the settings and plugin drop-ins, reach the runtime (version, "
        "cgroup driver and version), and check kubelet's settings when given. Exit 0: ok; "
        "1: warnings; 2: errors.",
        help="check the settings, the runtime and kubelet's settings before serving; "
        "exit 0 ok, 1 warnings, 2 errors",
    )
    check.add_argument(
        "--kubelet-config", type=Path, help="kubelet's KubeletConfiguration file to check"
    )
    check.add_argument(
        "--kubelet-flags",
        metavar="ARGS",
        help="kubelet's command line (one string) to check; its --config and --config-dir "
        "are read too",
    )
    check.add_argument(
        "--json",
        action="store_true",
        help="print the findings as one JSON object (findings, counts, exit) for tools",
    )
    parser._subcommands = {"serve": serve, "state": state, "replay": replay, "check": check}
    return parser


def _serve(args: argparse.Namespace) -> int:
    settings = apply_flags(load_config(args.config), vars(args))
    configure_logging(settings.log_format, settings.log_level)
    from crihook.proxy.early import claim

    claimed = claim(settings)  # listening before the rest is imported and loaded
    try:
        import uvloop
    except ImportError:  # pragma: no cover - a declared dependency; the default loop works too
        return asyncio.run(_run(settings, claimed))
    return uvloop.run(_run(settings, claimed))


async def _run(settings: object, claimed: object) -> int:
    from crihook.proxy.app import run

    return await run(settings, claimed)  # type: ignore[arg-type]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "serve":
            return _serve(args)
        if args.command == "check":
            from crihook.proxy.ops.check import check_command

            return check_command(args, sys.stdout)
        if args.command == "replay":
            from crihook.proxy.replay.cli import replay_command

            configure_logging("plain", args.log_level)
            return replay_command(
                args.file, args.config, args.hooks, args.update, sys.stdout, args.explain
            )
        if args.cpus:
            from crihook.proxy.ops.cpu_map_cli import show_map

            return show_map(args.state_dir, args.json, sys.stdout)
        from crihook.proxy.ops.state_cli import show_state

        return show_state(args.state_dir, args.json)
    except ConfigError as exc:
        print(f"crihook: config error: {exc}", file=sys.stderr)
        return 2
    except (SocketInUseError, StateDirInUseError) as exc:
        print(f"crihook: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
