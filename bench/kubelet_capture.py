"""Takes the bench's kubelet requests out of the kubelet corpus: the RunPodSandbox and the
CreateContainer that a real kubelet (v1.37) sent for the corpus's Burstable pod, as their
recorded bytes (redacted as the corpus is: env values read ``<redacted>``).

    python -m bench.kubelet_capture      # rewrites bench/kubelet_captured/*.bin

The corpus is tests/replay/kubelet-containerd-1.6.jsonl (tests/replay/record_kubelet.py);
bench/payloads.py loads the files (``kubelet_create_container_request``).
"""

from __future__ import annotations

import argparse
import base64
import sys
from pathlib import Path

from crihook.proxy.replay.file import CallEntry, read_recording

__all__ = ["CAPTURED_DIR", "CORPUS", "POD", "capture"]

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "tests" / "replay" / "kubelet-containerd-1.6.jsonl"
CAPTURED_DIR = Path(__file__).resolve().parent / "kubelet_captured"
POD = "default/burstable"  # Burstable, as the bench's own pod: the shared pool, not a CPU
WANTED = {"RunPodSandbox": None, "CreateContainer": "app"}  # method -> container


def capture(corpus: Path = CORPUS, out_dir: Path = CAPTURED_DIR) -> list[Path]:
    """Write ``<Method>.bin`` for each wanted call of ``POD``: its request's bytes."""
    found: dict[str, bytes] = {}
    for segment in read_recording(corpus).segments:
        for entry in segment.entries:
            if not isinstance(entry, CallEntry) or entry.doc["pod"] != POD:
                continue
            method = entry.event.value
            if (
                method in WANTED
                and method not in found
                and entry.doc["container"] == (WANTED[method] or "")
            ):
                found[method] = base64.b64decode(entry.doc["request"]["b64"])
    missing = set(WANTED) - set(found)
    if missing:
        raise ValueError(f"{corpus}: no {', '.join(sorted(missing))} of pod {POD}")
    out_dir.mkdir(exist_ok=True)
    written = []
    for method, data in sorted(found.items()):
        path = out_dir / f"{method}.bin"
        path.write_bytes(data)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kubelet_capture")
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--out", type=Path, default=CAPTURED_DIR)
    args = parser.parse_args(argv)
    for path in capture(args.corpus, args.out):
        print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
