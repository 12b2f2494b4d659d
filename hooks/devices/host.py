"""The host's files as the `devices` hook sees them: the seam lives in
:mod:`crihook.hooks.node.files` (crihook hands it to hooks in ``SyncContext.files``, so a replay
can hand them recorded answers); re-exported here for the hook's own modules and tests.
"""

from crihook.hooks.node.files import DeviceNode, HostFiles, LinuxFiles, WouldBlock

__all__ = ["DeviceNode", "HostFiles", "LinuxFiles", "WouldBlock"]
