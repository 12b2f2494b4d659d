"""crihook in front of a runtime with NRI on (containerd 2.x, CRI-O): both layers adjust the
same container.

    kubelet -> crihook (hooks: SetEnv, annotate) -> containerd 2.x | CRI-O -> NRI -> the lab's
    NRI plugin

crihook changes the CreateContainer request before the runtime sees it; the runtime's NRI
then hands the container (as crihook changed it) to the NRI plugin, whose adjustment the
runtime applies to the OCI spec. The test looks at what the container got: its
environment from inside (ExecSync) and the OCI spec containerd made, and the plugin reports
which value of crihook's annotation it saw (``NRI_SAW``): crihook's, so crihook's layer came
first. The same pod sent directly to containerd gets the NRI plugin's change only.

NRI exists in containerd 2.x (1.7 had it as an option; the lab's 1.6 has none) and CRI-O, so
this module runs on its own containerd 2.x and its own CRI-O, whatever ``--containerd`` says.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from crihook.proxy.ops.state_cli import load_state, render_state
from tests.lab import peers
from tests.lab.crihook_proc import CrihookProcess, wait_for
from tests.lab.fixtures import LAB_DIR_PREFIX
from tests.lab.images import LabImages
from tests.lab.kubelet import KubeletClient
from tests.lab.kubelet_encoding import burstable_pod
from tests.lab.nri_proc import NriPlugin
from tests.lab.runtime_lab import RuntimeLab

pytestmark = pytest.mark.containerd

CRIHOOK_ANNOTATION = "nri-test.crihook.io/annotated"
NRI_ANNOTATION = "nri-test.crihook.io/nri"
CHAIN = f"""\
[hooks]
order = ["10-env", "20-annotate"]
[hooks.env]
module = "tests.lab.sample_hooks:SetEnv"
name = "FROM_CRIHOOK"
value = "crihook-hook"
[hooks.annotate]
module = "crihook.hooks.examples.annotate:AnnotateHook"
key = "{CRIHOOK_ANNOTATION}"
value = "by-crihook"
"""


@dataclass(frozen=True)
class Bed:
    containerd: RuntimeLab
    plugin: NriPlugin
    crihook: CrihookProcess


RUNTIMES = {"params": ["2", "crio"], "ids": ["containerd-2", "crio"]}


@contextlib.contextmanager
def _bed(runtime: str, images: LabImages, env: tuple[str, str], config: str) -> Iterator[Bed]:
    """A private containerd 2.x or CRI-O with NRI on a socket of its own, the NRI plugin
    (adding ``env``) registered with it, and crihook (``config``) in front of it; all
    stopped and removed at the end."""
    # Not a short_tmpdir: only the lab's cleanup removes a lab root (it checks for mounts).
    root = Path(tempfile.mkdtemp(prefix=LAB_DIR_PREFIX, dir="/tmp"))
    containerd = peers.lab_runtime(runtime, root, images, nri_socket=root / "nri.sock")
    plugin = NriPlugin(
        root / "nri.sock",
        root / "nri-plugin.log",
        env=env,
        annotation=(NRI_ANNOTATION, "by-nri"),
        report=CRIHOOK_ANNOTATION,
    )
    try:
        containerd.start()
        plugin.start()
        with CrihookProcess(containerd.endpoint, config=config, hooks=None) as crihook:
            yield Bed(containerd, plugin, crihook)
            assert crihook.stop() == 0
    finally:
        plugin.stop()
        containerd.cleanup()  # every pod, mount and cgroup; the runtime stopped


@pytest.fixture(scope="module", **RUNTIMES)
def bed(lab_images: LabImages, request: pytest.FixtureRequest) -> Iterator[Bed]:
    with _bed(request.param, lab_images, ("FROM_NRI", "nri-plugin"), CHAIN) as made:
        yield made


def _what_the_container_got(
    bed: Bed, endpoint: str, name: str
) -> tuple[dict[str, str], dict[str, Any]]:
    """Run a pod through ``endpoint``; the container's env (from inside) and its OCI spec."""
    with KubeletClient(endpoint, log_root=bed.containerd.pod_log_dir) as kubelet:
        handle = kubelet.run_pod(burstable_pod(name))
        cid = handle.container_ids["app"]
        out = kubelet.exec_sync(cid, ["env"])
        assert out.exit_code == 0, out.stderr
    env = dict(line.split("=", 1) for line in out.stdout.decode().splitlines() if "=" in line)
    with KubeletClient(bed.containerd.endpoint) as direct:
        status = direct.container_status(cid, verbose=True)
    spec = json.loads(status.info["info"])["runtimeSpec"]
    spec["cri_annotations"] = dict(status.status.annotations)
    return env, spec


