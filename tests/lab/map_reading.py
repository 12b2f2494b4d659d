"""Reading `crihook state --cpus` back: each CPU's cell in the picture, for tests that check
the picture says what the state says."""

from __future__ import annotations

import re

__all__ = ["drawn"]

_ROW = re.compile(r"(\d+)-(\d+)  (\S(?: {1,2}\S)*)")
"""A map row: its CPUs (a range, as the fixtures number them) and one cell per CPU."""


def drawn(text: str) -> dict[int, str]:
    """CPU id → its cell (`#`, `.`, a holder's letter) in the map's rows (`0-15  # A A . ...`),
    from the first `socket` line to the shared pool's. AssertionError when a row has more or
    fewer cells than CPUs, or a CPU is drawn twice."""
    cells: dict[int, str] = {}
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("socket "))
    end = next(i for i, line in enumerate(lines) if line.startswith(("shared pool", "no CPU")))
    for line in lines[start:end]:
        for match in _ROW.finditer(line):
            first, last = int(match[1]), int(match[2])
            glyphs = match[3].split()
            assert len(glyphs) == last - first + 1, line
            for cpu, glyph in zip(range(first, last + 1), glyphs, strict=True):
                assert cpu not in cells, f"CPU {cpu} drawn twice"
                cells[cpu] = glyph
    return cells
