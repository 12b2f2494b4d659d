"""The Linux cpulist format: `0-3,8,10-11`, as sysfs prints CPU and node sets and cpusets take them.

Pure functions; sysfs readers and hooks that build `cpuset_cpus` / `cpuset_mems` share them.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

__all__ = ["MAX_CPU_ID", "format_cpu_list", "parse_cpu_list"]

MAX_CPU_ID = (1 << 16) - 1
"""Above any kernel's CPU or NUMA node ids (NR_CPUS is at most 8192). A cpulist can come
from a pod annotation (Koordinator's resource-status): `0-4294967295` would be four billion
ids built on the event loop."""

# One element: a number or an ascending range. ASCII digits only: str.isdigit() would accept
# other scripts' digits, which the kernel never prints.
_ELEMENT = re.compile(r"([0-9]+)(?:-([0-9]+))?")


@functools.lru_cache(maxsize=256)
def parse_cpu_list(text: str) -> frozenset[int]:
    """The ids in a cpulist such as ``"0-3,8,10-11"``; ``""`` (or only whitespace) is empty.

    Surrounding whitespace (sysfs files end with a newline) is ignored. Anything else the
    kernel would not print (a dangling ``-``, a descending range, an empty element, inner
    spaces, the ``a-b:stride/group`` form) or an id above MAX_CPU_ID raises ValueError
    naming the text.

    Cached: a node's containers share a few cpusets (the shared pool's is on most of them),
    read for each at start-up and on the calls' path; the result is immutable.
    """
    stripped = text.strip()
    if not stripped:
        return frozenset()
    ids: set[int] = set()
    for element in stripped.split(","):
        match = _ELEMENT.fullmatch(element)
        if match is None:
            raise ValueError(f"malformed cpu list {stripped!r} (bad element {element!r})")
        low = int(match[1])
        high = low if match[2] is None else int(match[2])
        if high < low:
            raise ValueError(f"malformed cpu list {stripped!r} (descending range {element!r})")
        if high > MAX_CPU_ID:
            raise ValueError(f"cpu list {stripped!r}: {high} is beyond any cpu id ({MAX_CPU_ID})")
        ids.update(range(low, high + 1))
    return frozenset(ids)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """The cpulist the kernel would print for ``cpus``: ascending, runs as ranges (``0-3,8``).

    Two consecutive ids form a range too (``0-1``), as in sysfs. Empty gives ``""``.
    """
    ids = sorted(set(cpus))
    if ids and ids[0] < 0:
        raise ValueError(f"cpu ids are not negative: {ids[0]}")
    parts: list[str] = []
    start = prev = -2
    for cpu in ids:
        if cpu != prev + 1:
            if start >= 0:
                parts.append(_run(start, prev))
            start = cpu
        prev = cpu
    if start >= 0:
        parts.append(_run(start, prev))
    return ",".join(parts)


def _run(start: int, end: int) -> str:
    return str(start) if start == end else f"{start}-{end}"
