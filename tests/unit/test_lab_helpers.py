"""Pure parts of the test bed: which containerd versions a test runs on, how crictl's output is
scrubbed before two runs are compared, and the crictl commands the demo suggests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.lab.containerd_versions import versions_for
from tests.lab.crictl import json_stream, scrub, scrub_json, shape
from tests.lab.demo import crictl_hint


@pytest.mark.parametrize(
    ("choice", "marked_both", "marked_crio", "versions"),
    [
        ("auto", True, False, ("1.6", "2")),
        ("auto", False, False, ("1.6",)),
        ("auto", True, True, ("1.6", "2", "crio")),
        ("auto", False, True, ("1.6", "crio")),
        ("1.6", True, True, ("1.6",)),
        ("2", False, False, ("2",)),
        ("crio", False, False, ("crio",)),
        ("both", False, True, ("1.6", "2")),
        ("all", False, False, ("1.6", "2", "crio")),
    ],
    ids=[
        "auto-marked",
        "auto-unmarked",
        "auto-marked-both-and-crio",
        "auto-marked-crio",
        "only-1.6",
        "only-2",
        "only-crio",
        "both",
        "all",
    ],
)
def test_versions_for(
    choice: str, marked_both: bool, marked_crio: bool, versions: tuple[str, ...]
) -> None:
    assert tuple(versions_for(choice, marked_both=marked_both, marked_crio=marked_crio)) == versions


def test_versions_for_an_unknown_choice_names_the_choices() -> None:
    with pytest.raises(ValueError, match=r"choose one of auto, 1\.6, 2, crio, both, all"):
        versions_for("1.7", marked_both=False)


POD = "a" * 64
CTR = "b" * 64


@pytest.mark.parametrize(
    ("text", "scrubbed"),
    [
        (f"Stopped sandbox {POD}\n", "Stopped sandbox <pod>\n"),
        (f"{CTR[:13]}  app  Running", "<ctr>  app  Running"),
        ('time="2026-11-30T10:50:10Z" level=error', 'time="<time>" level=error'),
        ('"finishedAt": "0001-01-01T00:00:00Z"', '"finishedAt": "0001-01-01T00:00:00Z"'),
        ("E1130 10:55:36.129205   10532 remote_runtime.go:1] x", "E<klog> remote_runtime.go:1] x"),
        ('"path": "/proc/22854/ns/net"', '"path": "/proc/<pid>/ns/net"'),
        ('"Mac": "ca:d7:03:39:1f:2a", "veth6c92cf7e"', '"Mac": "<mac>", "<veth>"'),
        ("netns/cni-ad717954-f09b-016d-7730-cdd24dce7145", "netns/<netns>"),
        ('"ip": "10.88.44.3", "other": "10.88.4.3"', '"ip": "<pod-ip>", "other": "10.88.4.3"'),
    ],
    ids=["id", "short-id", "time", "zero-time", "klog", "proc-pid", "mac-veth", "netns", "ip"],
)
def test_scrub(text: str, scrubbed: str) -> None:
    assert scrub(text, {POD: "pod", CTR: "ctr"}, "10.88.44.") == scrubbed


def test_scrub_json_keeps_zero_times_apart_from_set_ones() -> None:
    doc = {"createdAt": "1796035809577293029", "finishedAt": "0", "pid": 7, "x": [{"pid": 0}]}
    assert scrub_json(doc) == {"createdAt": "<set>", "finishedAt": "0", "pid": "<set>",
                               "x": [{"pid": 0}]}  # fmt: skip


def test_shape_keeps_only_keys() -> None:
    assert shape({"cpu": {"value": "31799369"}, "l": [1, 2], "m": {"k": 1}}) == {
        "cpu": "<n>",
        "l": ["<n>", "<n>"],
        "m": {"k": "<n>"},
    }


def test_shape_a_zero_counter_is_a_counter() -> None:
    """protobuf's JSON prints a zero UInt64Value as {}: as much a counter as {"value": n}."""
    assert shape({"majorPageFaults": {}}) == shape({"majorPageFaults": {"value": "3"}})


def test_json_stream_of_an_unfinished_stream() -> None:
    text = '{\n  "a": 1\n}\n{\n  "b": 2\n}\n{\n  "c"'
    assert json_stream(text, complete=False) == [{"a": 1}, {"b": 2}]
    with pytest.raises(ValueError):
        json_stream(text)


def test_the_demo_suggests_the_cached_crictl_or_how_to_get_it() -> None:
    ep = "unix:///tmp/ch-x/crihook.sock"
    assert crictl_hint(Path("/cache/crictl"), ep, CTR) == [
        f"/cache/crictl --config /dev/null --runtime-endpoint {ep} ps",
        f"/cache/crictl --config /dev/null --runtime-endpoint {ep} inspect {CTR[:13]}",
    ]
    assert crictl_hint(None, ep, CTR)[0].startswith(
        "$(.venv/bin/python -m tests.lab.peers path crictl) --config /dev/null"
    )
