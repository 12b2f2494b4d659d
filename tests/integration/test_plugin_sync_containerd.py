"""A plugin's Synchronize repairs reach containerd: crihook (a real process, the wiring of
proxy/app.py and proxy/chain/plugins.py) sends them as UpdateContainerResources to a container that
ran before crihook started, and the audit names the plugin."""

from __future__ import annotations

import json
import subprocess
import sys

from crihook.proxy.ops.state_cli import load_state
from tests.lab.containerd import Containerd
from tests.lab.crihook_proc import PATIENCE, CrihookProcess, short_tmpdir, wait_for
from tests.lab.fixtures import PodCleanup
from tests.lab.kubelet import KubeletClient
from tests.lab.kubelet_encoding import burstable_pod


def _state(proc: CrihookProcess) -> dict:  # type: ignore[type-arg]
    cmd = [sys.executable, "-m", "crihook", "state", "--json", "--state-dir", str(proc.state_dir)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_synchronize_repairs_are_sent_to_the_runtime(
    containerd: Containerd, kubelet_direct: KubeletClient, pod_cleanup: PodCleanup
) -> None:
    handle = kubelet_direct.run_pod(burstable_pod("sync-repair"))
    cid = handle.container_ids["app"]
    assert kubelet_direct.container_status(cid).status.resources.linux.cpu_shares == 256
    sock = short_tmpdir("sp-") / "sync.sock"
    plugin = subprocess.Popen(
        [sys.executable, "-m", "tests.lab.sync_plugin", "--socket", str(sock),
         "--pod", "sync-repair", "--shares", "333"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(sock.exists, PATIENCE, "the plugin's socket")
        proc = CrihookProcess(containerd.endpoint, hooks=None)
        (proc.plugins_dir / "50-sync.toml").write_text(
            f'name = "50-sync"\nendpoint = "unix://{sock}"\n'
        )
        with proc:

            def repaired() -> bool:
                status = kubelet_direct.container_status(cid).status
                return status.resources.linux.cpu_shares == 333

            wait_for(repaired, PATIENCE, f"the repair in containerd\n{proc.log()[-3000:]}")

            def audited() -> bool:  # read here: a `crihook state` per poll is seconds under load
                audit = load_state(proc.state_dir)["containers"].get(cid, {}).get("audit", {})
                return "cpu_shares" in audit

            wait_for(audited, PATIENCE, "the audit of the repair")
            audit = _state(proc)["containers"][cid]["audit"]["cpu_shares"]
            assert (audit["hook"], audit["value"], audit["event"]) == ("50-sync", 333, "update")
            assert proc.stop() == 0
    finally:
        plugin.terminate()
        plugin.wait(PATIENCE)
