"""The command line's own errors: one line, naming the command whose help to read."""

from __future__ import annotations

import pytest

from crihook.proxy.cli import main


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["serve", "--frobnicate"],
            "unrecognized arguments: --frobnicate (see crihook serve --help)",
        ),
        (["state", "--x"], "unrecognized arguments: --x (see crihook state --help)"),
        (["serve", "--log-format", "xml"], "(see crihook serve --help)"),
        ([], "the following arguments are required: command (see crihook --help)"),
    ],
    ids=["serve-unknown-flag", "state-unknown-flag", "serve-bad-choice", "no-command"],
)
def test_usage_errors_are_one_line_naming_the_help(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and line in err and "crihook crihook" not in err
