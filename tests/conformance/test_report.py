"""The conformance runner's pure pieces: critest's command line and report, the comparison."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conformance.__main__ import parse_args
from tests.conformance.critest import (
    CritestError,
    SpecResult,
    critest_argv,
    parse_report,
    summarize_failure,
)
from tests.conformance.report import (
    MISSING,
    Comparison,
    Row,
    compare,
    explain_lab_failures,
    focus_on,
    render_flaky,
    render_lab_failures,
    render_summary,
    render_table,
)


def _entry(
    texts: list[str], leaf: str, state: str, message: str = "", kind: str = "It"
) -> dict[str, object]:
    return {
        "ContainerHierarchyTexts": texts,
        "LeafNodeText": leaf,
        "LeafNodeType": kind,
        "State": state,
        "Failure": {"Message": message} if message else None,
    }


REPORT = [
    {
        "SuitePath": "/x",
        "SpecReports": [
            _entry([], "", "passed", kind="SynchronizedBeforeSuite"),
            _entry(["[k8s.io] Image Manager"], "public image with tag", "passed"),
            _entry(
                ["[k8s.io] Image Manager"],
                "public image with digest",
                "failed",
                "failed to pull image\nmore detail",
            ),
            _entry(["[k8s.io] AppArmor"], "should enforce", "skipped", "AppArmor disabled"),
            _entry(["[k8s.io] Image Manager"], "public image with tag", "passed"),
            _entry([], "", "failed", "no runtime", kind="ReportAfterSuite"),
        ],
    }
]


def test_parse_report_keeps_specs_and_reports_failed_suite_nodes() -> None:
    specs, setup = parse_report(REPORT)
    assert specs == [
        SpecResult("[k8s.io] Image Manager public image with tag", "passed"),
        SpecResult(
            "[k8s.io] Image Manager public image with digest", "failed", "failed to pull image"
        ),
        SpecResult("[k8s.io] AppArmor should enforce", "skipped", "AppArmor disabled"),
        SpecResult("[k8s.io] Image Manager public image with tag (#2)", "passed"),
    ]
    assert setup == [SpecResult("ReportAfterSuite", "failed", "no runtime")]


def test_parse_report_refuses_what_is_not_a_ginkgo_report() -> None:
    with pytest.raises(CritestError, match="not a list"):
        parse_report({"SpecReports": []})


@pytest.mark.parametrize(
    ("parallel", "focus", "extra"),
    [
        (1, None, []),
        (4, None, ["-parallel=4"]),
        (1, "Image", ["-ginkgo.focus=Image"]),
    ],
    ids=["serial-has-no-parallel-flag", "parallel-4", "focus"],
)
def test_critest_argv(parallel: int, focus: str | None, extra: list[str]) -> None:
    argv = critest_argv(
        Path("/c/critest"), "unix:///s.sock", seed=7, report=Path("/r.json"),
        parallel=parallel, focus=focus, timeout_minutes=5,
    )  # fmt: skip
    assert argv == [
        "/c/critest",
        "-runtime-endpoint=unix:///s.sock",
        "-image-endpoint=unix:///s.sock",
        "-ginkgo.seed=7",
        "-ginkgo.json-report=/r.json",
        "-ginkgo.no-color",
        "-ginkgo.timeout=5m",
        *extra,
    ]


def _specs(**states: str) -> list[SpecResult]:
    return [SpecResult(name, state) for name, state in states.items()]


@pytest.mark.parametrize(
    ("runs", "ran", "same", "differ"),
    [
        (
            {"direct": _specs(a="passed", b="failed", c="skipped"),
             "via": _specs(a="passed", b="failed", c="skipped")},
            2, 2, 0,
        ),
        (
            {"direct": _specs(a="passed", b="failed"), "via": _specs(a="failed", b="failed")},
            2, 1, 1,
        ),
        (
            {"direct": _specs(a="passed", b="skipped"), "via": _specs(a="passed", b="passed")},
            2, 1, 1,
        ),
        ({"direct": _specs(a="passed", b="passed"), "via": _specs(a="passed")}, 2, 1, 1),
        ({"direct": _specs(a="skipped"), "via": _specs(a="skipped")}, 0, 0, 0),
    ],
    ids=["all-same", "outcome-differs", "skip-vs-ran", "missing-in-one", "all-skipped"],
)  # fmt: skip
def test_compare_counts(
    runs: dict[str, list[SpecResult]], ran: int, same: int, differ: int
) -> None:
    comparison = compare(runs)
    assert (comparison.ran, comparison.same, comparison.differ) == (ran, same, differ)
    assert render_summary(comparison) == (
        f"conformance: {ran} specs ran, {same} same both ways, {differ} differ"
    )


def test_compare_marks_missing_specs_and_ok_needs_enough_specs() -> None:
    comparison = compare({"direct": _specs(a="passed", b="passed"), "via": _specs(a="passed")})
    assert [r.outcomes for r in comparison.rows] == [("passed", "passed"), ("passed", MISSING)]
    assert not comparison.ok()
    many = {f"s{i}": "passed" for i in range(80)}
    assert compare({"direct": _specs(**many), "via": _specs(**many)}).ok()
    assert not compare({"direct": _specs(**many), "via": _specs(**many)}).ok(min_specs=81)


def test_render_table_has_a_row_per_spec_and_flags_differences() -> None:
    table = render_table(
        compare({"direct": _specs(a="passed", b="failed"), "via": _specs(a="passed", b="passed")})
    )
    assert table.splitlines() == [
        "| spec | direct | via | same |",
        "|---|---|---|---|",
        "| a | pass | pass | yes |",
        "| b | FAIL | pass | **NO** |",
    ]


def test_lab_failures_get_their_reason_and_unknown_ones_say_so() -> None:
    direct = [
        SpecResult(
            "[k8s.io] Image Manager public image with digest should be pulled and removed",
            "failed",
            "not found",
        ),
        SpecResult("[k8s.io] Something new should work", "failed", "boom"),
        SpecResult("[k8s.io] Fine", "passed"),
        SpecResult("[k8s.io] AppArmor", "skipped"),
    ]
    failures = explain_lab_failures(direct, "2")
    assert [(f.spec.split()[-1], bool(f.reason)) for f in failures] == [
        ("removed", True),
        ("work", False),
    ]
    text = render_lab_failures(failures)
    assert "digest-pinned" in text
    assert "NOT A KNOWN LAB LIMIT: boom" in text


@pytest.mark.parametrize(
    ("argv", "containerd", "parallel", "ways"),
    [
        ([], "1.6", 1, ("direct", "crihook-none", "crihook-annotate")),
        (["--runtime", "crio", "--parallel", "3"], "crio", 3,
         ("direct", "crihook-none", "crihook-annotate")),
        (["--ways", "direct,crihook-none"], "1.6", 1, ("direct", "crihook-none")),
    ],
    ids=["defaults", "crio-parallel", "two-ways"],
)  # fmt: skip
def test_command_line(argv: list[str], containerd: str, parallel: int, ways: tuple[str]) -> None:
    options = parse_args([*argv, "--seed", "5"])
    assert (options.containerd, options.parallel, options.seed) == (containerd, parallel, 5)
    assert tuple(w.name for w in options.ways) == ways


@pytest.mark.parametrize(
    "argv",
    [["--containerd", "1.7"], ["--parallel", "0"], ["--ways", "direct,sideways"]],
    ids=["unknown-containerd", "parallel-0", "unknown-way"],
)
def test_command_line_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)


@pytest.mark.parametrize(
    ("message", "summary"),
    [
        ("", ""),
        ("Expected an error to have occurred.  Got:\n    <nil>: nil",
         "Expected an error to have occurred.  Got: <nil>: nil"),
        ("Unexpected error:\n    <*status.Error | 0x1>: \n    rpc error: code = NotFound desc = x\n"
         "    {\n        s: {}\n    }", "rpc error: code = NotFound desc = x"),
        ("Timed out after 60.001s.\nExpected success", "Timed out after 60.001s."),
        ("Failed:\n    details here", "Failed: details here"),
        ("x" * 300, "x" * 239 + "…"),
    ],
    ids=["empty", "colon-joins-next-line", "grpc-error", "timeout", "colon-joins-details", "long"],
)  # fmt: skip
def test_summarize_failure(message: str, summary: str) -> None:
    assert summarize_failure(message) == summary


def test_a_rerun_that_agrees_makes_a_spec_flaky_not_different() -> None:
    first = compare(
        {"direct": _specs(a="failed", b="passed", c="passed"),
         "via": _specs(a="passed", b="failed", c="passed")}
    )  # fmt: skip
    assert first.differing() == ["a", "b"]
    after = first.with_reruns(
        {"direct": _specs(a="passed", b="passed"), "via": _specs(a="passed", b="failed")}
    )
    assert (after.ran, after.same, after.differ) == (3, 2, 1)
    assert [r.name for r in after.flaky] == ["a"]
    table = render_table(after).splitlines()
    assert table[2:] == [
        "| a | FAIL | pass | yes on re-run (pass/pass) |",
        "| b | pass | FAIL | **NO**, re-run: pass/FAIL |",
        "| c | pass | pass | yes |",
    ]
    assert "- a\n    first run: direct FAIL, via pass" in render_flaky(after)
    assert render_flaky(first) == "Specs that differed once and agreed on a re-run: none."


def test_a_spec_missing_from_the_rerun_still_differs() -> None:
    first = compare({"direct": _specs(a="failed"), "via": _specs(a="passed")})
    assert first.with_reruns({"direct": _specs(a="passed"), "via": []}).differ == 1


def test_focus_on_matches_exactly_the_named_specs() -> None:
    focus = focus_on(["[k8s.io] Image Manager pull (x)", "[k8s.io] B b (#2)", "[k8s.io] B b"])
    assert focus == (r"(^|\s)\[k8s\.io\]\ B\ b$|(^|\s)\[k8s\.io\]\ Image\ Manager\ pull\ \(x\)$")
    pattern = re.compile(focus)
    assert pattern.search("[k8s.io] Image Manager pull (x)")
    assert pattern.search("Suite [k8s.io] Image Manager pull (x)")
    assert not pattern.search("[k8s.io] Image Manager pull (x) and more")
    assert not pattern.search("X[k8s.io] B b")


def test_a_known_flake_of_the_runtime_is_flaky_not_a_difference() -> None:
    """KNOWN_FLAKES: on CRI-O a pass/fail mix of such a spec is listed as flaky (with its
    reason); a spec missing from a run is still a difference, and on another runtime (or
    for another spec) the same mix is a difference."""
    name = "[k8s.io] Container runtime should support execSync with timeout [Conformance]"
    other = "[k8s.io] Container runtime should support starting container [Conformance]"
    rows = (
        Row(name, ("passed", "failed", "passed"), rerun=("failed", "passed", "failed")),
        Row(other, ("passed", "failed", "passed"), rerun=("failed", "passed", "failed")),
    )
    comparison = Comparison(("direct", "crihook-none", "crihook-annotate"), rows)
    on_crio = comparison.with_known_flakes("crio")
    assert (on_crio.differ, [r.name for r in on_crio.flaky]) == (1, [name])
    assert "known flaky here: CRI-O 1.34.0 answers the timed-out ExecSync" in render_flaky(on_crio)
    assert comparison.with_known_flakes("2").differ == 2
    missing = Comparison(comparison.ways, (Row(name, ("passed", MISSING, "passed")),))
    assert missing.with_known_flakes("crio").differ == 1


def test_a_known_flake_failing_directly_is_explained() -> None:
    flake = SpecResult(
        "[k8s.io] Image Consistency should not fail on simultaneous RemoveImage calls", "failed"
    )
    (failure,) = explain_lab_failures([flake], "crio")
    assert failure.reason.startswith("flaky here: CRI-O 1.34.0 answers some of five")
    (failure,) = explain_lab_failures([flake], "2")
    assert failure.reason == ""


def test_critests_image_identifier_spec_is_a_known_flake_on_containerd_2_only() -> None:
    """Its clean-up removes a container it never stopped: a race with the image's `sh`."""
    spec = SpecResult(
        "[k8s.io] Image Identifier Consistency should return the same image identifier "
        "across all APIs [Conformance]",
        "failed",
    )
    (failure,) = explain_lab_failures([spec], "2")
    assert "still running, to stop first" in failure.reason
    (failure,) = explain_lab_failures([spec], "1.6")
    assert failure.reason == ""


def test_a_direct_failure_that_agreed_on_the_rerun_is_explained_as_flaky() -> None:
    spec = SpecResult("[k8s.io] Runtime info runtime should return runtime conditions", "failed")
    (failure,) = explain_lab_failures([spec], "crio", {spec.name})
    assert failure.reason == "flaky here: every way agreed on the re-run (see below)"
    (failure,) = explain_lab_failures([spec], "crio")
    assert failure.reason == ""
