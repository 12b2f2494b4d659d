"""`python -m crihook.hooks.examples.template --socket PATH`."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from crihook.hooks import sdk
from crihook.hooks.examples.template import TemplateHook

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m crihook.hooks.examples.template")
    parser.add_argument("--socket", required=True, help="unix socket to serve on (path)")
    args = parser.parse_args(argv)
    try:
        hook = TemplateHook()
    except ValueError as exc:
        parser.error(str(exc))
    sdk.run(hook, args.socket.removeprefix("unix://"))  # blocks until SIGTERM/SIGINT
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
