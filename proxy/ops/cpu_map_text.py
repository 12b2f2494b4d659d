"""The picture `crihook state --cpus` prints: the machine, socket by socket, each NUMA node a
panel with one row per hardware thread and one column per core, each CPU one character:

    socket 0
      NUMA 0  free 13/32 CPUs  54.9/62.9 GiB     NUMA 1  free 32/32 CPUs  62.9/62.9 GiB
          0-15  # A A B B B B .  . . . . . . . .     16-31  . . . . . . . .  . . . . . . . .
       128-143  . A A B B B B .  . . . . . . . .   144-159  . . . . . . . .  . . . . . . . .

`#` reserved, `.` shared pool, a letter: held by the holder of that letter in the list below
the map (pod/container, QoS, CPUs, NUMA memory, pooled devices), `-` a thread that is not
online. Cores are grouped by L3 cache where a NUMA node has several, else by eight. Panels
sit side by side as far as `width` allows; a NUMA node with more cores than fit is cut into
row blocks. Colour (`colour=True`) only adds ANSI styles: the text is the same without.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TextIO

from crihook.hooks.node import Topology, format_cpu_list
from crihook.hooks.report import MemoryBlock
from crihook.proxy.ops.cpu_map import (
    MORE,
    CpuMap,
    Holding,
    cores_of,
    numa_nodes_of_socket,
    socket_cpus,
)

__all__ = ["DEFAULT_WIDTH", "render_map", "use_colour"]

DEFAULT_WIDTH = 100
RESERVED, SHARED, ABSENT, UNUSED = "#", ".", "-", " "
_GAP = "    "  # between panels side by side
_INDENT = "  "
_STYLES = {
    "title": "1",
    "dim": "2",
    "reserved": "35",
    "shared": "2",
    "free": "32",
    "warn": "33",
}
_HOLDER_STYLES = ("1;36", "1;33", "1;32", "1;35", "1;34", "1;31")

Segment = tuple[str, str]
"""Text and the name of its style ("" plain)."""
Line = list[Segment]


def use_colour(stream: TextIO, environ: Mapping[str, str] | None = None) -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set to anything (no-color.org)
    or the terminal is `dumb`."""
    env = os.environ if environ is None else environ
    if env.get("NO_COLOR") or env.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def render_map(cpu_map: CpuMap, width: int = DEFAULT_WIDTH, colour: bool = False) -> str:
    styles = _holder_styles(cpu_map.holdings)
    lines: list[Line] = []
    lines += _header(cpu_map)
    topo = cpu_map.topology
    room = width - len(_INDENT)
    nodes = [(s, n) for s in topo.sockets for n in numa_nodes_of_socket(topo, s)]
    # Twice: the widest row label of the machine first, so that every panel lines up.
    label = max((_label_width(_panel(cpu_map, s, n, room, styles, 0)) for s, n in nodes), default=0)
    panels = {(s, n): _panel(cpu_map, s, n, room, styles, label) for s, n in nodes}
    panel_width = max((_width(line) for p in panels.values() for line in p), default=0)
    for socket in topo.sockets:
        lines += [[], [(f"socket {socket}", "title")]]
        row = [panels[(s, n)] for s, n in nodes if s == socket]
        lines += _side_by_side(row, room, panel_width)
    lines += _memory_only_nodes(cpu_map)
    lines.append([])
    lines += _pool_lines(cpu_map, width)
    lines += [[], *_holding_lines(cpu_map, width, styles)]
    devices = _device_lines(cpu_map, width, styles)
    lines += [[], *devices] if devices else []
    lines.append([])
    lines += _flow("legend", _legend(cpu_map), width, sep="   ")
    return "\n".join(_paint(line, colour).rstrip() for line in lines)


# --- the header -------------------------------------------------------------------------------


def _header(m: CpuMap) -> list[Line]:
    topo = m.topology
    cores = len({c.core for c in topo.cpus.values()})
    tpc = topo.threads_per_core
    nodes = len(topo.numa_nodes)
    shape = (
        f"{_n(len(topo.sockets), 'socket')}, {_n(nodes, 'NUMA node')}, "
        f"{_n(cores, 'core')}, {_n(len(topo.cpus), 'CPU')}"
        f" ({_n(tpc, 'thread')} per core)"
    )
    if topo.offline:
        shape += f", offline {format_cpu_list(topo.offline)}"
    first: Line = [(f"crihook {m.version or '?'}", "title"), ("  ", "")]
    first.append((m.status_line, "free" if m.running else "warn"))
    lines = [first, [(shape, "")]]
    lines += [[(note, "warn")] for note in m.notes]
    return lines


# --- one NUMA node ----------------------------------------------------------------------------


