"""Coverage-guided fuzzing of crihook's HTTP/2, HPACK and gRPC framing (atheris), by hand.

    .venv/bin/pip install -e '.[fuzz]'
    .venv/bin/python -m bench.fuzz h2_connection --seconds 600
    .venv/bin/python -m bench.fuzz --all --seconds 600          # one target after the other

Each run starts from the target's corpus in tests/fuzz/corpus/<target>/ and its seeds
(tests/fuzz/seeds.py), fuzzes for `--seconds` in a working directory under /tmp, then merges
what it grew back into the repository's corpus, minimised (libFuzzer's `-merge=1`: only
inputs that add coverage are kept). A finding (a crash, an assertion, a timeout) is left in
the working directory as `crash-<sha1>` and reported; the run exits 1. CI does not fuzz: it
replays the corpus (tests/unit/test_fuzz_corpus.py).

The targets are in tests/fuzz/targets.py; crihook.api.h2 and the `hpack` package are
instrumented for coverage.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "fuzz" / "corpus"
NAMES = ("h2_connection", "hpack_decoder", "hpack_differential", "grpc_reader")
MAX_LEN = 4096
"""The longest input tried: a few dozen frames, a few header blocks."""


def _child(launcher: str, target: str, libfuzzer_args: list[str]) -> None:
    """Run inside the libFuzzer process: instrument, then hand over (never returns).
    libFuzzer runs `launcher` (its argv[0]) again for the inner processes of a merge."""
    import atheris

    with atheris.instrument_imports(include=["crihook.api.h2", "hpack"]):
        from tests.fuzz.targets import TARGETS
    atheris.Setup([launcher, *libfuzzer_args], TARGETS[target])
    atheris.Fuzz()


def _libfuzzer(target: str, args: list[str], work: Path, log: Path) -> int:
    launcher = work / "run-target"
    launcher.write_text(
        f"#!/bin/sh\ncd {ROOT} && exec {sys.executable} -m bench.fuzz --child {launcher} "
        f'{target} -- "$@"\n'
    )
    launcher.chmod(0o700)
    with log.open("w") as out:
        return subprocess.run(
            [str(launcher), *args], cwd=work, stdout=out, stderr=subprocess.STDOUT
        ).returncode


def _write_seeds(target: str, into: Path) -> None:
    from tests.fuzz.seeds import seeds

    for data in seeds()[target]:
        (into / hashlib.sha1(data).hexdigest()).write_bytes(data)


def _last_stats(log: Path) -> str:
    """libFuzzer's last status line: executions, coverage (cov), features (ft), corpus."""
    lines = [line for line in log.read_text(errors="replace").splitlines() if " cov: " in line]
    return lines[-1].strip() if lines else "(no status line)"


def fuzz(target: str, seconds: int, keep: bool) -> bool:
    """One target for `seconds`, its corpus merged back; True if nothing was found."""
    corpus = CORPUS / target
    corpus.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"crihook-fuzz-{target}-"))
    grown, artifacts = work / "grown", work / "artifacts"
    grown.mkdir()
    artifacts.mkdir()
    for path in corpus.iterdir():
        shutil.copy(path, grown / path.name)
    _write_seeds(target, grown)
    before = len(list(corpus.iterdir()))
    started = time.monotonic()
    code = _libfuzzer(
        target,
        [
            f"-max_total_time={seconds}",
            f"-max_len={MAX_LEN}",
            "-timeout=20",  # seconds per input: a loaded machine is slow, a hang is not
            "-rss_limit_mb=2048",
            f"-artifact_prefix={artifacts}/",
            "-print_final_stats=1",
            str(grown),
        ],
        work,
        work / "fuzz.log",
    )
    elapsed = time.monotonic() - started
    stats = _last_stats(work / "fuzz.log")
    merged = work / "merged"
    merged.mkdir()
    _libfuzzer(
        target,
        ["-merge=1", f"-max_len={MAX_LEN}", str(merged), str(grown)],
        work,
        work / "merge.log",
    )
    if any(merged.iterdir()):
        shutil.rmtree(corpus)
        shutil.copytree(merged, corpus)
    found = sorted(artifacts.iterdir())
    runs = re.search(r"stat::number_of_executed_units:\s*(\d+)", (work / "fuzz.log").read_text())
    print(
        f"{target}: {elapsed:.0f} s, {runs.group(1) if runs else '?'} inputs run, "
        f"exit {code}; {stats}; corpus {before} -> {len(list(corpus.iterdir()))} inputs, "
        f"{sum(p.stat().st_size for p in corpus.iterdir())} bytes"
    )
    for path in found:
        print(f"  FOUND {path} ({path.stat().st_size} bytes): see {work / 'fuzz.log'}")
    if not found and not keep:
        shutil.rmtree(work)
    elif keep:
        print(f"  working directory kept: {work}")
    return not found and code == 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        _child(argv[1], argv[2], argv[4:])
        return 0
    parser = argparse.ArgumentParser(
        prog="python -m bench.fuzz", description=__doc__.split("\n")[0]
    )
    parser.add_argument("target", nargs="*", metavar="TARGET", help=", ".join(NAMES))
    parser.add_argument("--all", action="store_true", help="every target, one after the other")
    parser.add_argument("--seconds", type=int, default=600, help="per target (default 600)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    args = parser.parse_args(argv)
    targets = list(NAMES) if args.all else args.target
    unknown = [t for t in targets if t not in NAMES]
    if unknown or not targets:
        parser.error(f"name a target ({', '.join(NAMES)}) or --all")
    os.environ.setdefault("PYTHONHASHSEED", "0")
    ok = True
    for target in targets:
        ok = fuzz(target, args.seconds, args.keep) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
