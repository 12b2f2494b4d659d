"""The hook chain in a real crihook in front of the real containerd: in-process hooks and the
example plugin as a separate process change what containerd receives; ordering, conflicts,
failure policies, the breaker, drop-in reload, restart, dry-run, insecure plugin sockets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from crihook.api.cri.v1 import api_pb2
from tests.lab.containerd import Containerd
from tests.lab.crihook_proc import PATIENCE, CrihookProcess, short_tmpdir, wait_for
from tests.lab.fixtures import PodCleanup
from tests.lab.kubelet import ContainerSpec, KubeletClient, PodSpec, PodStartError
from tests.lab.kubelet_encoding import burstable_pod
from tests.lab.plugin_proc import KEY, Plugin

MiB = 1024 * 1024


@pytest.fixture
def plugin() -> Iterator[Plugin]:
    p = Plugin().start()
    yield p
    p.stop()


def _crihook(
    containerd: Containerd, config: str = "", args: tuple[str, ...] = ()
) -> CrihookProcess:
    return CrihookProcess(containerd.endpoint, config=config, hooks=None, args=list(args))


def _install(proc: CrihookProcess, plugin: Plugin, name: str, policy: str, **kw: object) -> Path:
    path = proc.plugins_dir / f"{name}.toml"
    path.write_text(plugin.dropin(name, policy, **kw))
    return path


def _wait_plugin_connected(proc: CrihookProcess, name: str, connected: bool = True) -> None:
    def check() -> bool:
        status = _state(proc).get("status") or {}
        return any(
            h["name"] == name and h["connected"] is connected for h in status.get("hooks", [])
        )

    wait_for(check, PATIENCE, f"plugin {name} connected={connected}\n{proc.log()[-3000:]}")


def _state(proc: CrihookProcess) -> dict:  # type: ignore[type-arg]
    cmd = [sys.executable, "-m", "crihook", "state", "--json", "--state-dir", str(proc.state_dir)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def _counters(proc: CrihookProcess) -> dict[str, int]:
    hooks = (_state(proc).get("status") or {}).get("hooks", [])
    return hooks[0]["counters"] if hooks else {}  # type: ignore[no-any-return]


def _run(proc: CrihookProcess, containerd: Containerd, name: str):  # type: ignore[no-untyped-def]
    with KubeletClient(proc.endpoint, log_root=containerd.pod_log_dir) as kubelet:
        return kubelet.run_pod(burstable_pod(name))


def _container(containerd: Containerd, cid: str) -> tuple[api_pb2.ContainerStatus, dict]:  # type: ignore[type-arg]
    with KubeletClient(containerd.endpoint) as direct:
        status = direct.container_status(cid, verbose=True)
    return status.status, json.loads(status.info["info"])


CHAIN = """
[hooks]
order = ["10-env", "30-shares"]
[hooks.env]
module = "tests.lab.sample_hooks:SetEnv"
name = "FROM_HOOK"
value = "in-process"
[hooks.shares]
module = "tests.lab.sample_hooks:SetShares"
shares = 777
"""


def test_in_process_hook_and_plugin_process_change_what_containerd_gets(
    containerd: Containerd, pod_cleanup: PodCleanup, plugin: Plugin
) -> None:
    with _crihook(containerd, CHAIN) as proc:
        _install(proc, plugin, "20-annotate", "fail")
        _wait_plugin_connected(proc, "20-annotate")
        handle = _run(proc, containerd, "chain")
        cid = handle.container_ids["app"]
        status, info = _container(containerd, cid)
        assert status.annotations[KEY] == "by-plugin"
        env = info["runtimeSpec"]["process"]["env"]
        assert "FROM_HOOK=in-process" in env
        assert status.resources.linux.cpu_shares == 777
        cgroup = Path("/sys/fs/cgroup/cpu") / handle.cgroup_parent.lstrip("/") / cid
        assert (cgroup / "cpu.shares").read_text().strip() == "777"
        # kubelet's own values the hooks did not touch are intact
        assert status.resources.linux.cpu_quota == 50000
        # the audit names the owner of every field (records are written behind, ~0.2 s)
        wait_for(lambda: cid in _state(proc)["containers"], PATIENCE, "the container's record")
        audit = _state(proc)["containers"][cid]["audit"]
        assert audit[f"annotation {KEY!r}"]["hook"] == "20-annotate"
        assert audit["env 'FROM_HOOK'"]["hook"] == "10-env"
        assert audit["cpu_shares"] == {**audit["cpu_shares"], "hook": "30-shares", "value": 777}
        assert proc.stop() == 0


def test_order_and_each_hook_sees_the_adjusted_request(
    containerd: Containerd, pod_cleanup: PodCleanup
) -> None:
    config = """
