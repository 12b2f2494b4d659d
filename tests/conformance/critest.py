"""Run critest once against one CRI endpoint and read its per-spec outcomes.

critest is a Ginkgo test binary; its JSON report (``-ginkgo.json-report``) has one entry
per spec with the container texts, the leaf text, the state and the failure. Only ``It``
nodes are specs; suite set-up nodes are reported separately (:attr:`CritestResult.setup`).

critest's own temp files (pod log dirs, seccomp profiles, the parallel symlink) go to a
private TMPDIR that is removed after the run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CritestError",
    "CritestResult",
    "SpecResult",
    "critest_argv",
    "parse_report",
    "run_critest",
    "summarize_failure",
]

_OUTPUT_TAIL = 60


class CritestError(RuntimeError):
    """critest could not run, or ran but wrote no usable report; the message says why."""


@dataclass(frozen=True)
class SpecResult:
    name: str  # container texts and leaf text, joined by spaces
    state: str  # passed, failed, skipped, pending, panicked, timedout, interrupted, aborted
    message: str = ""  # the failure (or skip) message, first line

    @property
    def ran(self) -> bool:
        return self.state not in ("skipped", "pending")


@dataclass(frozen=True)
class CritestResult:
    specs: tuple[SpecResult, ...]
    setup: tuple[SpecResult, ...]  # BeforeSuite and friends that did not pass
    seconds: float
    exit_code: int
    output_tail: str

    def by_name(self) -> dict[str, SpecResult]:
        return {s.name: s for s in self.specs}


def critest_argv(
    critest: Path,
    endpoint: str,
    *,
    seed: int,
    report: Path,
    parallel: int = 1,
    focus: str | None = None,
    timeout_minutes: int = 30,
) -> list[str]:
    """The critest command line. ``-parallel`` only above 1: Ginkgo reads ``-parallel 1``
    as go test's own flag and aborts. ``focus``: a regexp of specs to run (tests use it)."""
    argv = [
        str(critest),
        f"-runtime-endpoint={endpoint}",
        f"-image-endpoint={endpoint}",
        f"-ginkgo.seed={seed}",
        f"-ginkgo.json-report={report}",
        "-ginkgo.no-color",
        f"-ginkgo.timeout={timeout_minutes}m",
    ]
    if focus:
        argv.append(f"-ginkgo.focus={focus}")
    if parallel > 1:
        argv.append(f"-parallel={parallel}")
    return argv


def parse_report(doc: object) -> tuple[list[SpecResult], list[SpecResult]]:
    """(specs, failed set-up nodes) from a Ginkgo v2 JSON report (a list of suites)."""
    if not isinstance(doc, list):
        raise CritestError("the Ginkgo JSON report is not a list of suite reports")
    specs: list[SpecResult] = []
    setup: list[SpecResult] = []
    seen: dict[str, int] = {}
    for suite in doc:
        for entry in suite.get("SpecReports") or []:
            texts = [*(entry.get("ContainerHierarchyTexts") or []), entry.get("LeafNodeText", "")]
            name = " ".join(t.strip() for t in texts if t and t.strip())
            state = str(entry.get("State", "unknown"))
            failure = entry.get("Failure") or {}
            message = summarize_failure(str(failure.get("Message", "")))
            result_name = name or str(entry.get("LeafNodeType", "?"))
            if entry.get("LeafNodeType") != "It":
                if state not in ("passed", "skipped"):
                    setup.append(SpecResult(result_name, state, message))
                continue
            # Two specs with one name would hide each other in a table keyed by name.
            count = seen.get(result_name, 0)
            seen[result_name] = count + 1
            if count:
                result_name = f"{result_name} (#{count + 1})"
            specs.append(SpecResult(result_name, state, message))
    return specs, setup


def summarize_failure(message: str, limit: int = 240) -> str:
    """One line from a Gomega failure: the gRPC error when there is one (the lines after
    "Unexpected error:" are Go's dump of the error value), else the first line or two."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    rpc = next((line for line in lines if line.startswith("rpc error:")), None)
    text = rpc or (
        f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]
    )
    return text if len(text) <= limit else text[: limit - 1] + "…"


def run_critest(
    critest: Path,
    endpoint: str,
    *,
    seed: int,
    workdir: Path,
    parallel: int = 1,
    ginkgo: Path | None = None,
    focus: str | None = None,
    timeout_minutes: int = 30,
    log_path: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> CritestResult:
    """Run critest against ``endpoint`` and return every spec's outcome.

    A failing spec makes critest exit non-zero: that is an outcome, not an error. Only a
    missing or unreadable report raises CritestError (with the tail of critest's output).
    """
    if parallel > 1 and ginkgo is None:
        raise CritestError("critest -parallel needs the ginkgo binary (tests.lab.peers.ginkgo)")
    workdir.mkdir(parents=True, exist_ok=True)
    report = workdir / "report.json"
    report.unlink(missing_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="critest-", dir=workdir))
    run_env = {**os.environ, **(env or {}), "TMPDIR": str(tmp)}
    if ginkgo is not None:
        run_env["PATH"] = f"{ginkgo.parent}:{run_env.get('PATH', '')}"
    argv = critest_argv(
        critest,
        endpoint,
        seed=seed,
        report=report,
        parallel=parallel,
        focus=focus,
        timeout_minutes=timeout_minutes,
    )
    log_path = log_path or workdir / "critest.log"
    start = time.monotonic()
    try:
        with open(log_path, "wb") as log:
            proc = subprocess.run(
                argv,
                cwd=workdir,
                env=run_env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=timeout_minutes * 60 + 120,
                check=False,
            )
    except subprocess.TimeoutExpired as exc:
        raise CritestError(
            f"critest did not finish in {timeout_minutes} min; see {log_path}"
        ) from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    seconds = time.monotonic() - start
    tail = _tail(log_path)
    try:
        doc = json.loads(report.read_text())
    except (OSError, ValueError) as exc:
        raise CritestError(
            f"critest exited {proc.returncode} without a readable report ({exc}); "
            f"last lines of {log_path}:\n{tail}"
        ) from exc
    specs, setup = parse_report(doc)
    return CritestResult(tuple(specs), tuple(setup), seconds, proc.returncode, tail)


def _tail(path: Path, lines: int = _OUTPUT_TAIL) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"
