"""Which containerd versions a real-containerd test runs on: the ``--containerd`` option.

The session fixture ``containerd`` (tests/lab/fixtures.py) is parametrized by version, so a
test that uses it runs once per version chosen here:

- ``--containerd auto`` (the default, what CI runs): modules marked ``both_containerds`` run
  on containerd 1.6 and 2.x; every other real-containerd test on 1.6 only;
- ``--containerd 1.6`` or ``--containerd 2``: every real-containerd test on that version;
- ``--containerd both``: every real-containerd test on both.

docs/test-bed.md says which modules are marked and what each version costs.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["BOTH_MARKER", "CHOICES", "DEFAULT", "OPTION", "versions_for"]

OPTION = "--containerd"
CHOICES = ("auto", "1.6", "2", "both")
DEFAULT = "auto"
BOTH_MARKER = "both_containerds"
_ALL = ("1.6", "2")  # tests.lab.peers.CONTAINERD_CHOICES, in the order they run


def versions_for(choice: str, *, marked_both: bool) -> Sequence[str]:
    """The containerd versions one test runs on, given the option and its marker."""
    if choice == "auto":
        return _ALL if marked_both else ("1.6",)
    if choice == "both":
        return _ALL
    if choice in _ALL:
        return (choice,)
    raise ValueError(f"{OPTION} {choice!r}: choose one of {', '.join(CHOICES)}")
