"""The systemd units as systemd reads them (`systemd-analyze verify`, Debian's systemd package,
installed by tests/lab/install.sh), the watchdog, and the kubelet drop-ins as kubelet reads
them (flag and KubeletConfiguration field), through `crihook check`'s reader."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from crihook.proxy.config import Settings
from crihook.proxy.ops.check import read_kubelet
from crihook.proxy.ops.kubelet_settings import parse_kubelet_config
from crihook.proxy.ops.watchdog import PINGS_PER_TIMEOUT
from tests.unit.test_deploy_files import (
    DROPIN,
    UNIT,
    kubelet_flags,
    parse_unit,
    single,
    timespan_seconds,
)

REPO = Path(__file__).resolve().parents[2]
KUBELET_CONF_DROPIN = REPO / "systemd" / "kubelet.conf.d" / "50-crihook.conf"
KUBEADM_CONFIG = Path(__file__).parent / "kubelet_configs" / "kubeadm-static.yaml"
CONTAINERD = "unix:///run/containerd/containerd.sock"
# A stand-in for kubeadm's kubelet.service: the drop-in's flags arrive in $KUBELET_EXTRA_ARGS.
KUBELET_SERVICE = "[Service]\nExecStart=/usr/bin/kubelet $KUBELET_EXTRA_ARGS\n"


@pytest.fixture
def system_root(tmp_path: Path) -> Iterator[Path]:
    """A root for `systemd-analyze verify --root`: the host's own units (targets the
    crihook unit names), our units in /etc/systemd/system, and the binaries they run."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze is missing: run tests/lab/install.sh (Debian's systemd)")
    root = tmp_path / "root"
    units = root / "etc/systemd/system"
    (units / "kubelet.service.d").mkdir(parents=True)
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    for binary in ("usr/local/bin/crihook", "usr/bin/kubelet"):
        (root / binary).parent.mkdir(parents=True, exist_ok=True)
        (root / binary).write_text("#!/bin/sh\n")
        (root / binary).chmod(0o755)
    shutil.copy(UNIT, units / "crihook.service")
    shutil.copy(DROPIN, units / "kubelet.service.d" / DROPIN.name)
    (units / "kubelet.service").write_text(KUBELET_SERVICE)
    yield root


def verify(root: Path, *units: str) -> tuple[int, str]:
    done = subprocess.run(
        ["systemd-analyze", "verify", f"--root={root}", *units],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode, (done.stdout + done.stderr).strip()


def test_units_pass_systemd_analyze_verify(system_root: Path) -> None:
    assert verify(system_root, "crihook.service", "kubelet.service") == (0, "")


def test_verify_does_catch_a_mistake(system_root: Path) -> None:
    # The check above can fail: systemd names an unknown key in the drop-in.
    dropin = system_root / "etc/systemd/system/kubelet.service.d" / DROPIN.name
    dropin.write_text(dropin.read_text() + "WatchdogSecs=3\n")
    code, out = verify(system_root, "kubelet.service")
    assert "Unknown key 'WatchdogSecs'" in out, (code, out)


def test_unit_has_a_watchdog_crihook_can_keep() -> None:
    unit = parse_unit(UNIT)
    timeout = timespan_seconds(single(unit, "Service", "WatchdogSec"))
    assert timeout >= 10
    # crihook pings PINGS_PER_TIMEOUT times per timeout: at least every 10 s here.
    assert timeout / PINGS_PER_TIMEOUT <= 10
    # Pings come from crihook's main process, the only one NotifyAccess lets through.
    assert single(unit, "Service", "NotifyAccess") == "main"


def test_the_flag_drop_in_beats_the_config_field(tmp_path: Path) -> None:
    # A kubeadm node whose config file and kubeadm-flags.env point kubelet at containerd:
    # the drop-in's flags come last on the command line and win over both.
    config = tmp_path / "config.yaml"
    config.write_text(KUBEADM_CONFIG.read_text() + f"containerRuntimeEndpoint: {CONTAINERD}\n")
    assert read_kubelet(config, None)["containerRuntimeEndpoint"].value == CONTAINERD
    flags = kubelet_flags(parse_unit(DROPIN))
    argv = " ".join(f"{name}={value}" for name, value in flags.items())
    command = f"/usr/bin/kubelet --config={config} --container-runtime-endpoint={CONTAINERD} {argv}"
    endpoint = read_kubelet(None, command)["containerRuntimeEndpoint"]
    assert (endpoint.value, endpoint.source) == (
        Settings().server.listen,
        "--container-runtime-endpoint",
    )


def test_the_kubelet_config_drop_in_points_at_crihook(tmp_path: Path) -> None:
    # Through --config-dir, over a config file that named containerd.
    config = tmp_path / "config.yaml"
    config.write_text(f"kind: KubeletConfiguration\ncontainerRuntimeEndpoint: {CONTAINERD}\n")
    conf_d = tmp_path / "kubelet.conf.d"
    conf_d.mkdir()
    shutil.copy(KUBELET_CONF_DROPIN, conf_d)
    command = shlex.join(["kubelet", f"--config={config}", "--config-dir", str(conf_d)])
    endpoint = read_kubelet(None, command)["containerRuntimeEndpoint"]
    assert endpoint.value == Settings().server.listen
    assert endpoint.source.endswith("50-crihook.conf containerRuntimeEndpoint")
    doc = parse_kubelet_config(KUBELET_CONF_DROPIN.read_text(), "50-crihook.conf")
    assert doc["apiVersion"] == "kubelet.config.k8s.io/v1beta1"
    assert doc["imageServiceEndpoint"] == Settings().runtime.endpoint
