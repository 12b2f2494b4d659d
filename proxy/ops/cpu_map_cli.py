"""`crihook state --cpus [--json]`: the map of the machine, from the state dir."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import TextIO

from crihook.proxy.ops.cpu_map import MapError, load_map
from crihook.proxy.ops.cpu_map_text import DEFAULT_WIDTH, render_map, use_colour

__all__ = ["show_map"]


def show_map(state_dir: Path, as_json: bool, out: TextIO) -> int:
    """0, or 1 with one line on stderr when there is nothing to draw."""
    if not state_dir.is_dir():
        print(
            f"crihook: no state in {state_dir} (has crihook run with --state-dir there?)",
            file=sys.stderr,
        )
        return 1
    try:
        cpu_map = load_map(state_dir)
    except MapError as exc:
        print(f"crihook: {exc}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(cpu_map.to_json(), indent=2, sort_keys=True), file=out)
        return 0
    # On a terminal as wide as it is, never wider than the layout is made for; piped, 100.
    width = DEFAULT_WIDTH
    if out.isatty():
        columns = shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns
        width = max(60, min(DEFAULT_WIDTH, columns))
    print(render_map(cpu_map, width=width, colour=use_colour(out)), file=out)
    return 0