def _panel(
    m: CpuMap, socket: int, node: int, room: int, styles: Mapping[str, str], label: int
) -> list[Line]:
    """The title line, then one row per thread of each block of cores; row labels are
    right-aligned to `label` columns (at least)."""
    topo = m.topology
    cores = list(cores_of(topo, node, socket))
    cpus = topo.cpus_in_numa([node]) & socket_cpus(topo, socket)
    title: Line = [(f"NUMA {node}", "title")]
    if m.cpu_hook is not None:
        free = len(m.free_for_exclusive() & cpus)
        title += [("  free: ", ""), (f"{free}/{len(cpus)} CPUs", "free" if free else "warn")]
    else:
        title += [(f"  {_n(len(cpus), 'CPU')}", "")]
    memory = [t for t in m.memory if t.node == node and t.resource == "memory"]
    if memory:
        table = memory[0]
        sep = ", " if m.cpu_hook is not None else "  "
        title += [(sep, ""), (f"{_gib(table.free)}/{_size(table.allocatable)}", "")]
    groups = _groups(topo, cores)
    threads = max((len(cpus) for _, cpus in cores), default=0)
    label_width = max(
        [label]
        + [len(_row_label([c[1][t] for c in cores if t < len(c[1])])) for t in range(threads)]
    )
    rows: list[Line] = [title]
    for block in _blocks(groups, room - label_width - 2):
        block_cores = [core for group in block for core in group]
        for t in range(threads):
            ids = [cpus[t] for _, cpus in block_cores if t < len(cpus)]
            row: Line = [(_row_label(ids).rjust(label_width), "dim"), ("  ", "")]
            for g, group in enumerate(block):
                if g:
                    row.append(("  ", ""))
                for k, (_, core_cpus) in enumerate(group):
                    if k:
                        row.append((" ", ""))
                    row.append(_cell(m, core_cpus[t] if t < len(core_cpus) else None, styles))
            rows.append(row)
    return rows


def _cell(m: CpuMap, cpu: int | None, styles: Mapping[str, str]) -> Segment:
    if cpu is None:
        return ABSENT, "dim"
    holder = m.owners.get(cpu)
    if holder is not None:
        return holder.glyph, styles[holder.glyph]
    use = m.use(cpu)
    if use == "reserved":
        return RESERVED, "reserved"
    return (SHARED, "shared") if use == "shared" else (UNUSED, "")


def _groups(
    topo: Topology, cores: list[tuple[int, list[int]]]
) -> list[list[tuple[int, list[int]]]]:
    """Cores of a NUMA node in groups: one per L3 cache when the node has several, else
    eight at a time (from 16 cores on: fewer are counted at a glance)."""
    l3 = [topo.cpus[cpus[0]].l3 for _, cpus in cores]
    if len(set(l3)) > 1 and -1 not in l3:
        groups: list[list[tuple[int, list[int]]]] = []
        last = None
        for core, cache in zip(cores, l3, strict=True):
            if cache != last:
                groups.append([])
                last = cache
            groups[-1].append(core)
        if max(len(g) for g in groups) <= 16:
            return groups
    if len(cores) < 16:
        return [cores]
    return [cores[i : i + 8] for i in range(0, len(cores), 8)]


