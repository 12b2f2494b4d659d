"""Out-of-process plugins from drop-in files, one TOML file per plugin:

    name = "50-annotate"
    endpoint = "unix:///run/crihook/plugins/annotate.sock"
    failure_policy = "ignore"
    timeout_ms = 500

The directory is rescanned every second; files added, changed or removed take effect without a
restart. A bad file is reported (file and key) and ignored; a plugin already running from an
earlier good version of that file keeps running. Only what root (or crihook's uid) could have
written is read (proxy/chain/dropin_files.py, sshd's StrictModes): a refused file is reported and
counted like a bad one; while the directory itself is refused nothing in it changes the chain
(no plugin added, changed or removed).
"""

from __future__ import annotations

import asyncio
import logging
import os
import tomllib
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from crihook.proxy.chain.chain import Chain, ChainEntry
from crihook.proxy.chain.dropin_files import Distrust, Refusal, read_dropins
from crihook.proxy.config import HookSettings, Settings, parse_hook_name, parse_hook_settings
from crihook.proxy.errors import ConfigError

__all__ = [
    "PluginDirectory",
    "crihook_sockets",
    "dropin_endpoint_problem",
    "dropin_name_problem",
    "load_dropins",
    "parse_dropin",
]

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # the plugin client is imported only when a plugin exists
    from crihook.hooks.remote.client import Snapshot, SyncUpdatesHandler


def parse_dropin(path: Path, text: str) -> HookSettings:
    """A drop-in file's settings, or ConfigError naming the file and key."""
    where = str(path)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(where, f"not valid TOML: {exc}") from None
    name = parse_hook_name(f"{where} name", doc.pop("name", None))
    if "endpoint" not in doc:
        raise ConfigError(f"{where} endpoint", "missing (unix:///path of the plugin's socket)")
    if "module" in doc:
        raise ConfigError(f"{where} module", "drop-ins name plugins by endpoint, not module")
    settings = parse_hook_settings(where, name, doc)
    if settings.options:
        # The plugin protocol carries no options: a key here would silently do nothing.
        raise ConfigError(f"{where} {sorted(settings.options)[0]}", "unknown setting")
    return settings


def dropin_name_problem(
    path: Path, settings: HookSettings, reserved: set[str], loaded: Mapping[Path, HookSettings]
) -> ConfigError | None:
    """Why a drop-in's name cannot be used: an in-process hook's (`reserved`) or another
    loaded drop-in's."""
    base = settings.base_name
    if base in reserved:
        return ConfigError(f"{path} name", f"{base!r} is already an in-process hook")
    for other_path, other in loaded.items():
        if other_path != path and other.base_name == base:
            return ConfigError(f"{path} name", f"{base!r} is already used by {other_path}")
    return None


def crihook_sockets(settings: Settings) -> dict[str, str]:
    """The sockets crihook itself serves or calls, each with what it is: no plugin is there."""
    sockets: dict[str, str] = {}
    sockets.setdefault(settings.runtime.endpoint, "the runtime's socket")
    sockets.setdefault(settings.runtime.image_target, "the runtime's image socket")
    sockets.setdefault(settings.server.listen, "crihook's own socket (kubelet's)")
    if settings.server.metrics_listen is not None:
        sockets.setdefault(settings.server.metrics_listen, "crihook's metrics socket")
    return {
        endpoint.removeprefix("unix://"): what
        for endpoint, what in sockets.items()
        if endpoint.startswith("unix://")
    }


def dropin_endpoint_problem(
    path: Path, settings: HookSettings, sockets: Mapping[str, str]
) -> ConfigError | None:
    """A drop-in naming one of crihook's own sockets (`crihook_sockets`) as its plugin: root
    owns the runtime's socket too, so the socket check alone would let it through, and every
    hook call would then go to containerd."""
    endpoint = (settings.endpoint or "").removeprefix("unix://")
    for socket_path, what in sockets.items():
        if _same_file(endpoint, socket_path):
            return ConfigError(f"{path} endpoint", f"{endpoint} is {what}, not a plugin's")
    return None


def _same_file(a: str, b: str) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def load_dropins(directory: Path) -> tuple[list[HookSettings], list[str]] | None:
    """The plugins the drop-ins of `directory` configure, as `crihook serve` loads them (for a
    replay with `--config`), and why each bad one is left out; None when the directory is
    not there."""
    listing = read_dropins(directory)
    if listing.missing:
        return None
    loaded: dict[Path, HookSettings] = {}
    problems = [f"drop-in refused: {r}" for r in listing.refused.values()]
    if listing.refused_directory is not None:
        problems.append(f"plugins directory refused: {listing.refused_directory}")
    for path, text in listing.files.items():
        try:
            settings = parse_dropin(path, text)
            problem = dropin_name_problem(path, settings, set(), loaded)
            if problem is not None:
                raise problem
        except ConfigError as exc:
            problems.append(str(exc))
            continue
        loaded[path] = settings
    return list(loaded.values()), problems


