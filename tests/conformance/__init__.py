"""critest, SIG Node's CRI validation suite, directly and through crihook.

    python -m tests.conformance [--containerd 1.6|2] [--parallel N] [--seed N]

runs cri-tools' critest against a lab containerd three ways with one seed (directly,
through crihook with ``--hooks none``, through crihook with an in-process hook chain),
prints every spec's outcome each way and ends with
``conformance: R specs ran, S same both ways, D differ``. It exits 0 only when every spec
had the same outcome every way and at least 80 specs ran. See docs/test-bed.md.

Modules: ``critest`` (run it, read its report), ``report`` (compare, explain, render),
``bed`` (registry + containerd + crihook), ``runner`` (one whole run), ``__main__`` (CLI).
"""
