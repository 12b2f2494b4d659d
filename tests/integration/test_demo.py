"""The README's demo (`python -m tests.lab.demo`): it cleans up even when its stdout is gone."""

from __future__ import annotations

import glob
import subprocess
import sys


def _demo_dirs() -> set[str]:
    return set(glob.glob("/tmp/crihook-demo-*"))


def _running(needle: str) -> list[str]:
    out = subprocess.run(["pgrep", "-af", needle], capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if "pgrep" not in line]


def test_the_demo_cleans_up_when_its_reader_goes_away() -> None:
    """`sh deploy/demo.sh | tee log` and Ctrl-C: tee dies first. Here the reader closes the
    pipe after the first line: every later print hits a closed pipe, and the demo must still
    stop crihook and containerd and remove its directory."""
    before = _demo_dirs()
    demo = subprocess.Popen(
        [sys.executable, "-m", "tests.lab.demo", "--no-wait"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert demo.stdout is not None and demo.stderr is not None
    first = b""
    while not first.strip():
        first = demo.stdout.readline()
        if not first:
            break
    demo.stdout.close()  # the reader is gone
    try:
        err = demo.stderr.read().decode(errors="replace")
        demo.stderr.close()
        code = demo.wait(180)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert first.strip(), "the demo printed nothing"
    assert code == 0, err[-3000:]
    assert "BrokenPipeError" not in err, err[-3000:]
    made = _demo_dirs() - before
    assert made == set(), f"left behind: {made}"
    assert _running("crihook-demo-") == []
