"""What the store keeps per pod and per container: its view, and who set which field.

A record is changed in place and put again (`Store.put_pod`, `Store.put_container`), which
marks it for the next write; `to_dict`/`from_dict` are the JSON it is kept as in store.json
and the records journal (proxy/state/records_journal.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from crihook.hooks.spec import ContainerState, ContainerView, PodView

__all__ = ["ContainerRecord", "PodRecord"]


@dataclass
class PodRecord:
    view: PodView
    audit: dict[str, dict[str, Any]] = field(default_factory=dict)
    """field → {hook, value, event, at}: the last hook that set each field."""

    def to_dict(self) -> dict[str, Any]:
        return {"view": self.view.to_dict(), "audit": self.audit}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> PodRecord:
        return cls(PodView.from_dict(doc["view"]), dict(doc.get("audit", {})))


@dataclass
class ContainerRecord:
    view: ContainerView
    audit: dict[str, dict[str, Any]] = field(default_factory=dict)
    update_errors: list[dict[str, Any]] = field(default_factory=list)
    """UpdateContainerResources that crihook sent for a hook and the runtime refused."""
    state: ContainerState = ContainerState.UNKNOWN
    """As last seen: the runtime's at reconcile, else what kubelet's last call made it (a
    container that exits on its own stays `running` here until the next reconcile)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "view": self.view.to_dict(),
            "audit": self.audit,
            "update_errors": self.update_errors,
            "state": self.state.value,
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> ContainerRecord:
        return cls(
            ContainerView.from_dict(doc["view"]),
            dict(doc.get("audit", {})),
            list(doc.get("update_errors", [])),
            ContainerState(doc.get("state", "unknown")),
        )
