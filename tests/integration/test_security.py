"""Security on real files and processes (what the fakes of the unit tests cannot show):

- crihook's socket: the configured mode and group, and who can then connect (a process of
  another user, with and without the socket's group);
- the devices hook's allowlists on a real filesystem: `..`, symlinked files, symlinked
  directories and relative links chained out of the allowed tree are refused; what is inside
  is given;
- a hostile plugin (ids, keys and names with `..` and `/` in its adjustments, its updates and
  its Synchronize answer) makes crihook write nothing outside its state directory.

Already covered elsewhere, not repeated: the default socket mode (test_proxy_faults.py),
plugin sockets of the wrong owner or mode (test_remote_plugin.py, and symlinks in
tests/unit/test_plugin_socket_check.py), `..` and symlinks in the devices hook with fake files
(tests/unit/test_devices_hook.py) and one symlink in containerd (test_device_hooks_containerd).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.devices import DevicesHook
from crihook.hooks.spec import Forbidden, InvalidRequest
from tests.lab.crihook_proc import PATIENCE, CrihookProcess, short_tmpdir, wait_for
from tests.lab.kubelet_encoding import PodSpec, container_config, sandbox_config
from tests.lab.memory_runtime import MemoryRuntime
from tests.lab.metrics_scrape import scrape, value
from tests.unit.hook_harness import SMALL, FakeStaging, Node, burstable, topology_of

NOBODY = 65534
ADM = 4  # a group nobody is not in


@pytest.fixture
def runtime() -> Iterator[MemoryRuntime]:
    fake = MemoryRuntime(short_tmpdir("sec-") / "rt.sock").start()
    yield fake
    fake.stop()


def _connects_as(path: Path, uid: int, gid: int) -> str:
    """Connect to `path` from a process of `uid`/`gid` (no supplementary groups): "ok" or
    the error's name."""
    probe = textwrap.dedent(f"""
        import os, socket
        os.setgroups([]); os.setgid({gid}); os.setuid({uid})
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect({str(path)!r}); print("ok")
        except OSError as e:
            print(type(e).__name__)
    """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30)
    return out.stdout.strip() or out.stderr.strip()


@pytest.mark.parametrize(
    ("mode", "group", "mode_bits", "gid", "nobody_in_group", "nobody"),
    [
        ("0660", str(ADM), 0o660, ADM, "ok", "PermissionError"),
        ("0600", None, 0o600, 0, "PermissionError", "PermissionError"),
    ],
    ids=["group-may-connect", "root-only"],
)
def test_the_socket_has_the_configured_mode_and_group_and_only_they_connect(
    runtime: MemoryRuntime,
    mode: str,
    group: str | None,
    mode_bits: int,
    gid: int,
    nobody_in_group: str,
    nobody: str,
) -> None:
    config = f'socket_mode = "{mode}"\n' + (f'socket_group = "{group}"\n' if group else "")
    proc = CrihookProcess(runtime.endpoint, config=config).start()
    # The socket's directory is searchable by all, so that only the socket's own mode decides.
    proc.workdir.chmod(0o755)
    st = proc.socket_path.stat()
    assert (oct(st.st_mode & 0o777), st.st_gid) == (oct(mode_bits), gid)
    assert _connects_as(proc.socket_path, NOBODY, ADM) == nobody_in_group
    assert _connects_as(proc.socket_path, NOBODY, NOBODY) == nobody
    proc.stop()


# --- the devices hook's allowlists on a real filesystem -----------------------------------------


@pytest.fixture
def tree() -> Iterator[Path]:
    """<root>/dev: `ok-null` (c 1:3), `secret` (c 1:1) outside the allowlist, links;
    <root>/private/secret-dir/node (c 1:1); <root>/models/a.bin; <root>/etc/passwd."""
    root = short_tmpdir("dv-")
    dev = root / "dev"
    (dev / "by-id").mkdir(parents=True)
    (root / "private").mkdir()
    os.mknod(dev / "ok-null", 0o666 | 0o020000, os.makedev(1, 3))
    os.mknod(dev / "secret", 0o600 | 0o020000, os.makedev(1, 1))
    os.mknod(root / "private" / "node", 0o600 | 0o020000, os.makedev(1, 1))
    (dev / "ok-link").symlink_to("../dev/secret")  # relative, out of ok-*
    (dev / "ok-hop").symlink_to("ok-link")  # a chain: ok-hop → ok-link → secret
    (dev / "ok-back").symlink_to("ok-null")  # a link that stays inside
    (dev / "by-id" / "dir").symlink_to(root / "private")  # a directory link out of by-id/**
    (root / "models").mkdir()
    (root / "models" / "a.bin").write_text("weights\n")
    (root / "etc").mkdir()
    (root / "etc" / "passwd").write_text("root:x:0:0\n")
    (root / "models" / "etc").symlink_to(root / "etc")
    yield root


