"""The corpus the fuzz targets grew (tests/fuzz/corpus/<target>/, by bench/fuzz.py with
atheris), replayed through the same targets without atheris: every input that once found new
code must still pass the target's checks (HTTP/2 frames and connection state, HPACK against
the `hpack` package, gRPC message framing). The inputs that found a bug are kept apart, in
tests/fuzz/findings/<target>/, named for what they found: a merge never drops them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fuzz.seeds import seeds
from tests.fuzz.targets import TARGETS

FUZZ = Path(__file__).resolve().parent.parent / "fuzz"
CORPUS = FUZZ / "corpus"
FINDINGS = FUZZ / "findings"


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_every_input_of_the_corpus_passes_its_target(target: str) -> None:
    inputs = sorted((CORPUS / target).iterdir())
    assert len(inputs) >= 20, f"the {target} corpus is nearly empty: run bench/fuzz.py"
    failed = []
    for path in inputs:
        try:
            TARGETS[target](path.read_bytes())
        except Exception as exc:
            failed.append(f"{path.name}: {type(exc).__name__}: {exc}"[:300])
    assert failed == []


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_the_seeds_pass_their_target(target: str) -> None:
    """The seeds are ordinary traffic: a target that refuses them checks the wrong thing."""
    for data in seeds()[target]:
        TARGETS[target](data)


@pytest.mark.parametrize(
    "finding",
    sorted(FINDINGS.glob("*/*")),
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_what_the_fuzzers_found_stays_fixed(finding: Path) -> None:
    TARGETS[finding.parent.name](finding.read_bytes())
