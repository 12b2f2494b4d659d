"""Which staged mounts and device nodes (`crihook.hooks.node.staging`) belong to which
container, kept so that each is released when its container goes, and none is left behind
by a crash.

A container's pins live under the key `<pod id>/<name>.<attempt>` (`.1`, `.2`, … added when
a key is still taken: an earlier attempt that failed and was not released yet). The key is
made before the runtime answers CreateContainer, when the container has no id yet:

    pre       `stage`: saved pending (`s:<key>` in the hook's state; the pipeline writes it
              to disk before the call goes on) before anything is mounted
    post      `confirm`: tied to the id the runtime gave the container
    failed    the pending key is released
    RemoveContainer / RemovePodSandbox: the container's / the pod's keys are released

At start, `reconcile` compares the keys saved and the keys staged on the host with the
containers the runtime has: a pending key whose container the runtime made (same pod, name
and attempt) is tied to it, and everything else no container has is released (a container
created but not yet started then fails to start: never with another source).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from crihook.hooks.spec import ContainerView, HookState

__all__ = ["StagedEntry", "StagingBook", "container_key"]

_PREFIX = "s:"


def container_key(pod: str, name: str, attempt: int, taken: Iterable[str] = ()) -> str:
    """`<pod>/<name>.<attempt>`, or with `.1`, `.2`, … when that is `taken`."""
    base = f"{pod}/{name}.{attempt}"
    used = set(taken)
    key, n = base, 0
    while key in used:
        n += 1
        key = f"{base}.{n}"
    return key


@dataclass
class StagedEntry:
    key: str
    pod: str
    name: str
    attempt: int
    container: str = ""
    """The container's id; empty while the runtime has not answered (pending)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "pod": self.pod,
            "name": self.name,
            "attempt": self.attempt,
            "container": self.container,
        }

    @classmethod
    def from_dict(cls, key: str, doc: Any) -> StagedEntry:
        return cls(
            key, str(doc["pod"]), str(doc["name"]), int(doc["attempt"]), str(doc["container"])
        )


class StagingBook:
    """The staged keys, mirrored into the hook's state (`s:<key>`)."""

    def __init__(self, state: HookState) -> None:
        self.state = state
        self.entries: dict[str, StagedEntry] = {}
        self._by_container: dict[str, str] = {}
        self._of_pod: dict[str, set[str]] = {}
        self._pods: set[str] = set()
        """Pods that may have a staging directory (emptied, not removed, at RemoveContainer)."""

    def load(self) -> list[str]:
        """Rebuild from the state; returns the keys it dropped as unreadable."""
        self.entries.clear()
        self._by_container.clear()
        self._of_pod.clear()
        self._pods.clear()
        dropped = []
        for key, doc in list(self.state.items()):
            if not key.startswith(_PREFIX):
                continue
            try:
                entry = StagedEntry.from_dict(key.removeprefix(_PREFIX), doc)
            except (KeyError, TypeError, ValueError):
                self.state.delete(key)
                dropped.append(key)
                continue
            self._index(entry)
        return dropped

    def stage(self, pod: str, name: str, attempt: int) -> StagedEntry:
        """A new pending key for a container being created, saved at once."""
        key = container_key(pod, name, attempt, self._of_pod.get(pod, ()))
        entry = StagedEntry(key, pod, name, attempt)
        self._index(entry)
        self.state.set(_PREFIX + key, entry.to_dict())
        return entry

    def pending(self, pod: str, name: str, attempt: int) -> StagedEntry | None:
        """The newest key of a container the runtime has not answered for yet."""
        found = None
        for key in sorted(self._of_pod.get(pod, ()), key=len):
            entry = self.entries[key]
            if not entry.container and (entry.name, entry.attempt) == (name, attempt):
                found = entry
        return found

    def confirm(self, entry: StagedEntry, container_id: str) -> None:
        entry.container = container_id
        self._by_container[container_id] = entry.key
        self.state.set(_PREFIX + entry.key, entry.to_dict())

    def of_container(self, container_id: str) -> StagedEntry | None:
        key = self._by_container.get(container_id)
        return self.entries.get(key) if key is not None else None

    def of_pod(self, pod: str) -> list[StagedEntry]:
        return [self.entries[k] for k in sorted(self._of_pod.get(pod, ()))]

    def has_pod(self, pod: str) -> bool:
        """Whether the pod may have staged paths (or their emptied directory)."""
        return pod in self._pods

    def drop_pod(self, pod: str) -> None:
        """Forget a pod's keys (once its directory is released)."""
        for entry in self.of_pod(pod):
            self.drop(entry)
        self._pods.discard(pod)

    def drop(self, entry: StagedEntry) -> None:
        """Forget a key (once what it pinned is released)."""
        self.entries.pop(entry.key, None)
        if entry.container:
            self._by_container.pop(entry.container, None)
        keys = self._of_pod.get(entry.pod)
        if keys is not None:
            keys.discard(entry.key)
            if not keys:
                del self._of_pod[entry.pod]
        self.state.delete(_PREFIX + entry.key)

    def reconcile(
        self, staged: Sequence[str], containers: Sequence[ContainerView]
    ) -> tuple[list[StagedEntry], list[str]]:
        """Against the runtime's containers: pending keys tied to the container the runtime
        made for them. Returns the entries no container has (to release, then `drop`) and
        the keys staged on the host that the book does not know (to release)."""
        by_id = {c.id for c in containers}
        made = {(c.pod_id, c.name, c.attempt): c.id for c in containers}
        tied = set(self._by_container)
        gone: list[StagedEntry] = []
        for entry in sorted(self.entries.values(), key=lambda e: e.key):
            if not entry.container:
                cid = made.get((entry.pod, entry.name, entry.attempt))
                if cid is not None and cid not in tied:
                    self.confirm(entry, cid)
                    tied.add(cid)
                    continue
            if entry.container not in by_id:
                gone.append(entry)
        known = set(self.entries)
        leaving = {e.key for e in gone}
        kept_pods = {e.pod for e in self.entries.values() if e.key not in leaving}
        strays = [k for k in staged if k not in known and not ("/" not in k and k in kept_pods)]
        strays += sorted({e.pod for e in gone} - kept_pods - set(strays))  # emptied: its dir
        return gone, strays

    def _index(self, entry: StagedEntry) -> None:
        self.entries[entry.key] = entry
        self._pods.add(entry.pod)
        self._of_pod.setdefault(entry.pod, set()).add(entry.key)
        if entry.container:
            self._by_container[entry.container] = entry.key