def _policy(root: Path) -> dict[str, object]:
    return {
        "namespaces": ["ml"],
        "devices": [f"{root}/dev/ok-*", f"{root}/dev/by-id/**"],
        "mounts": [f"{root}/models", f"{root}/models/**"],
    }


CASES = [
    ("devices", "dev/ok-null", None, None),
    ("devices", "dev/ok-back", None, None),
    ("devices", "dev/ok-null/../secret", InvalidRequest, "not a normalized path"),
    ("devices", "dev/ok-link", Forbidden, "leads to"),
    ("devices", "dev/ok-hop", Forbidden, "leads to"),
    ("devices", "dev/by-id/dir/node", Forbidden, "leads to"),
    ("devices", "dev/secret", Forbidden, "not allowed"),
    ("mounts", "models/a.bin", None, None),
    ("mounts", "models/../etc/passwd", InvalidRequest, "not a normalized path"),
    ("mounts", "models/etc/passwd", Forbidden, "leads to"),
]


@pytest.mark.parametrize(
    ("kind", "path", "refusal", "message"),
    CASES,
    ids=["inside", "link-inside", "dotdot", "link-out", "link-chain-out", "dir-link-out",
         "outside", "mount-inside", "mount-dotdot", "mount-dir-link-out"],
)  # fmt: skip
def test_an_allowlist_cannot_be_left_by_dots_or_links(
    tree: Path, kind: str, path: str, refusal: type[Exception] | None, message: str | None
) -> None:
    full = f"{tree}/{path}"
    value = [{"path": full}] if kind == "devices" else {full: "/in/container"}
    spec = PodSpec(
        "p",
        namespace="ml",
        containers=[burstable("app")],
        annotations={f"{kind}.crihook.io/container.app": json.dumps(value)},
    )

    async def create() -> tuple[api_pb2.ContainerConfig, FakeStaging]:
        node = Node(DevicesHook(_policy(tree)), topology_of(SMALL))
        await node.sync()
        pod = await node.run_pod(spec, "sb")
        before = sorted(node.state.items())
        try:
            return (await node.begin_create(pod, spec.containers[0])).request.config, node.staging
        except (Forbidden, InvalidRequest):
            assert sorted(node.state.items()) == before  # nothing held for a refused call
            raise

    if refusal is None:
        config, staging = asyncio.run(create())
        given = [d.host_path for d in config.devices] + [m.host_path for m in config.mounts]
        given = [staging.host_path(p) for p in given]  # the runtime gets staged paths
        assert os.path.realpath(full) in given
        return
    with pytest.raises(refusal, match=message) as info:
        asyncio.run(create())
    assert f"{kind}.crihook.io/container.app" in str(info.value)


# --- a hostile plugin ----------------------------------------------------------------------------

