"""Which containers' resources the store's files may not know: asked of the runtime at start.

A container's record holds the resources it runs with; crihook changes them through
UpdateContainerResources (kubelet's, intercepted, and the updates hooks issue for other
containers), and the record follows once the runtime answered, on disk with the next
write-behind. A crihook killed in between leaves a record older than the runtime, and the
next update built on it would put the old values back. At start the store therefore takes
the resources of those containers from the runtime (ContainerStatus). Asking it for every
container cost 1,000 calls before a full node's crihook was ready; only the containers
named here are asked.

- **Marked before the runtime is asked.** Before an UpdateContainerResources goes to the
  runtime, its container id is appended to `<state-dir>/unsettled-<n>` (on the event loop:
  a page-cache append, as the hook journal's write-ahead; once per container until it is
  cleared). It survives crihook's crash at once; a node crash takes the containers with it.
  Containers about to be updated together (a group update's members, walked a few at a
  time) may be named ahead in one append (`ahead`): one file write for the step instead of
  one per container. Named and then not updated, a container is only in doubt a while
  longer: the next snapshot clears it as any settled one.
- **Settled by the answer.** A success is followed, without a pause of the event loop, by
  the record's change (pipeline, updates). A failure (refused, or an outcome unknown) leaves
  the container in doubt until the next start asks the runtime.
- **Cleared by a snapshot.** Once a store.json planned after the container settled is on
  disk, the container is cleared: the next file (`n + 1`) is written with what is still in
  doubt, then the files up to `n` are removed.
- **Unknown means everyone.** While the store has containers a file exists (it may be
  empty). None at all (an older crihook's state directory, a crash before the first
  store.json, or a mark that could not be written: the files are then removed) makes the
  next start ask the runtime for every container, as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Collection, Iterable
from pathlib import Path
from typing import Protocol

from crihook.api.cri.v1 import api_pb2
from crihook.proxy.cri.outcome import Metadata
from crihook.proxy.cri.runtime import Runtime, UnaryCall
from crihook.proxy.state.directory import STATE_FILE_MODE

__all__ = ["UPDATE_PATH", "ContainerUpdateCall", "Unsettled", "UnsettledRuntime"]

log = logging.getLogger(__name__)

PREFIX = "unsettled-"
UPDATE_PATH = "/runtime.v1.RuntimeService/UpdateContainerResources"


class _Entry:
    """One container in doubt: the file it is written in, calls on their way, whether one
    failed, and when (the change counter) it was last marked or settled."""

    __slots__ = ("doubtful", "gen", "pending", "touched")

    def __init__(self, gen: int, touched: int) -> None:
        self.gen = gen
        self.pending = 0
        self.doubtful = False
        self.touched = touched


class Unsettled:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self._gen = 1
        self._open: dict[str, _Entry] = {}
        self._changes = 0
        self._broken = False
        """A mark could not be written: the files are gone (the next start asks about every
        container) until a snapshot is followed by a file that holds everything in doubt."""

    # --- start ---------------------------------------------------------------------------
    def load(self, containers: Collection[str]) -> set[str]:
        """The containers (of `containers`, the store's) to ask the runtime about: those the
        files name, or all of them when there is no file. They stay in doubt until
        `confirmed`; a new file holding them is written now."""
        files = self._files()
        if files:
            named: set[str] = set()
            for _, path in files:
                with contextlib.suppress(FileNotFoundError):
                    named.update(path.read_text(errors="replace").split())
            doubt = named & set(containers)
        else:
            doubt = set(containers)
        self._gen = max((gen for gen, _ in files), default=0) + 1
        for cid in doubt:
            entry = self._open[cid] = _Entry(self._gen, 0)
            entry.doubtful = True
        if containers:  # with none, no file says as much: none is in doubt either way
            try:
                self._append("".join(f"{cid}\n" for cid in sorted(doubt)))
            except OSError as exc:
                self._lost(exc)
        return doubt

    def confirmed(self, container_id: str) -> None:
        """The store took the container's resources from the runtime."""
        entry = self._open.get(container_id)
        if entry is not None and not entry.pending:
            entry.doubtful = False
            entry.touched = self._tick()

    # --- calls ---------------------------------------------------------------------------
    def ahead(self, container_ids: Iterable[str]) -> None:
        """Containers an UpdateContainerResources may go to soon, named in the file in one
        append: their `mark` then writes nothing. Never raises (as `mark`)."""
        lines = []
        tick = 0
        for cid in container_ids:
            entry = self._open.get(cid)
            if entry is None:
                entry = self._open[cid] = _Entry(0, 0)
            if entry.gen != self._gen:  # not in the file being written (new, or rotated away)
                entry.gen = self._gen
                tick = tick or self._tick()
                entry.touched = tick
                lines.append(f"{cid}\n")
        if lines and not self._broken:
            try:
                self._append("".join(lines))
            except OSError as exc:
                self._lost(exc)

    def mark(self, container_id: str) -> None:
        """Before an UpdateContainerResources of `container_id` goes to the runtime. Never
        raises: a mark that cannot be written makes the next start ask about everyone."""
        self.ahead((container_id,))  # written unless the file being written names it
        entry = self._open[container_id]
        entry.pending += 1
        entry.touched = self._tick()

    def settled(self, container_id: str, applied: bool) -> None:
        """The runtime answered the call `mark` preceded: `applied`, or not (or not known)."""
        entry = self._open.get(container_id)
        if entry is None:
            return
        entry.pending = max(entry.pending - 1, 0)
        entry.doubtful = entry.doubtful or not applied
        entry.touched = self._tick()

    # --- snapshots -----------------------------------------------------------------------
    def planned(self) -> int:
        """A store.json is being made from the records as they are now: its mark."""
        return self._tick()

    def written(self, planned: int, containers: Collection[str]) -> None:
        """The store.json `planned` marked is on disk. What settled before it is cleared (and
        what the store no longer has); the rest goes into the next file, then the older ones
        go."""
        clear = [
            cid
            for cid, entry in self._open.items()
            if cid not in containers
            or (not entry.pending and not entry.doubtful and entry.touched <= planned)
        ]
        for cid in clear:
            del self._open[cid]
        covered = self._gen
        self._gen += 1
        if containers:
            try:
                self._append("".join(f"{cid}\n" for cid in self._open))
            except OSError as exc:
                self._lost(exc)
                return
        for entry in self._open.values():
            entry.gen = self._gen
        self._remove(gen for gen, _ in self._files() if gen <= covered)
        if self._broken:
            log.info("containers in doubt are written to %s again", self.state_dir)
            self._broken = False

    # --- files ---------------------------------------------------------------------------
    def _tick(self) -> int:
        self._changes += 1
        return self._changes

    def _files(self) -> list[tuple[int, Path]]:
        found = []
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(self.state_dir):
                number = name[len(PREFIX) :]
                if name.startswith(PREFIX) and number.isdigit():
                    found.append((int(number), self.state_dir / name))
        return sorted(found)

    def _append(self, text: str) -> None:
        """Opened for each line (a few µs more than keeping it open, which a read-only
        remount of the state directory would refuse while crihook runs)."""
        path = self.state_dir / f"{PREFIX}{self._gen}"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, STATE_FILE_MODE)
        try:
            data = memoryview(text.encode())
            while data:
                data = data[os.write(fd, data) :]
        finally:
            os.close(fd)

    def _remove(self, gens: Iterable[int]) -> None:
        for gen in list(gens):
            with contextlib.suppress(OSError):
                os.unlink(self.state_dir / f"{PREFIX}{gen}")

    def _lost(self, exc: OSError) -> None:
        """No file may claim to name every container in doubt now."""
        if not self._broken:
            log.warning(
                "cannot note a container update in %s (%s): the next start asks the runtime "
                "for every container's resources",
                self.state_dir,
                exc.strerror or exc,
            )
        self._broken = True
        self._remove(gen for gen, _ in self._files())


