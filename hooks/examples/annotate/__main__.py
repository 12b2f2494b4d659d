"""`python -m crihook.hooks.examples.annotate --socket PATH --key K --value V`."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence

from crihook.hooks import sdk
from crihook.hooks.examples.annotate import AnnotateHook

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m crihook.hooks.examples.annotate",
        description="A crihook plugin adding one annotation to every container created.",
    )
    parser.add_argument("--socket", required=True, help="unix socket to serve on (path)")
    parser.add_argument("--key", required=True, help="annotation key, e.g. example.com/x")
    parser.add_argument("--value", required=True, help="annotation value")
    parser.add_argument(
        "--delay-ms",
        type=int,
        default=0,
        metavar="MS",
        help="sleep this long before answering (fault tests)",
    )
    parser.add_argument("--fail", action="store_true", help="fail every call (fault tests)")
    parser.add_argument(
        "--log-level", default="info", choices=("debug", "info", "warning", "error")
    )
    args = parser.parse_args(argv)
    socket = args.socket.removeprefix("unix://")
    if not socket.startswith("/"):
        parser.error(f"--socket must be an absolute path, not {args.socket!r}")
    try:
        hook = AnnotateHook(
            {"key": args.key, "value": args.value, "delay_ms": args.delay_ms, "fail": args.fail}
        )
    except ValueError as exc:
        parser.error(str(exc))
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        sdk.run(hook, socket)
    except FileExistsError as exc:
        parser.exit(1, f"annotate: {exc}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