HOSTILE = '''
import sys
from crihook.hooks.sdk import run
from crihook.hooks.spec import Adjustment, ContainerUpdate, Hook, ResourceDelta

ESCAPES = ["../../../../{target}", "/{target}", "..", "a/../../b", "x\\x00y"]

class Hostile(Hook):
    """Every id, key and name it hands back tries to leave crihook's state directory."""

    async def synchronize(self, sync):
        return [ContainerUpdate(e, ResourceDelta(cpu_shares=2)) for e in ESCAPES]

    async def pre_create_container(self, ctx):
        adjustment = Adjustment()
        for i, e in enumerate(ESCAPES[:4]):
            adjustment.set_annotation(e, e).set_label(e, e)
            adjustment.update_container(e, ResourceDelta(cpu_shares=2 + i))
        return adjustment

    async def post_create_container(self, ctx):
        return Adjustment().update_container("../../{target}", ResourceDelta(cpu_shares=3))

run(Hostile(), sys.argv[1])
'''


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_a_hostile_plugin_makes_crihook_write_nothing_outside_its_state_dir(
    runtime: MemoryRuntime,
) -> None:
    outside = short_tmpdir("out-")
    target = f"{outside.relative_to('/')}/pwned"
    plugin_dir = short_tmpdir("hp-")
    plugin_dir.chmod(0o755)
    sock = plugin_dir / "hostile.sock"
    script = plugin_dir / "hostile.py"
    script.write_text(HOSTILE.replace("{target}", target))
    log = (plugin_dir / "plugin.log").open("ab")
    plugin = subprocess.Popen([sys.executable, str(script), str(sock)], stdout=log, stderr=log)
    log.close()
    try:
        wait_for(sock.exists, PATIENCE, "the hostile plugin's socket")
        proc = CrihookProcess(runtime.endpoint)
        (proc.plugins_dir / "hostile.toml").write_text(
            f'name = "50-hostile"\nendpoint = "unix://{sock}"\nfailure_policy = "ignore"\n'
            'allow = ["annotation:*", "label:*", "cpu_shares"]\n'
        )
        proc.start()
        spec = PodSpec("p", containers=[burstable("app")])
        with grpc.insecure_channel(proc.endpoint) as channel:
            run = channel.unary_unary("/runtime.v1.RuntimeService/RunPodSandbox")
            create = channel.unary_unary("/runtime.v1.RuntimeService/CreateContainer")
            sandbox = sandbox_config(spec)
            answer = run(
                api_pb2.RunPodSandboxRequest(config=sandbox).SerializeToString(), timeout=60
            )
            sid = api_pb2.RunPodSandboxResponse.FromString(answer).pod_sandbox_id
            config = container_config(spec, spec.containers[0], node_memory=1 << 34)
            request = api_pb2.CreateContainerRequest(
                pod_sandbox_id=sid, config=config, sandbox_config=sandbox
            )
            create(request.SerializeToString(), timeout=60)
        # The plugin was heard: its labels reached the runtime, its updates were sent (after
        # the call's answer).
        (created,) = runtime.containers.values()
        assert created.config.labels[".."] == ".."

        def updated() -> set[str]:
            return {
                api_pb2.UpdateContainerResourcesRequest.FromString(r.request).container_id
                for r in runtime.calls("UpdateContainerResources")
            }

        wanted = {"..", "a/../../b", f"../../{target}"}
        wait_for(lambda: wanted <= updated(), PATIENCE, "the hostile plugin's updates sent")
        wait_for(lambda: "50-hostile" in proc.log(), PATIENCE, "the plugin in the chain")
        proc.stop()
        assert _files(outside) == set(), "crihook wrote outside its state directory"
        state_files = {"store.json", "status.json", "node.json", "hooks", "crihook.lock"}
        files = _files(proc.state_dir)
        # unsettled-<n>: the containers updated since the last store.json (a container id
        # only ever inside a line, never in a path)
        assert {f for f in files if not f.startswith("unsettled-")} <= state_files
        assert plugin.poll() is None  # it was served, not crashed
    finally:
        plugin.kill()
        plugin.wait()


# --- the state directory and the recording are root's alone ----------------------------------


def _modes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root.parent)): oct(p.lstat().st_mode & 0o777)
        for p in [root, *root.rglob("*")]
        if not p.name.startswith(".")
    }


