"""`python -m tests.lab.demo`: crihook for real in front of a local containerd.

Starts a private containerd (tests.lab), runs crihook in front of it with a one-hook chain
(the example `annotate` hook, in-process), runs a pod through crihook as kubelet would,
prints what containerd received, then serves until Ctrl-C and cleans everything up.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from crihook.api.cri.v1 import api_pb2
from tests.lab import peers
from tests.lab.containerd import Containerd
from tests.lab.crihook_proc import CrihookProcess
from tests.lab.images import DEFAULT_CACHE_DIR, build_images
from tests.lab.kubelet import ContainerSpec, KubeletClient, PodSpec

MiB = 1024 * 1024
DEMO_CONFIG = """\
[hooks]
order = ["10-annotate"]

[hooks.annotate]
key = "demo.crihook.io/seen-by"
value = "crihook"
failure_policy = "fail"
timeout_ms = 500
"""


def _out(text: str = "") -> None:
    """Print, surviving a closed stdout (`demo.sh | tee log` and Ctrl-C: tee dies first):
    from then on output is dropped, and the cleanup still runs."""
    try:
        print(text, flush=True)
    except (BrokenPipeError, OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush is quiet too
        os.close(devnull)


def _say(text: str) -> None:
    _out(f"\n== {text}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--no-wait", action="store_true", help="exit after the demo pod")
    args = parser.parse_args(argv)

    images = build_images(DEFAULT_CACHE_DIR)
    lab = Containerd(tempfile.mkdtemp(prefix="crihook-demo-", dir="/tmp"), images)
    crihook: CrihookProcess | None = None
    try:
        _say("starting a private containerd")
        lab.start()
        _out(f"containerd {lab.endpoint} (log {lab.log_path})")
        crihook = CrihookProcess(lab.endpoint, config=DEMO_CONFIG, hooks=None)
        crihook.start()
        _say("crihook is serving")
        _out(f"listen   {crihook.endpoint}")
        _out(f"runtime  {lab.endpoint}")
        _out(f"log      {crihook.log_path}")
        _out(f"state    {crihook.state_dir}")
        container_id = _run_demo_pod(lab, crihook)
        if not args.no_wait:
            _say("serving until Ctrl-C (point a CRI client at the listen socket)")
            _out("try crictl, a grpc-go client as kubelet is, through crihook:")
            for line in crictl_hint(peers.cached("crictl"), crihook.endpoint, container_id):
                _out(f"  {line}")
            stop = threading.Event()
            signal.signal(signal.SIGINT, lambda *_: stop.set())
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            stop.wait()
        return 0
    finally:
        _say("cleaning up")
        if crihook is not None:
            code = crihook.stop()
            shutil.rmtree(crihook.workdir, ignore_errors=True)  # its socket, state and log
            _out(f"crihook exited {code}; {crihook.workdir} removed")
        lab.cleanup()
        _out("containerd stopped, pods, mounts, cgroups and the bridge removed")


def crictl_hint(crictl: Path | None, endpoint: str, container_id: str) -> list[str]:
    """Commands to try: the cached crictl (tests.lab.peers) with crihook as its runtime; when
    it is not built yet, the command that builds it (once) and prints its path."""
    binary = str(crictl) if crictl else "$(.venv/bin/python -m tests.lab.peers path crictl)"
    # --config /dev/null: no /etc/crictl.yaml, and no warning that it is missing
    base = f"{binary} --config /dev/null --runtime-endpoint {endpoint}"
    return [f"{base} ps", f"{base} inspect {container_id[:13]}"]


def _run_demo_pod(lab: Containerd, crihook: CrihookProcess) -> str:
    """Run the demo pod through crihook and show what containerd got; the container's id."""
    spec = PodSpec(
        name="demo",
        namespace="default",
        containers=[
            ContainerSpec(
                name="app",
                command=["sleep", "3600"],
                cpu_request=250,
                cpu_limit=500,
                memory_request=32 * MiB,
                memory_limit=64 * MiB,
            )
        ],
    )
    with KubeletClient(crihook.endpoint, log_root=lab.pod_log_dir) as kubelet:
        _say("running pod default/demo through crihook (as kubelet would)")
        handle = kubelet.run_pod(spec)
        cid = handle.container_ids["app"]
        _out(f"sandbox   {handle.sandbox_id[:13]}  qos={handle.qos}  cgroup={handle.cgroup_parent}")
        _out(f"container {cid[:13]}")
    with KubeletClient(lab.endpoint) as direct:
        status = direct.container_status(cid, verbose=True)
        _say("what containerd has (asked directly, not through crihook)")
        _out(f"state       {api_pb2.ContainerState.Name(status.status.state)}")
        ann = status.status.annotations
        _out(
            f"annotation  demo.crihook.io/seen-by = {ann.get('demo.crihook.io/seen-by')!r}"
            "   <- added by the annotate hook"
        )
        res = status.status.resources.linux
        _out(
            f"resources   cpu_shares={res.cpu_shares} cpu_quota={res.cpu_quota} "
            f"memory_limit={res.memory_limit_in_bytes}"
        )
        info = json.loads(status.info.get("info", "{}"))
        pid = info.get("pid")
        if pid:
            cgroup = Path("/sys/fs/cgroup/cpu") / handle.cgroup_parent.lstrip("/") / cid
            shares = (cgroup / "cpu.shares").read_text().strip()
            oom = Path(f"/proc/{pid}/oom_score_adj").read_text().strip()
            _out(f"host        pid {pid}, cpu.shares={shares}, oom_score_adj={oom}")
    _say("crihook state")
    out = subprocess.run(
        [sys.executable, "-m", "crihook", "state", "--state-dir", str(crihook.state_dir)],
        capture_output=True,
        text=True,
    )
    _out(out.stdout or out.stderr)
    return cid


if __name__ == "__main__":
    sys.exit(main())