def _blocks(
    groups: list[list[tuple[int, list[int]]]], room: int
) -> Iterable[list[list[tuple[int, list[int]]]]]:
    """Groups in rows that fit `room` columns (2 per core, 1 more between groups), cut
    between groups where they can be, inside a group wider than a row."""
    fit = max(1, (room + 1) // 2)
    block: list[list[tuple[int, list[int]]]] = []
    count = 0
    for group in groups:
        for i in range(0, len(group), fit):
            part = group[i : i + fit]
            if block and 2 * (count + len(part)) - 1 + len(block) > room:
                yield block
                block, count = [], 0
            block.append(part)
            count += len(part)
    if block:
        yield block


def _row_label(ids: Sequence[int]) -> str:
    """A row's CPUs: `0-15` when they run on, else first..last (the panel's title is exact)."""
    if not ids:
        return ""
    if list(ids) == list(range(ids[0], ids[0] + len(ids))):
        return format_cpu_list(ids)
    return f"{ids[0]}..{ids[-1]}"


def _label_width(panel: list[Line]) -> int:
    """The width of the row labels a panel drew (its rows start with the label)."""
    return max((len(row[0][0]) for row in panel[1:]), default=0)


def _side_by_side(panels: list[list[Line]], room: int, w: int) -> list[Line]:
    """Panels of width `w` next to one another, as many as fit in `room`."""
    out: list[Line] = []
    row: list[list[Line]] = []
    used = 0
    for panel in panels:
        if row and used + len(_GAP) + w > room:
            out += _join(row, w)
            row, used = [], 0
        used += (len(_GAP) if row else 0) + w
        row.append(panel)
    if row:
        out += _join(row, w)
    return out


def _join(panels: list[list[Line]], w: int) -> list[Line]:
    widths = [w] * len(panels)
    height = max(len(p) for p in panels)
    lines = []
    for i in range(height):
        line: Line = [(_INDENT, "")]
        for k, (panel, w) in enumerate(zip(panels, widths, strict=True)):
            if k:
                line.append((_GAP, ""))
            part = panel[i] if i < len(panel) else []
            line += part
            line.append((" " * (w - _width(part)), ""))
        lines.append(line)
    return lines


def _memory_only_nodes(m: CpuMap) -> list[Line]:
    """NUMA nodes with memory and no CPUs (CXL, HBM): one line each."""
    topo = m.topology
    lines: list[Line] = []
    for node in topo.numa_nodes:
        if topo.cpus_in_numa([node]):
            continue
        tables = [t for t in m.memory if t.node == node and t.resource == "memory"]
        free = f"  {_gib(tables[0].free)}/{_size(tables[0].allocatable)}" if tables else ""
        lines += [[], [(f"NUMA {node}", "title"), (f"  memory only{free}", "")]]
    return lines


# --- below the map ----------------------------------------------------------------------------


def _pool_lines(m: CpuMap, width: int) -> list[Line]:
    if m.cpu_hook is None:
        return [[("no CPU ledger: containers run where kubelet puts them", "warn")]]
    about = _n(len(m.shared), "CPU")
    if m.reserved:
        reserved = format_cpu_list(m.reserved)
        about += (
            f", reserved {reserved} kept out (strict-cpu-reservation)"
            if m.strict_reservation
            else f", reserved {reserved} included"
        )
    free = m.free_for_exclusive()
    runs = "runs" if m.shared_containers == 1 else "run"
    units: list[Line] = [
        [(format_cpu_list(m.shared) or "empty", "shared")],
        [(f"({about}):", "")],
        [(f"{_n(m.shared_containers, 'container')} {runs} on it;", "")],
        [(f"{len(free)} free for exclusive use", "free" if free else "warn")],
    ]
    return _flow("shared pool", units, width, sep=" ")


def _holding_lines(m: CpuMap, width: int, styles: Mapping[str, str]) -> list[Line]:
    if not m.holdings:
        return [[("no container holds CPUs, NUMA memory or pooled devices of its own", "dim")]]
    labels = [h.label + _state_note(h) for h in m.holdings]
    cpus = [_cpus_text(h) for h in m.holdings]
    who = min(max(len(s) for s in labels), 40)  # a longer name pushes only its own row
    cpu_width = min(max(len(s) for s in cpus), 30)
    memory = sum(b.size for h in m.holdings for b in h.memory if b.resource == "memory")
    devices = sum(len(ids) for h in m.holdings for ids in h.devices.values())
    summary = [_n(len(m.owners), "exclusive CPU")]
    if memory:
        summary.append(f"{_size(memory)} of NUMA memory")
    if devices:
        summary.append(_n(devices, "pooled device"))
    lines: list[Line] = [[("holders", "title"), ("  " + ", ".join(summary), "dim")]]
    for holding, label, cpu_text in zip(m.holdings, labels, cpus, strict=True):
        lead: Line = [(_INDENT, ""), (holding.glyph, styles[holding.glyph])]
        lead.append((f"  {label:<{who}}  {holding.qos:<10}  ", ""))
        column = _width(lead)
        parts = [cpu_text.ljust(cpu_width), *_memory_text(holding.memory)]
        parts += _devices_text(holding)
        line, used = lead, column
        for k, part in enumerate(parts):
            gap = "  " if k else ""
            if k and used + len(gap) + len(part.rstrip()) > width:
                lines.append(line)
                line, used, gap = [(" " * column, "")], column, ""
            line.append((gap + part, ""))
            used += len(gap) + len(part)
        lines.append(line)
    return lines


def _state_note(h: Holding) -> str:
    """Only what changes how to read the row: the store's `created` lags StartContainer by a
    fraction of a second, and `unknown` says nothing."""
    return f" ({h.state})" if h.state in ("being created", "exited") else ""


def _cpus_text(h: Holding) -> str:
    if not h.cpus:
        return "shared pool" if h.container else "no CPUs"
    return f"{_n(len(h.cpus), 'CPU')} {format_cpu_list(h.cpus)}"


def _memory_text(blocks: Sequence[MemoryBlock]) -> list[str]:
    out = []
    for b in blocks:
        what = "memory" if b.resource == "memory" else b.resource
        out.append(f"{what} {_size(b.size)} on NUMA {format_cpu_list(b.numa)}")
    return out


def _devices_text(h: Holding) -> list[str]:
    return [f"{pool} {','.join(ids)}" for pool, ids in h.devices.items()]


def _device_lines(m: CpuMap, width: int, styles: Mapping[str, str]) -> list[Line]:
    """Per pool, its devices grouped by NUMA node: `id=A` held by holder A, `id=free`."""
    pools: dict[str, list[tuple[str, Line]]] = {}
    for d in m.devices:
        groups = pools.setdefault(d.pool, [])
        numa = f"NUMA {d.numa}:" if d.numa is not None else ""
        if not groups or groups[-1][0] != numa:
            groups.append((numa, [(numa, "dim")] if numa else []))
        unit = groups[-1][1]
        if unit:
            unit.append((" ", ""))
        if d.holder is None:
            unit += [(f"{d.id}=", ""), ("free", "free")]
        else:
            unit += [(f"{d.id}=", ""), (d.holder.glyph, styles[d.holder.glyph])]
    if not pools:
        return []
    lines: list[Line] = [[("device pools", "title")]]
    name_width = max(len(p) for p in pools)
    for pool, groups in pools.items():
        devices = [d for d in m.devices if d.pool == pool]
        free = sum(1 for d in devices if d.holder is None)
        tail: Line = [(f"({free} of {len(devices)} free)", "free" if free else "warn")]
        units = [unit for _, unit in groups] + [tail]
        lines += _flow(f"{_INDENT}{pool:<{name_width}}", units, width, sep="   ")
    return lines


def _legend(m: CpuMap) -> list[Line]:
    units: list[Line] = []
    if m.reserved:
        where = "no container runs there" if m.strict_reservation else "in the shared pool"
        units.append([(RESERVED, "reserved"), (f" reserved ({where})", "")])
    units.append([(SHARED, "shared"), (" shared pool", "")])
    if m.holdings:
        units.append([("A", "title"), (" held by holder A", "")])
    if any(h.glyph == MORE for h in m.holdings):
        units.append([(MORE, "title"), (" held by a holder past z", "")])
    if m.topology.offline:
        units.append([(ABSENT, "dim"), (" thread offline", "")])
    if any(m.use(c) == "unused" for c in m.topology.cpus):
        units.append([("' '", ""), (" in no pool", "")])
    return units


# --- text helpers -----------------------------------------------------------------------------


def _flow(title: str, units: Sequence[Line], width: int, sep: str = "  ") -> list[Line]:
    """`title`, then the units (each kept whole on one line) `sep` apart, wrapped at `width`
    under the first. A one-segment unit longer than a line (a long cpulist) is broken after
    a comma."""
    lead = f"{title}  "
    room = width - len(lead)
    pieces: list[Line] = []
    for unit in units:
        if len(unit) == 1 and _width(unit) > room:
            text, style = unit[0]
            pieces += [[(piece, style)] for piece in _pieces(text, room)]
        else:
            pieces.append(unit)
    lines: list[Line] = []
    line: Line = [(lead, "" if title.startswith(" ") else "title")]
    used = len(lead)
    for k, unit in enumerate(pieces):
        gap = sep if k else ""
        if k and used + len(gap) + _width(unit) > width:
            lines.append(line)
            line, used, gap = [(" " * len(lead), "")], len(lead), ""
        line += [(gap, ""), *unit]
        used += len(gap) + _width(unit)
    lines.append(line)
    return lines


def _pieces(text: str, room: int) -> list[str]:
    pieces, current = [], ""
    for part in text.split(","):
        candidate = f"{current},{part}" if current else part
        if current and len(candidate) + 1 > room:
            pieces.append(current + ",")
            current = part
        else:
            current = candidate
    pieces.append(current)
    return pieces


def _holder_styles(holdings: Sequence[Holding]) -> dict[str, str]:
    return {h.glyph: _HOLDER_STYLES[i % len(_HOLDER_STYLES)] for i, h in enumerate(holdings)}


def _width(line: Line) -> int:
    return sum(len(text) for text, _ in line)


def _paint(line: Line, colour: bool) -> str:
    if not colour:
        return "".join(text for text, _ in line)
    out = []
    for text, style in line:
        code = _STYLES.get(style, style)
        out.append(f"\x1b[{code}m{text}\x1b[0m" if code and text.strip() else text)
    return "".join(out)


def _n(count: int, what: str) -> str:
    return f"{count} {what}" if count == 1 else f"{count} {what}s"


def _size(n: int) -> str:
    """Bytes as GiB (one decimal, none when whole) from 1 GiB up, MiB below."""
    gib = n / (1 << 30)
    if gib >= 1:
        return f"{gib:.1f}".removesuffix(".0") + " GiB"
    return f"{n / (1 << 20):.0f} MiB"


def _gib(n: int) -> str:
    """Bytes as a bare number of the unit `_size` would use for the panel's total."""
    return _size(n).split()[0] if n >= 1 << 30 else _size(n)