class ContainerUpdateCall(Protocol):
    """UpdateContainerResources for a caller that knows the container it built `request`
    for (the updater): the request is not decoded again to find it."""

    def __call__(
        self, container_id: str, request: bytes, *, timeout: float | None = None
    ) -> Awaitable[bytes]: ...


class UnsettledRuntime:
    """The runtime, with every UpdateContainerResources marked before and settled after."""

    def __init__(self, runtime: Runtime, unsettled: Unsettled) -> None:
        self._runtime = runtime
        self.unsettled = unsettled

    def control(self, path: str, image_service: bool = False) -> UnaryCall:
        """Unchanged: the control path asks, it sends no update."""
        return self._runtime.control(path, image_service)

    def call(self, path: str) -> UnaryCall:
        inner = self._runtime.call(path)
        if path != UPDATE_PATH:
            return inner
        marked = self._marked(inner)

        async def update(
            request: bytes, *, timeout: float | None = None, metadata: Metadata | None = None
        ) -> bytes:
            cid = api_pb2.UpdateContainerResourcesRequest.FromString(request).container_id
            return await marked(cid, request, timeout, metadata)

        return update

    def container_update(self) -> ContainerUpdateCall:
        """UpdateContainerResources, marked for the container the caller names: the id
        `request` carries (what `call` would decode)."""
        marked = self._marked(self._runtime.call(UPDATE_PATH))

        async def update(
            container_id: str, request: bytes, *, timeout: float | None = None
        ) -> bytes:
            return await marked(container_id, request, timeout, None)

        return update

    def _marked(
        self, inner: UnaryCall
    ) -> Callable[[str, bytes, float | None, Metadata | None], Awaitable[bytes]]:
        unsettled = self.unsettled

        async def marked(
            cid: str, request: bytes, timeout: float | None, metadata: Metadata | None
        ) -> bytes:
            unsettled.mark(cid)
            try:
                answer = await inner(request, timeout=timeout, metadata=metadata)
            except BaseException:  # refused, failed, or cancelled: applied or not, unknown
                unsettled.settled(cid, applied=False)
                raise
            # The caller changes the record before the event loop runs anything else.
            unsettled.settled(cid, applied=True)
            return answer

        return marked
