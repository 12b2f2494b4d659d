"""`crihook check` without a runtime: kubelet's settings (fixtures in kubelet_configs/), the
cgroup driver from what containerd 1.6 and 2.x answer, the findings and the exit codes.

The runtime half runs against real containerd in tests/integration/test_check_containerd.py.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.node import cgroup_version
from crihook.proxy.cli import build_parser, main
from crihook.proxy.config import Settings, apply_flags
from crihook.proxy.ops.check import (
    Finding,
    Level,
    cgroup_driver_from_info,
    condition_findings,
    dropin_findings,
    exit_code,
    kubelet_findings,
    read_kubelet,
)
from crihook.proxy.ops.kubelet_settings import (
    KubeletConfigError,
    KubeletSetting,
    parse_kubelet_config,
    parse_kubelet_flags,
    resolve_kubelet_settings,
    same_socket,
)

CONFIGS = Path(__file__).parent / "kubelet_configs"
CRIHOOK = "unix:///run/crihook/crihook.sock"
CONTAINERD = "unix:///run/containerd/containerd.sock"

# --- kubelet's flags and config ----------------------------------------------------------

FLAG_CASES = [
    ("equals", "kubelet --cpu-manager-policy=static", {"--cpu-manager-policy": "static"}),
    ("space", "kubelet --cgroup-driver systemd --v=2", {"--cgroup-driver": "systemd"}),
    (
        "kubeadm",
        "/usr/bin/kubelet --bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf "
        "--config=/var/lib/kubelet/config.yaml --container-runtime-endpoint="
        "unix:///var/run/containerd/containerd.sock --pod-infra-container-image=pause:3.9",
        {
            "--config": "/var/lib/kubelet/config.yaml",
            "--container-runtime-endpoint": "unix:///var/run/containerd/containerd.sock",
        },
    ),
    ("last-wins", "--memory-manager-policy None --memory-manager-policy=Static",
     {"--memory-manager-policy": "Static"}),
    ("unknown-skipped", "--fail-swap-on=false --rotate-certificates", {}),
    ("quoted", "--config '/etc/kube let/c.yaml'", {"--config": "/etc/kube let/c.yaml"}),
    ("empty", "", {}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "expected"), [c[1:] for c in FLAG_CASES], ids=[c[0] for c in FLAG_CASES]
)
def test_kubelet_flags(text: str, expected: dict[str, str]) -> None:
    assert parse_kubelet_flags(text) == expected


@pytest.mark.parametrize(
    ("text", "problem"),
    [("--config", "--config has no value"), ("--cgroup-driver 'systemd", "No closing quotation")],
    ids=["missing-value", "bad-quoting"],
)
def test_kubelet_flags_that_do_not_parse(text: str, problem: str) -> None:
    with pytest.raises(KubeletConfigError, match=problem):
        parse_kubelet_flags(text)


CONFIG_ERRORS = [
    ("not-a-mapping", "- a\n- b\n", "not a KubeletConfiguration"),
    ("other-kind", "kind: KubeProxyConfiguration\n", "not KubeletConfiguration"),
    ("bad-yaml", "cpuManagerPolicy: [static\n", "not valid YAML"),
]


@pytest.mark.parametrize(
    ("text", "problem"), [c[1:] for c in CONFIG_ERRORS], ids=[c[0] for c in CONFIG_ERRORS]
)
def test_kubelet_configs_that_do_not_parse(text: str, problem: str) -> None:
    with pytest.raises(KubeletConfigError, match=problem) as info:
        parse_kubelet_config(text, "/etc/k.yaml")
    assert str(info.value).startswith("/etc/k.yaml: ")


def test_a_json_config_and_an_empty_one_parse() -> None:
    doc = parse_kubelet_config(json.dumps({"cpuManagerPolicy": "static"}), "k.json")
    assert doc == {"cpuManagerPolicy": "static"}
    assert parse_kubelet_config("# nothing\n", "k.yaml") == {}


def test_defaults_then_files_then_drop_ins_then_flags() -> None:
    file = ("config.yaml", {"cpuManagerPolicy": "static", "cgroupDriver": "systemd"})
    dropin = ("10.conf", {"cpuManagerPolicy": "none", "memoryManagerPolicy": "Static"})
    flags = {"--cgroup-driver": "cgroupfs"}
    resolved = resolve_kubelet_settings([file, dropin], flags)
    assert resolved == {
        "cpuManagerPolicy": KubeletSetting("none", "10.conf cpuManagerPolicy"),
        "memoryManagerPolicy": KubeletSetting("Static", "10.conf memoryManagerPolicy"),
        "containerRuntimeEndpoint": KubeletSetting(CONTAINERD, "default"),
        "cgroupDriver": KubeletSetting("cgroupfs", "--cgroup-driver"),
    }


def test_an_empty_string_is_unset_and_a_number_is_an_error() -> None:
    resolved = resolve_kubelet_settings([("c.yaml", {"cpuManagerPolicy": ""})], {})
    assert resolved["cpuManagerPolicy"] == KubeletSetting("none", "default")
    with pytest.raises(KubeletConfigError, match=r"c\.yaml: cgroupDriver must be a string"):
        resolve_kubelet_settings([("c.yaml", {"cgroupDriver": 1})], {})


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        (CRIHOOK, "/run/crihook/crihook.sock", True),
        ("unix:///var/run/crihook/crihook.sock", CRIHOOK, True),
        (CONTAINERD, CRIHOOK, False),
    ],
    ids=["scheme-optional", "var-run-is-run", "different"],
)
def test_same_socket(a: str, b: str, same: bool) -> None:
    assert same_socket(a, b) is same


def test_read_kubelet_follows_config_and_config_dir_from_the_flags(tmp_path: Path) -> None:
    shutil.copy(CONFIGS / "crihook-ready.yaml", tmp_path / "config.yaml")
    dropins = tmp_path / "kubelet.conf.d"
    dropins.mkdir()
    shutil.copy(CONFIGS / "dropin-static.conf", dropins / "20-cpu.conf")
    (dropins / "README").write_text("not a drop-in: no .conf suffix\ncpuManagerPolicy: [\n")
    flags = f"kubelet --config={tmp_path / 'config.yaml'} --config-dir {dropins}"
    resolved = read_kubelet(None, flags)
    assert resolved["cpuManagerPolicy"] == KubeletSetting(
        "static", f"{dropins / '20-cpu.conf'} cpuManagerPolicy"
    )
    assert resolved["containerRuntimeEndpoint"].value == CRIHOOK
    # --kubelet-config wins over the --config among the flags.
    other = read_kubelet(CONFIGS / "kubeadm-static.yaml", flags)
    assert other["cgroupDriver"].value == "systemd"


def test_read_kubelet_names_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(KubeletConfigError, match=f"cannot read {tmp_path}/absent.yaml"):
        read_kubelet(tmp_path / "absent.yaml", None)


# --- what kubelet's settings mean for crihook --------------------------------------------

KUBELET_CASES = [
    (
        "kubeadm-static-and-direct",
        "kubeadm-static.yaml",
        "--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock",
        "cgroupfs",
        [
            (Level.WARNING, "CPU manager policy is static"),
            (Level.WARNING, "memory manager policy is Static"),
            (Level.WARNING, "is the runtime itself: crihook sees no call"),
            (Level.WARNING, "cgroup driver systemd"),
        ],
    ),
    (
        "ready",
        "crihook-ready.yaml",
        "",
        "cgroupfs",
        [(Level.OK, "CPU manager none, memory manager None"),
         (Level.OK, "runtime endpoint is crihook")],
    ),
    (
        "flag-overrides-the-file-endpoint",
        "kubeadm-static.yaml",
        f"--container-runtime-endpoint {CRIHOOK} --cpu-manager-policy=none "
        "--memory-manager-policy None",
        "systemd",
        [(Level.OK, "CPU manager none, memory manager None"),
         (Level.OK, "runtime endpoint is crihook")],
    ),
    (
        "defaults-point-at-containerd",
        None,
        "kubelet --v=2",
        "systemd",  # kubelet's default driver is not compared: recent kubelets ask the runtime
        [(Level.OK, "CPU manager none"), (Level.WARNING, "(default) is the runtime itself")],
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("config", "flags", "driver", "expected"),
    [c[1:] for c in KUBELET_CASES],
    ids=[c[0] for c in KUBELET_CASES],
)
def test_kubelet_findings(
    config: str | None, flags: str, driver: str, expected: list[tuple[Level, str]]
) -> None:
    kubelet = read_kubelet(CONFIGS / config if config else None, flags)
    found = kubelet_findings(kubelet, CRIHOOK, CONTAINERD, driver)
    assert len(found) == len(expected), found
    for finding, (level, text) in zip(found, expected, strict=True):
        assert finding.level is level and finding.topic == "kubelet"
        assert text in finding.message, finding.message


# --- the runtime's answers ---------------------------------------------------------------

# Status(verbose) info["config"], trimmed to what is read, as containerd answered in the lab.
CONTAINERD_16_CONFIG = {
    "systemdCgroup": False,
    "containerd": {
        "defaultRuntimeName": "runc",
        "runtimes": {
            "runc": {
                "runtimeType": "io.containerd.runc.v2",
                "options": {"BinaryName": "/usr/sbin/runc", "SystemdCgroup": False},
            }
        },
    },
}
CONTAINERD_2_CONFIG = {
    "containerd": {
        "defaultRuntimeName": "runc",
        "runtimes": {
            "runc": {
                "runtimeType": "io.containerd.runc.v2",
                "options": {
                    "BinaryName": "/usr/sbin/runc",
                    "ShimCgroup": "",
                    "SystemdCgroup": True,
                },
            }
        },
    },
}
LEGACY = {
    "systemdCgroup": True,
    "containerd": {"defaultRuntimeName": "runc", "runtimes": {"runc": {"options": None}}},
}

RUNC = "Status info, runtime 'runc' SystemdCgroup"
DRIVER_CASES = [
    ("containerd-1.6", CONTAINERD_16_CONFIG, ("cgroupfs", RUNC)),
    ("containerd-2-systemd", CONTAINERD_2_CONFIG, ("systemd", RUNC)),
    ("1.x-plugin-wide", LEGACY, ("systemd", "Status info systemdCgroup")),
    ("no-options", {"containerd": {"defaultRuntimeName": "r", "runtimes": {"r": {}}}},
     ("cgroupfs", "Status info, runtime 'r', runc's default")),
    ("no-default-runtime", {"containerd": {"runtimes": {}}},
     (None, "Status info config names no default runtime")),
    # CRI-O's verbose config is its own Go struct: the manager is named outright.
    ("crio-cgroupfs", {"crio": {"CgroupManagerName": "cgroupfs", "DefaultRuntime": "runc"}},
     ("cgroupfs", "Status info, CRI-O CgroupManagerName")),
    ("crio-systemd", {"crio": {"CgroupManagerName": "systemd"}},
     ("systemd", "Status info, CRI-O CgroupManagerName")),
    ("crio-no-manager", {"crio": {}},
     (None, "Status info config (CRI-O) names no cgroup manager")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("config", "expected"), [c[1:] for c in DRIVER_CASES], ids=[c[0] for c in DRIVER_CASES]
)
def test_cgroup_driver_from_status_info(
    config: dict[str, object], expected: tuple[str | None, str]
) -> None:
    assert cgroup_driver_from_info({"config": json.dumps(config)}) == expected


def test_cgroup_driver_without_config_info() -> None:
    assert cgroup_driver_from_info({"golang": '"go1.19"'}) == (None, "Status info has no config")
    assert cgroup_driver_from_info({"config": "{"})[0] is None


def test_conditions() -> None:
    def condition(kind: str, ok: bool, message: str = "") -> api_pb2.RuntimeCondition:
        return api_pb2.RuntimeCondition(type=kind, status=ok, reason="R" if message else "",
                                        message=message)  # fmt: skip

    found = condition_findings(
        [
            condition("RuntimeReady", True),
            condition("NetworkReady", False, "cni config uninitialized"),
            condition("ContainerdHasNoDeprecationWarnings", False, "cgroup v1"),
            condition("RuntimeReady", False),
        ]
    )
    assert [(f.level, f.message) for f in found] == [
        (Level.WARNING, "NetworkReady is false: R; cni config uninitialized"),
        (Level.NOTE, "ContainerdHasNoDeprecationWarnings is false: R; cgroup v1"),
        (Level.ERROR, "RuntimeReady is false"),
    ]


def test_cgroup_version(tmp_path: Path) -> None:
    assert cgroup_version(tmp_path) is None
    (tmp_path / "cpu,cpuacct").mkdir()
    assert cgroup_version(tmp_path) == 1
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu memory\n")
    assert cgroup_version(tmp_path) == 2


@pytest.mark.parametrize(
    ("levels", "code"),
    [
        ([Level.OK, Level.NOTE], 0),
        ([Level.OK, Level.WARNING, Level.NOTE], 1),
        ([Level.WARNING, Level.ERROR], 2),
        ([], 0),
    ],
    ids=["ok-and-notes", "warning", "error-wins", "nothing"],
)
def test_exit_code(levels: list[Level], code: int) -> None:
    assert exit_code(Finding(level, "t", "m") for level in levels) == code


# --- the command, without a runtime ------------------------------------------------------


def test_check_takes_every_serve_flag() -> None:
    parser = build_parser()
    serve = parser.parse_args(["serve", "--hooks", "cpuset", "--dry-run", "--listen", "/x.sock"])
    check = parser.parse_args(["check", "--hooks", "cpuset", "--dry-run", "--listen", "/x.sock"])
    only_check = {"json"}  # and kubelet_*: check's own flags
    assert {
        k: v for k, v in vars(check).items() if not k.startswith("kubelet_") and k not in only_check
    } == {**vars(serve), "command": "check"}


def test_a_bad_config_is_an_error_and_the_rest_is_still_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.toml"
    config.write_text('log_level = "loud"\n')
    plugins = tmp_path / "hooks.d"
    plugins.mkdir()
    (plugins / "50-x.toml").write_text('name = "50-x"\n')
    argv = ["check", "--config", str(config), "--plugins-dir", str(plugins),
            "--runtime-endpoint", str(tmp_path / "absent.sock"),
            "--kubelet-config", str(CONFIGS / "crihook-ready.yaml")]  # fmt: skip
    assert main(argv) == 2
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("error    config: log_level: must be one of")
    assert lines[1] == "note     config: checking on with the defaults and flags"
    assert any(
        line.startswith(f"error    plugins: {plugins}/50-x.toml endpoint: missing")
        for line in lines
    )
    assert any(
        line.startswith(f"error    runtime: unix://{tmp_path}/absent.sock does not answer")
        for line in lines
    )
    assert "ok       kubelet: runtime endpoint is crihook (unix:///run/crihook/crihook.sock)" in (
        lines
    )
    assert lines[-1].startswith("crihook check: ") and lines[-1].endswith("(exit 2)")


def test_drop_ins_named_like_a_hook_or_one_another_are_errors(tmp_path: Path) -> None:
    def dropin(file: str, name: str, policy: str) -> None:
        (tmp_path / file).write_text(
            f'name = "{name}"\nendpoint = "unix:///run/absent/{file}.sock"\n'
            f'failure_policy = "{policy}"\n'
        )

    dropin("a.toml", "50-cpuset", "fail")
    dropin("b.toml", "50-x", "fail")
    dropin("c.toml", "60-x", "fail")
    dropin("d.toml", "70-y", "ignore")
    settings = apply_flags(Settings(), {"hooks": "cpuset", "plugins_dir": str(tmp_path)})
    found = [(f.level, f.topic, f.message) for f in dropin_findings(settings)]
    absent = "does not exist (is the plugin running?)"
    assert found == [
        (Level.ERROR, "plugins", f"{tmp_path}/a.toml name: 'cpuset' is already an in-process "
         "hook (crihook ignores this file)"),
        (Level.WARNING, "plugin 50-x", f"socket /run/absent/b.toml.sock {absent}"),
        (Level.ERROR, "plugins", f"{tmp_path}/c.toml name: 'x' is already used by "
         f"{tmp_path}/b.toml (crihook ignores this file)"),
        (Level.NOTE, "plugin 70-y", f"socket /run/absent/d.toml.sock {absent}"),
    ]  # fmt: skip
    empty = replace(settings.chain, plugins_dir=tmp_path / "none")
    assert [f.level for f in dropin_findings(replace(settings, chain=empty))] == [Level.NOTE]


def test_an_option_this_host_cannot_do_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[hooks.cpuset]\nshared_pool_in = "qos-cgroups"\n')
    cgroup = tmp_path / "cgroup"
    (cgroup / "memory").mkdir(parents=True)  # cgroup v1
    argv = ["check", "--config", str(config), "--hooks", "cpuset", "--cgroup-root", str(cgroup),
            "--plugins-dir", str(tmp_path / "hooks.d"),
            "--runtime-endpoint", str(tmp_path / "absent.sock")]  # fmt: skip
    assert main(argv) == 2
    lines = capsys.readouterr().out.splitlines()
    assert "ok       hook 20-cpuset: builds" in lines
    assert any(
        line.startswith(
            'error    host: [hooks.cpuset] shared_pool_in: "qos-cgroups" needs cgroup v2'
        )
        for line in lines
    )