def test_the_state_directory_and_the_recording_are_root_s_alone(
    runtime: MemoryRuntime,
) -> None:
    """store.json carries pods' annotations as kubelet sent them (tokens, passwords): the
    state directory is 0700 and each file in it 0600, whatever the umask; a state directory
    an older crihook left readable is fixed at start, and so is a recording file."""
    workdir = short_tmpdir("st-")
    record = workdir / "calls" / "record.jsonl"
    proc = CrihookProcess(
        runtime.endpoint, workdir=workdir, hooks="cpuset", args=["--record", str(record)]
    )
    state = proc.state_dir
    (state / "hooks").mkdir(parents=True)
    (state / "store.json").write_text('{"version": 1, "pods": {}, "containers": {}}')
    (state / "hooks" / "20-cpuset.json").write_text("{}")
    record.parent.mkdir()
    record.write_text("")
    elsewhere = workdir / "not-state.txt"
    elsewhere.write_text("x")
    for path in (state, state / "hooks", record.parent):
        path.chmod(0o755)
    for path in (state / "store.json", state / "hooks" / "20-cpuset.json", record, elsewhere):
        path.chmod(0o644)
    (state / "link").symlink_to(elsewhere)  # never followed
    previous = os.umask(0)  # crihook inherits it: nothing may rely on a umask
    try:
        proc.start()
    finally:
        os.umask(previous)
    spec = PodSpec(
        "p", containers=[burstable("app")], annotations={"example.com/api-token": "s3cr3t"}
    )
    with grpc.insecure_channel(proc.endpoint) as channel:
        run = channel.unary_unary("/runtime.v1.RuntimeService/RunPodSandbox")
        create = channel.unary_unary("/runtime.v1.RuntimeService/CreateContainer")
        sandbox = sandbox_config(spec)
        answer = run(api_pb2.RunPodSandboxRequest(config=sandbox).SerializeToString(), timeout=60)
        sid = api_pb2.RunPodSandboxResponse.FromString(answer).pod_sandbox_id
        config = container_config(spec, spec.containers[0], node_memory=1 << 34)
        request = api_pb2.CreateContainerRequest(
            pod_sandbox_id=sid, config=config, sandbox_config=sandbox
        )
        create(request.SerializeToString(), timeout=60)
    wait_for(
        lambda: "s3cr3t" in (state / "store.json").read_text() and (state / "status.json").exists(),
        60,
        "the pod in store.json, and status.json",
    )
    assert proc.stop() == 0
    modes = _modes(state)
    assert {"state/store.json", "state/status.json", "state/hooks/20-cpuset.json"} <= set(modes)
    expected = {name: "0o700" if (workdir / name).is_dir() else "0o600" for name in modes}
    expected["state/link"] = "0o777"  # a symlink's own mode; what it names is left alone
    assert modes == expected
    assert oct(elsewhere.stat().st_mode & 0o777) == "0o644"
    assert oct(record.stat().st_mode & 0o777) == "0o600"
    assert record.stat().st_size > 0
    assert "made root's alone" in proc.log()


# --- drop-ins: only what root could have written -----------------------------------------------


def test_a_users_drop_in_in_a_world_writable_plugins_dir_cannot_fail_every_call(
    runtime: MemoryRuntime,
) -> None:
    """The probe of issue 28: with the plugins directory made world-writable, a user's
    drop-in with `failure_policy = "fail"` (its plugin never answers) made every RunPodSandbox
    fail; a second one pointed at the runtime's own socket. Now the directory is refused
    whole, then (fixed) the user's own file is refused: each refusal a log line naming the
    file and the reason, and counted; kubelet's calls go on."""
    workdir = short_tmpdir("dd-")
    metrics = f"unix://{workdir / 'metrics.sock'}"
    proc = CrihookProcess(runtime.endpoint, workdir=workdir, args=["--metrics-listen", metrics])
    proc.plugins_dir.chmod(0o777)  # the misconfiguration
    user = proc.plugins_dir / "10-user.toml"
    user.write_text(
        f'name = "10-evil"\nendpoint = "unix://{workdir}/nothing.sock"\nfailure_policy = "fail"\n'
    )
    os.chown(user, NOBODY, NOBODY)
    runtime_socket = runtime.endpoint.removeprefix("unix://")
    (proc.plugins_dir / "20-runtime.toml").write_text(
        f'name = "20-runtime"\nendpoint = "unix://{runtime_socket}"\nfailure_policy = "fail"\n'
    )
    proc.start()
    spec = PodSpec("p", containers=[burstable("app")])

    def run_pod() -> None:
        with grpc.insecure_channel(proc.endpoint) as channel:
            run = channel.unary_unary("/runtime.v1.RuntimeService/RunPodSandbox")
            request = api_pb2.RunPodSandboxRequest(config=sandbox_config(spec))
            run(request.SerializeToString(), timeout=60)

    wait_for(lambda: "plugins directory refused" in proc.log(), 60, "the directory refused")
    run_pod()
    assert (
        f"plugins directory refused: {proc.plugins_dir}: the directory is writable by others"
        in (proc.log())
    )
    proc.plugins_dir.chmod(0o755)  # fixed: now each file is judged
    wait_for(lambda: "plugin drop-in refused" in proc.log(), 60, "the user's drop-in refused")
    wait_for(lambda: "20-runtime.toml endpoint" in proc.log(), 60, "the runtime's socket refused")
    run_pod()
    log = proc.log()
    assert f"plugin drop-in refused: {user}: it is owned by uid {NOBODY}, not uid 0" in log
    assert "is the runtime's socket, not a plugin's" in log
    assert "10-evil" not in log.split("plugin drop-in refused")[0]  # never loaded
    samples = scrape(metrics)
    refused = "crihook_plugin_dropins_refused_total"
    assert value(samples, refused, reason="directory") == 1
    assert value(samples, refused, reason="owner") == 1
    assert proc.stop() == 0
