"""A tiny sd_notify(3) client: tells systemd (Type=notify) when crihook is ready or stopping.

No dependency on libsystemd. Every call is best-effort: a missing or unreachable
$NOTIFY_SOCKET yields False, never an exception, so the caller can log and carry on.
"""

from __future__ import annotations

import os
import socket

__all__ = ["notify", "ready", "status", "stopping", "watchdog", "watchdog_interval"]

_ENV_SOCKET = "NOTIFY_SOCKET"


def _address(raw: str) -> str | None:
    """Map $NOTIFY_SOCKET to a sendto() address; None when unusable here."""
    if raw.startswith("@"):
        # Abstract namespace (Linux): systemd writes a leading '@' for the NUL byte.
        return "\0" + raw[1:] if len(raw) > 1 else None
    if raw.startswith("/"):
        return raw
    # Relative paths are invalid per sd_notify(3); "vsock:" targets are not supported.
    return None


def notify(state: str) -> bool:
    """Send one newline-separated ``KEY=VALUE`` datagram to $NOTIFY_SOCKET.

    Returns True when the datagram was handed to the kernel, False when the
    variable is unset or unusable, the socket is missing, or the send would block.
    """
    raw = os.environ.get(_ENV_SOCKET, "")
    if not raw or not state:
        return False
    address = _address(raw)
    if address is None:
        return False
    try:
        payload = state.encode("utf-8")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            # Never stall the caller (e.g. the shutdown path) on a full receive queue.
            sock.setblocking(False)
            sent = sock.sendto(payload, address)
    except (OSError, UnicodeError, ValueError):
        return False
    return sent == len(payload)


def ready() -> bool:
    """Report start-up finished (the listen socket is accepting): ``READY=1``."""
    return notify("READY=1")


def stopping() -> bool:
    """Report that a graceful shutdown has begun: ``STOPPING=1``."""
    return notify("STOPPING=1")


def status(text: str) -> bool:
    """Set the one-line status shown by ``systemctl status``: ``STATUS=<text>``."""
    # The protocol is line-based; an embedded newline would start a bogus assignment.
    one_line = " ".join(text.splitlines())
    return notify(f"STATUS={one_line}")


def watchdog() -> bool:
    """Ping the service watchdog: ``WATCHDOG=1``."""
    return notify("WATCHDOG=1")


def watchdog_interval() -> float | None:
    """Watchdog timeout in seconds from WATCHDOG_USEC, or None when not enabled for us.

    Honours WATCHDOG_PID: when set to another process id the watchdog is not ours.
    Callers should ping at about half this interval.
    """
    pid = os.environ.get("WATCHDOG_PID")
    if pid is not None:
        try:
            if int(pid) != os.getpid():
                return None
        except ValueError:
            return None
    usec = os.environ.get("WATCHDOG_USEC")
    if usec is None:
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    if value <= 0:
        return None
    return value / 1_000_000
