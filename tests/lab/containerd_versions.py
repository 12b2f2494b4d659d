"""Which runtimes a real-runtime test runs on: the ``--containerd`` option (alias
``--runtime``).

The session fixture ``containerd`` (tests/lab/fixtures.py) is parametrized by runtime
(``containerd-1.6``, ``containerd-2``, ``crio``), so a test that uses it runs once per
runtime chosen here:

- ``--containerd auto`` (the default, what CI runs): every real-runtime test on containerd
  1.6; modules marked ``both_containerds`` also on containerd 2.x; modules marked
  ``on_crio`` also on CRI-O;
- ``--containerd 1.6``, ``--containerd 2`` or ``--containerd crio``: every real-runtime test
  on that runtime;
- ``--containerd both``: every real-runtime test on containerd 1.6 and 2.x;
- ``--containerd all``: every real-runtime test on all three.

docs/test-bed.md says which modules are marked and what each runtime costs.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "BOTH_MARKER",
    "CHOICES",
    "CRIO",
    "CRIO_MARKER",
    "DEFAULT",
    "OPTION",
    "OPTION_ALIAS",
    "versions_for",
]

OPTION = "--containerd"
OPTION_ALIAS = "--runtime"
CRIO = "crio"
CHOICES = ("auto", "1.6", "2", CRIO, "both", "all")
DEFAULT = "auto"
BOTH_MARKER = "both_containerds"
CRIO_MARKER = "on_crio"
_CONTAINERDS = ("1.6", "2")  # tests.lab.peers.CONTAINERD_CHOICES, in the order they run
_ALL = (*_CONTAINERDS, CRIO)


def versions_for(choice: str, *, marked_both: bool, marked_crio: bool = False) -> Sequence[str]:
    """The runtimes one test runs on, given the option and its markers."""
    if choice == "auto":
        chosen = ["1.6"]
        if marked_both:
            chosen.append("2")
        if marked_crio:
            chosen.append(CRIO)
        return tuple(chosen)
    if choice == "both":
        return _CONTAINERDS
    if choice == "all":
        return _ALL
    if choice in _ALL:
        return (choice,)
    raise ValueError(f"{OPTION} {choice!r}: choose one of {', '.join(CHOICES)}")


def runtime_id(version: str) -> str:
    """The test id of a runtime: ``containerd-1.6``, ``containerd-2``, ``crio``."""
    return CRIO if version == CRIO else f"containerd-{version}"