@dataclass
class _Loaded:
    text: str
    settings: HookSettings
    entry: ChainEntry


class PluginDirectory:
    def __init__(
        self,
        directory: Path,
        chain: Chain,
        snapshot: Snapshot,
        reserved: set[str],
        interval: float = 1.0,
        on_sync_updates: SyncUpdatesHandler | None = None,
        on_change: Callable[[], None] | None = None,
        sockets: Mapping[str, str] | None = None,
    ) -> None:
        self.directory = directory
        self.sockets = sockets or {}
        """crihook's own sockets (`crihook_sockets`): a drop-in naming one is refused."""
        self.chain = chain
        self.snapshot = snapshot
        self.on_sync_updates = on_sync_updates
        self.on_change = on_change
        """Told each time the plugins in the chain change (recording)."""
        self.reserved = reserved  # base names of in-process hooks
        self.interval = interval
        self.loaded: dict[Path, _Loaded] = {}
        self.errors: dict[Path, str] = {}
        self.refusals: Counter[Distrust] = Counter()
        """Drop-ins (and the directory) refused as untrusted, counted once per refusal."""
        self._refused_directory: Refusal | None = None

    async def run(self) -> None:
        while True:
            await self.scan()
            await asyncio.sleep(self.interval)

    async def scan(self) -> None:
        listing = await asyncio.to_thread(read_dropins, self.directory)
        if not self._trust_directory(listing.refused_directory):
            return
        files = listing.files
        for path, refusal in listing.refused.items():
            if self.errors.get(path) != str(refusal):
                log.error("plugin drop-in refused: %s", refusal)
                self.refusals[refusal.distrust] += 1
            self.errors[path] = str(refusal)
        changed = False
        gone = [p for p in self.loaded if p not in files and p not in listing.refused]
        for path in gone:
            log.info("plugin %s removed (%s)", self.loaded[path].settings.name, path)
            await self.loaded.pop(path).entry.hook.close()
            changed = True
        self.errors = {p: e for p, e in self.errors.items() if p in files or p in listing.refused}
        for path, text in files.items():
            current = self.loaded.get(path)
            if current is not None and current.text == text:
                continue
            try:
                settings = parse_dropin(path, text)
                self._check_name(path, settings)
            except ConfigError as exc:
                if self.errors.get(path) != str(exc):
                    log.error("plugin drop-in ignored: %s", exc)
                self.errors[path] = str(exc)
                continue
            self.errors.pop(path, None)
            if current is not None:
                await current.entry.hook.close()
            from crihook.hooks.remote.client import RemoteHook  # only when a plugin exists

            hook = RemoteHook(settings, self.snapshot, on_sync_updates=self.on_sync_updates)
            await hook.start()
            self.loaded[path] = _Loaded(text, settings, Chain.entry(hook, settings))
            log.info("plugin %s %s (%s)", settings.name, "reloaded" if current else "added", path)
            changed = True
        if changed:
            self.chain.set_plugins([item.entry for item in self.loaded.values()])
            if self.on_change is not None:
                self.on_change()

    def _trust_directory(self, refused: Refusal | None) -> bool:
        """Whether the directory may be read now; logs and counts when that changes."""
        if refused is None:
            if self._refused_directory is not None:
                log.warning("plugins directory %s trusted again", self.directory)
                self._refused_directory = None
            return True
        if self._refused_directory != refused:
            log.error(
                "plugins directory refused: %s; no plugin is added, changed or removed until "
                "it is fixed",
                refused,
            )
            self.refusals[refused.distrust] += 1
            self._refused_directory = refused
        return False

    def _check_name(self, path: Path, settings: HookSettings) -> None:
        loaded = {p: item.settings for p, item in self.loaded.items()}
        problem = dropin_name_problem(path, settings, self.reserved, loaded)
        if problem is None:
            problem = dropin_endpoint_problem(path, settings, self.sockets)
        if problem is not None:
            raise problem

    def all_connected(self) -> bool:
        return all(item.entry.hook.connected for item in self.loaded.values())

    async def close(self) -> None:
        for item in self.loaded.values():
            await item.entry.hook.close()
        self.loaded.clear()

    def status(self) -> dict[str, Any]:
        refused = self._refused_directory
        return {
            "directory": str(self.directory),
            "errors": {str(p): e for p, e in self.errors.items()},
            "refused_directory": str(refused) if refused is not None else None,
        }
