"""Closed sets of words an intercepted call's outcome is told in.

`Origin`: who ended a call that did not succeed (`Outcome.status_origin`). `Verdict`: how one
hook's run in one stage went (`HookRun.verdict`). Both are StrEnums whose values are the words
recordings, metrics labels and log lines have always carried: a member compares equal to its
word (`Verdict.ADJUSTED == "adjusted"`), and is written as it.
"""

from __future__ import annotations

import enum

__all__ = ["Origin", "Verdict"]


class Origin(enum.StrEnum):
    """Who ended a call that did not succeed."""

    CRIHOOK = "crihook"  # refused it (the runtime never saw it, or its answer was undone)
    RUNTIME = "runtime"  # answered with an error
    KUBELET = "kubelet"  # gave up (cancelled, or its deadline passed)


class Verdict(enum.StrEnum):
    """How one hook's run in one stage went."""

    ADJUSTED = "adjusted"  # pre/post: an adjustment, applied
    NOTHING = "nothing"  # answered nothing (or an empty adjustment, perhaps with a reason)
    HINTS = "hints"  # hints stage: offered NUMA hints
    OK = "ok"  # a validator let the call through
    TOLD = "told"  # failed stage: told the call failed
    DRY_RUN = "dry-run"  # an adjustment computed and logged, not applied
    IGNORED = "ignored"  # a failure under failure_policy=ignore: the call went on
    REJECTED = "rejected"  # refused the call (a decision, not a failure)
    FAILED = "failed"  # failed, and the failure ended the call (or the failed stage's own)
    CANCELLED = "cancelled"  # kubelet gave up while it ran
