"""Path globs for node allowlists: `*` and `?` stay inside one path component, `**` spans
any number of them, `[...]` is a character class (`[!...]` negated).

    /dev/nvidia[0-9]*   /dev/nvidia0, /dev/nvidia12 (not /dev/nvidia0/x)
    /srv/models/**      everything below /srv/models (not /srv/models itself)
    /srv/models         exactly /srv/models

Unlike `fnmatch`, whose `*` matches `/` too, a glob here never reaches further down the tree
than it says. Patterns are checked when the configuration is read (`compile_glob` raises
ValueError naming the pattern); matching is a compiled regular expression.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["GlobSet", "compile_glob", "compile_path_glob"]

_VERDICTS_KEPT = 1024


def compile_glob(pattern: str, *, separator: str = "/") -> re.Pattern[str]:
    """A glob as a regular expression matching the whole string. ValueError: an unclosed
    `[`, an empty pattern or a NUL character."""
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"{pattern!r} is not a glob (an empty pattern matches nothing)")
    if "\0" in pattern:
        raise ValueError(f"{pattern!r} contains a NUL character")
    sep = re.escape(separator)
    out = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            if pattern.startswith("**", i):
                out.append(".*")
                i += 2
                continue
            out.append(f"[^{sep}]*")
        elif c == "?":
            out.append(f"[^{sep}]")
        elif c == "[":
            end = pattern.find("]", i + 2 if pattern[i + 1 : i + 2] in ("!", "]") else i + 1)
            if end < 0:
                raise ValueError(f"{pattern!r}: '[' without a closing ']'")
            body = pattern[i + 1 : end]
            negate = body.startswith("!")
            if negate:
                body = body[1:]
            body = body.replace("\\", "\\\\").replace("^", "\\^")
            # A class never matches the separator: a component glob stays in its component.
            out.append(f"(?!{sep})[{'^' if negate else ''}{body}]")
            i = end
        else:
            out.append(re.escape(c))
        i += 1
    try:
        return re.compile("".join(out), re.DOTALL)
    except re.error as exc:
        raise ValueError(f"{pattern!r} is not a valid glob: {exc}") from None


def compile_path_glob(pattern: str) -> re.Pattern[str]:
    """A glob of absolute paths: it must start with `/` and hold no `.`/`..` component or
    empty component (paths are compared once resolved, so such a pattern could never match)."""
    if not isinstance(pattern, str) or not pattern.startswith("/"):
        raise ValueError(f"{pattern!r} is not an absolute path glob")
    if posixpath.normpath(pattern) != pattern or pattern.startswith("//"):
        raise ValueError(
            f"{pattern!r} is not a normalized path (no '.', '..', '//', or '/' at the end)"
        )
    return compile_glob(pattern)


@dataclass(frozen=True)
class GlobSet:
    """Globs as configured (for messages) and compiled (for matching)."""

    patterns: tuple[str, ...] = ()
    _compiled: tuple[re.Pattern[str], ...] = ()
    _verdicts: dict[str, bool] = field(default_factory=dict, compare=False, repr=False)
    """Text → whether it matches: requests ask for the same few paths and names again."""

    @classmethod
    def of_paths(cls, patterns: Iterable[str]) -> GlobSet:
        listed = tuple(patterns)
        return cls(listed, tuple(compile_path_glob(p) for p in listed))

    @classmethod
    def of_names(cls, patterns: Iterable[str]) -> GlobSet:
        listed = tuple(patterns)
        return cls(listed, tuple(compile_glob(p) for p in listed))

    def matches(self, text: str) -> bool:
        verdict = self._verdicts.get(text)
        if verdict is None:
            if len(self._verdicts) >= _VERDICTS_KEPT:
                self._verdicts.clear()
            verdict = self._verdicts[text] = any(p.fullmatch(text) for p in self._compiled)
        return verdict

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def describe(self) -> str:
        return ", ".join(self.patterns) if self.patterns else "nothing"