def test_crihooks_and_an_nri_plugins_changes_both_reach_the_container(bed: Bed) -> None:
    env, spec = _what_the_container_got(bed, bed.crihook.endpoint, "nri-through-crihook")
    # crihook's layer: its env var, and its annotation on the container containerd made.
    assert env["FROM_CRIHOOK"] == "crihook-hook"
    assert spec["cri_annotations"][CRIHOOK_ANNOTATION] == "by-crihook"
    # the NRI plugin's layer: its env var, and its annotation in the OCI spec.
    assert env["FROM_NRI"] == "nri-plugin"
    assert spec["annotations"][NRI_ANNOTATION] == "by-nri"
    # the order: NRI got the container as crihook had changed it.
    assert env["NRI_SAW"] == "by-crihook"
    assert {"FROM_CRIHOOK=crihook-hook", "FROM_NRI=nri-plugin", "NRI_SAW=by-crihook"} <= set(
        spec["process"]["env"]
    )
    # kubelet's own container env is still there
    assert "PATH" in env
    assert "created default/nri-through-crihook/app" in bed.plugin.log()


def test_directly_only_the_nri_plugin_changes_the_container(bed: Bed) -> None:
    env, spec = _what_the_container_got(bed, bed.containerd.endpoint, "nri-direct")
    assert env["FROM_NRI"] == "nri-plugin"
    assert spec["annotations"][NRI_ANNOTATION] == "by-nri"
    assert env["NRI_SAW"] == ""  # no crihook in front: nobody set the annotation
    assert "FROM_CRIHOOK" not in env
    assert CRIHOOK_ANNOTATION not in spec["cri_annotations"]


# --- crihook reads back what the runtime made (read_back) ---------------------------------------

READ_BACK_CHAIN = "read_back = true\n" + CHAIN


@pytest.fixture(**RUNTIMES)
def overriding_bed(lab_images: LabImages, request: pytest.FixtureRequest) -> Iterator[Bed]:
    """As `bed`, but the NRI plugin sets the env var crihook's hook sets (FROM_CRIHOOK), so
    it changes a field after crihook; crihook runs with read_back on."""
    env = ("FROM_CRIHOOK", "changed-by-nri")
    with _bed(request.param, lab_images, env, READ_BACK_CHAIN) as made:
        yield made


def test_a_field_an_nri_plugin_changed_after_crihook_is_reported(overriding_bed: Bed) -> None:
    """crihook's env hook sets FROM_CRIHOOK; the runtime's NRI plugin sets it again, after
    crihook. The container gets the plugin's value; crihook, reading the container back,
    says so: in its log, and in the store's audit of that field (`crihook state`). Its
    annotation, which nothing changed, is not reported."""
    bed = overriding_bed
    env, spec = _what_the_container_got(bed, bed.crihook.endpoint, "nri-overrides")
    assert env["FROM_CRIHOOK"] == "changed-by-nri"  # what the runtime made
    assert spec["cri_annotations"][CRIHOOK_ANNOTATION] == "by-crihook"
    cid = _only_container(bed.crihook)
    label = "env 'FROM_CRIHOOK'"

    def audit() -> dict[str, Any]:
        entries: dict[str, Any] = load_state(bed.crihook.state_dir)["containers"][cid]["audit"]
        return entries

    wait_for(lambda: "runtime_made_it" in audit().get(label, {}), 30, "the read-back")
    entry = audit()[label]
    assert (entry["value"], entry["runtime_made_it"]) == ("crihook-hook", "changed-by-nri")
    assert "runtime_made_it" not in audit()[f"annotation {CRIHOOK_ANNOTATION!r}"]
    log = bed.crihook.log()
    assert f"{label} was set by 10-env, the runtime made it something else" in log
    assert "changed-by-nri" not in log  # env values are never logged
    shown = render_state(load_state(bed.crihook.state_dir))
    assert '  CHANGED after crihook: the runtime made it "changed-by-nri"' in shown


def _only_container(crihook: CrihookProcess) -> str:
    """The one container in crihook's store (written behind the call: waited for)."""
    wait_for(lambda: load_state(crihook.state_dir)["containers"], 30, "the stored container")
    (cid,) = load_state(crihook.state_dir)["containers"]
    return str(cid)
