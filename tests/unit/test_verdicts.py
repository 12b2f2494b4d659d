"""Origin and Verdict are enums whose values are the words recordings, labels and logs carry."""

from __future__ import annotations

import json
import pickle

import pytest

from crihook.proxy.cri.verdicts import Origin, Verdict

WORDS = {
    Origin: {"crihook", "runtime", "kubelet"},
    Verdict: {"adjusted", "nothing", "hints", "ok", "told", "dry-run", "ignored", "rejected"}
    | {"failed", "cancelled"},
}


@pytest.mark.parametrize("kind", list(WORDS), ids=lambda k: k.__name__)
def test_the_words_are_the_ones_recordings_already_hold(kind: type[Origin | Verdict]) -> None:
    assert {member.value for member in kind} == WORDS[kind]


@pytest.mark.parametrize("member", [*Origin, *Verdict], ids=str)
def test_a_member_is_written_and_compared_as_its_word(member: Origin | Verdict) -> None:
    word = member.value
    assert member == word
    assert str(member) == f"{member}" == "%s" % member == word  # noqa: UP031  # log lines
    assert json.dumps({"v": member}) == json.dumps({"v": word})
    assert pickle.loads(pickle.dumps(member)) is member