[hooks]
order = ["20-b", "10-a", "20-a2"]
[hooks.a]
module = "tests.lab.sample_hooks:CountAnnotations"
me = "a"
[hooks.b]
module = "tests.lab.sample_hooks:CountAnnotations"
me = "b"
[hooks.a2]
module = "tests.lab.sample_hooks:CountAnnotations"
me = "a2"
"""
    with _crihook(containerd, config) as proc:
        handle = _run(proc, containerd, "order")
        status, _ = _container(containerd, handle.container_ids["app"])
        got = {k: v for k, v in status.annotations.items() if k.startswith("order.")}
        assert got == {"order.a": "0", "order.a2": "1", "order.b": "2"}
        assert "hook chain: 10-a, 20-a2, 20-b" in proc.log()


def _mine_vs_plugin_config(chain_extra: str = "") -> str:
    """An in-process annotate hook setting the same annotation as the plugin."""
    return (
        f'[hooks]\norder = ["10-mine"]\n{chain_extra}[hooks.mine]\n'
        'module = "crihook.hooks.examples.annotate:AnnotateHook"\n'
        f'key = "{KEY}"\nvalue = "in-process"\n'
    )


def test_conflict_fails_the_call_naming_both_hooks(
    containerd: Containerd, pod_cleanup: PodCleanup, plugin: Plugin
) -> None:
    config = _mine_vs_plugin_config()
    with _crihook(containerd, config) as proc:
        _install(proc, plugin, "20-annotate", "fail")
        _wait_plugin_connected(proc, "20-annotate")
        with pytest.raises(PodStartError) as err:
            _run(proc, containerd, "conflict")
        assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "'10-mine'" in err.value.details and "'20-annotate'" in err.value.details
        assert KEY in err.value.details


def test_precedence_settles_a_conflict(
    containerd: Containerd, pod_cleanup: PodCleanup, plugin: Plugin
) -> None:
    config = _mine_vs_plugin_config('conflict = "precedence"\nprecedence = ["annotate", "mine"]\n')
    with _crihook(containerd, config) as proc:
        _install(proc, plugin, "20-annotate", "fail")
        _wait_plugin_connected(proc, "20-annotate")
        handle = _run(proc, containerd, "precedence")
        status, _ = _container(containerd, handle.container_ids["app"])
        assert status.annotations[KEY] == "by-plugin"


@pytest.mark.parametrize(
    ("fault", "policy", "code"),
    [
        ("killed", "ignore", None),
        ("hung", "ignore", None),
        ("killed", "fail", grpc.StatusCode.UNAVAILABLE),
        # The plugin's own timeout, kubelet's deadline far off: not DEADLINE_EXCEEDED.
        ("hung", "fail", grpc.StatusCode.UNAVAILABLE),
    ],
    ids=["killed-ignore", "hung-ignore", "killed-fail", "hung-fail"],
)
def test_plugin_down_or_hung_follows_its_failure_policy(
    containerd: Containerd,
    pod_cleanup: PodCleanup,
    fault: str,
    policy: str,
    code: grpc.StatusCode | None,
) -> None:
    """ignore: the call goes on without the plugin (and it is counted); fail: the call fails
    with UNAVAILABLE naming the plugin (a hung one too: its own timeout ran out, not
    kubelet's deadline)."""
    plugin = Plugin("--delay-ms", "5000") if fault == "hung" else Plugin()
    plugin.start()
    try:
        with _crihook(containerd) as proc:
            _install(proc, plugin, "50-annotate", policy, timeout_ms=300)
            _wait_plugin_connected(proc, "50-annotate")
            if fault == "killed":
                plugin.stop(9)
                _wait_plugin_connected(proc, "50-annotate", connected=False)
            if code is not None:
                with pytest.raises(PodStartError) as err:
                    _run(proc, containerd, f"{policy}-{fault}")
                assert err.value.code == code
                assert "'50-annotate'" in err.value.details
                return
            handle = _run(proc, containerd, f"{policy}-{fault}")
            status, _ = _container(containerd, handle.container_ids["app"])
            assert KEY not in status.annotations
            # status.json is rewritten shortly after each call
            wait_for(lambda: _counters(proc).get("ignored", 0) >= 1, PATIENCE, "the ignored count")
    finally:
        plugin.stop()


def test_breaker_skips_a_failing_plugin_then_reprobes_it(
    containerd: Containerd, pod_cleanup: PodCleanup
) -> None:
    plugin = Plugin("--fail").start()
    try:
        with _crihook(containerd) as proc:
            _install(
                proc, plugin, "50-annotate", "ignore", breaker_threshold=2, breaker_reset_seconds=2
            )
            _wait_plugin_connected(proc, "50-annotate")
            for i in range(4):
                _run(proc, containerd, f"breaker-{i}")
            wait_for(lambda: _counters(proc).get("skipped") == 2, PATIENCE, "two skipped calls")
            assert _counters(proc)["calls"] == 2
            plugin.stop()
            healthy = Plugin(value="healed").start()
            try:
                _install(
                    proc,
                    healthy,
                    "50-annotate",
                    "ignore",
                    breaker_threshold=2,
                    breaker_reset_seconds=2,
                    timeout_ms=1000,
                )
                _wait_plugin_connected(proc, "50-annotate")
                time.sleep(2.1)  # the open circuit's reset time
                handle = _run(proc, containerd, "breaker-healed")
                status, _ = _container(containerd, handle.container_ids["app"])
                assert status.annotations[KEY] == "healed"
            finally:
                healthy.stop()
    finally:
        plugin.stop()


def test_dropins_added_changed_removed_without_restart(
    containerd: Containerd, pod_cleanup: PodCleanup
) -> None:
    first, second = Plugin(value="one").start(), Plugin(value="two").start()
    try:
        with _crihook(containerd) as proc:
            handle = _run(proc, containerd, "reload-0")
            assert KEY not in _container(containerd, handle.container_ids["app"])[0].annotations
            path = _install(proc, first, "50-annotate", "fail")
            _wait_plugin_connected(proc, "50-annotate")
            handle = _run(proc, containerd, "reload-1")
            assert _container(containerd, handle.container_ids["app"])[0].annotations[KEY] == "one"
            path.write_text(second.dropin("50-annotate", "fail"))
            wait_for(lambda: "plugin 50-annotate reloaded" in proc.log(), PATIENCE, "reload")
            _wait_plugin_connected(proc, "50-annotate")
            handle = _run(proc, containerd, "reload-2")
            assert _container(containerd, handle.container_ids["app"])[0].annotations[KEY] == "two"
            path.unlink()
            wait_for(lambda: "plugin 50-annotate removed" in proc.log(), PATIENCE, "removal")
            handle = _run(proc, containerd, "reload-3")
            assert KEY not in _container(containerd, handle.container_ids["app"])[0].annotations
            (proc.plugins_dir / "bad.toml").write_text('name = "nope"\n')
            wait_for(
                lambda: "bad.toml name" in proc.log(), PATIENCE, "the bad drop-in to be reported"
            )
            assert proc.proc is not None and proc.proc.poll() is None
    finally:
        first.stop()
        second.stop()


def test_restart_rebuilds_the_store_from_containerd_and_disk(
    containerd: Containerd, pod_cleanup: PodCleanup
) -> None:
    config = """
[hooks]
order = ["10-seen"]
[hooks.seen]
module = "tests.lab.sample_hooks:SetState"
"""
    workdir = short_tmpdir()
    proc = CrihookProcess(containerd.endpoint, workdir=workdir, config=config, hooks=None).start()
    handle = _run(proc, containerd, "restart")
    cid = handle.container_ids["app"]
    assert proc.stop() == 0
    # Kept on disk: the hook's state; gone from disk: a pod made while crihook was down.
    with KubeletClient(containerd.endpoint, log_root=containerd.pod_log_dir) as direct:
        behind_its_back = direct.run_pod(burstable_pod("made-directly"))
        direct.remove_pod(handle)
    store = json.loads((workdir / "state/store.json").read_text())
    assert cid in store["containers"]
    proc = CrihookProcess(containerd.endpoint, workdir=workdir, config=config, hooks=None).start()
    try:
        state = _state(proc)
        assert cid not in state["containers"]  # removed while crihook was down: dropped
        assert handle.sandbox_id not in state["pods"]
        rebuilt = state["pods"][behind_its_back.sandbox_id]["view"]
        assert rebuilt["name"] == "made-directly"
        assert rebuilt["cgroup_parent"] == behind_its_back.cgroup_parent
        assert rebuilt["qos_class"] == "Burstable"
        assert behind_its_back.container_ids["app"] in state["containers"]
        assert state["hook_states"]["seen"] == {"seen": ["restart/app"]}
    finally:
        assert proc.stop() == 0


def test_dry_run_changes_nothing(
    containerd: Containerd, pod_cleanup: PodCleanup, plugin: Plugin
) -> None:
    with _crihook(containerd, CHAIN, args=("--dry-run",)) as proc:
        _install(proc, plugin, "20-annotate", "fail")
        _wait_plugin_connected(proc, "20-annotate")
        handle = _run(proc, containerd, "dry-run")
        status, info = _container(containerd, handle.container_ids["app"])
        assert KEY not in status.annotations
        assert not any(e.startswith("FROM_HOOK=") for e in info["runtimeSpec"]["process"]["env"])
        assert status.resources.linux.cpu_shares == 256
        log = proc.log()
        for hook in ("10-env", "20-annotate", "30-shares"):
            assert f"dry-run: {hook} would apply" in log


@pytest.mark.parametrize("insecure", ["world-writable", "not-root"])
def test_insecure_plugin_socket_is_refused(
    containerd: Containerd, pod_cleanup: PodCleanup, plugin: Plugin, insecure: str
) -> None:
    if insecure == "world-writable":
        os.chmod(plugin.socket, 0o666)
    else:
        os.chown(plugin.socket, 65534, -1)
    with _crihook(containerd) as proc:
        _install(proc, plugin, "50-annotate", "fail")
        wait_for(
            lambda: "50-annotate" in json.dumps(_state(proc).get("status") or {}),
            PATIENCE,
            "the plugin to be listed",
        )
        time.sleep(1.0)
        hook = _state(proc)["status"]["hooks"][0]
        assert hook["connected"] is False
        with pytest.raises(PodStartError) as err:
            _run(proc, containerd, f"insecure-{insecure}")
        assert err.value.code == grpc.StatusCode.UNAVAILABLE
        assert "refus" in err.value.details or "owned" in err.value.details


def test_updates_to_other_containers_are_sent_and_failures_reported(
    containerd: Containerd, pod_cleanup: PodCleanup
) -> None:
    config = """
[hooks]
order = ["10-shrink"]
[hooks.shrink]
module = "tests.lab.sample_hooks:ShrinkOthers"
shares = 300
"""
    with _crihook(containerd, config) as proc:
        spec = PodSpec(
            name="updates",
            containers=[
                ContainerSpec(name="first", cpu_request=250, memory_limit=64 * MiB),
                ContainerSpec(name="trigger", cpu_request=250, memory_limit=64 * MiB),
            ],
        )
        with KubeletClient(proc.endpoint, log_root=containerd.pod_log_dir) as kubelet:
            handle = kubelet.run_pod(spec)
        first = handle.container_ids["first"]
        status, _ = _container(containerd, first)
        assert status.resources.linux.cpu_shares == 300
        cgroup = Path("/sys/fs/cgroup/cpu") / handle.cgroup_parent.lstrip("/") / first
        assert (cgroup / "cpu.shares").read_text().strip() == "300"
        # kubelet's other values were sent along unchanged, not zeroed
        assert status.resources.linux.memory_limit_in_bytes == 64 * MiB
        wait_for(
            lambda: (_state(proc).get("status") or {}).get("update_failures") == 1,
            PATIENCE,
            "the failed update to be counted",
        )
        wait_for(lambda: first in _state(proc)["containers"], PATIENCE, "the record")
        audit = _state(proc)["containers"][first]["audit"]
        assert audit["cpu_shares"]["hook"] == "10-shrink"
        assert "update of container 000000000000 for hook 10-shrink failed" in proc.log()
