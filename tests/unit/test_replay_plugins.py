"""Plugins recorded and replayed: a stand-in takes each plugin's place in the chain and
answers with what the recording says it answered, so the chain's own code applies it again
(order, grants, merge, failure policy, breaker). Recorded in process
(tests/unit/record_harness.py: hooks in the chain's plugin entries, with drop-in settings);
through a real plugin process in tests/integration/test_record_replay.py."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.examples.annotate import AnnotateHook
from crihook.hooks.spec import (
    Adjustment,
    Event,
    Forbidden,
    Hook,
    HookContext,
    InvalidRequest,
    Reject,
    Stage,
)
from crihook.proxy.config import HookSettings, Settings, settings_from_toml
from crihook.proxy.cri.outcome import Outcome
from crihook.proxy.replay.cli import replay_command, write_updated
from crihook.proxy.replay.diff import ABSENT
from crihook.proxy.replay.file import CallEntry, SyncEntry, read_recording
from crihook.proxy.replay.plugins import failure_of, refusal_of
from crihook.proxy.replay.runner import replay
from tests.lab.kubelet_encoding import ContainerSpec, PodSpec
from tests.unit.record_harness import RecordingNode

CONFIG = {"hooks": {"order": ["oom"]}}
ENDPOINT = "unix:///run/crihook/plugins/p.sock"


class Secret(Hook):
    """Sets a secret env value (granted) and an annotation."""

    async def pre_create_container(self, ctx: HookContext) -> Adjustment:
        return Adjustment().set_env("TOKEN", "s3cr3t").set_annotation("example.com/by", "secret")


class Flaky(Hook):
    """Fails every call (its breaker opens after two)."""

    async def pre_create_container(self, ctx: HookContext) -> Adjustment:
        raise RuntimeError("plugin failed: disk on fire")


class Slow(Hook):
    async def pre_create_container(self, ctx: HookContext) -> Adjustment:
        await asyncio.sleep(5)
        return Adjustment()


class Guard(Hook):
    """Refuses sandboxes in namespace `forbidden`; validates every container."""

    async def pre_run_pod_sandbox(self, ctx: HookContext) -> Adjustment | None:
        if ctx.pod.namespace == "forbidden":
            raise Forbidden("namespace forbidden may not run here")
        return None

    async def validate_create_container(self, ctx: HookContext) -> None:
        return None


class Greedy(Hook):
    """Asks for a device it is not granted (refused by the chain)."""

    async def pre_create_container(self, ctx: HookContext) -> Adjustment:
        return Adjustment().add_device("/dev/kvm", "/dev/kvm").because("wants kvm")


def plugin(name: str, **settings: Any) -> HookSettings:
    return HookSettings(name=name, endpoint=ENDPOINT, **settings)


ANNOTATE = plugin("50-annotate")
PLUGINS: list[tuple[HookSettings, Hook]] = [
    (ANNOTATE, AnnotateHook({"key": "example.com/annotated", "value": "by-plugin"})),
    (plugin("55-secret", allow=("env", "annotation")), Secret()),
    (plugin("60-flaky", failure_policy="ignore", breaker_threshold=2), Flaky()),
    (plugin("65-slow", failure_policy="ignore", timeout_ms=20), Slow()),
    (plugin("70-guard"), Guard()),
    (plugin("75-greedy", failure_policy="ignore"), Greedy()),
]


def pod(name: str, namespace: str = "default") -> PodSpec:
    uid = f"00000000-0000-4000-8000-{name:0>12}"
    return PodSpec(name, namespace=namespace, uid=uid, containers=[ContainerSpec("app")])


def sandbox_of(outcome: Outcome) -> str:
    assert outcome.status is None and outcome.response is not None, outcome.status
    return str(api_pb2.RunPodSandboxResponse.FromString(outcome.response).pod_sandbox_id)


async def record(workdir: Path) -> Path:
    """Three pods (the flaky plugin's breaker opens at the second), one refused by the guard;
    then the drop-ins change: the annotate plugin alone, for a fourth pod."""
    node = await RecordingNode(workdir, CONFIG, PLUGINS).start()
    for name in ("web-0", "web-1", "web-2"):
        spec = pod(name)
        outcome = await node.create(spec, sandbox_of(await node.run_pod(spec)), spec.containers[0])
        assert outcome.status is None, outcome.status
    assert (await node.run_pod(pod("x", "forbidden"))).status is not None
    node.set_plugins(PLUGINS[:1])
    spec = pod("web-3")
    await node.create(spec, sandbox_of(await node.run_pod(spec)), spec.containers[0])
    return await node.close(workdir / "rec.jsonl")


def calls(path: Path) -> list[CallEntry]:
    recording = read_recording(path)
    return [e for s in recording.segments for e in s.entries if isinstance(e, CallEntry)]


def verdicts(entry: CallEntry) -> dict[str, str]:
    return {h["hook"]: h["verdict"] for h in entry.doc["hooks"] if h["stage"] == "pre"}


async def test_the_recording_notes_the_plugins_and_what_they_answered(tmp_path: Path) -> None:
    path = await record(tmp_path)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [p["name"] for p in lines[0]["plugins"]] == [p.name for p, _ in PLUGINS]
    assert lines[0]["plugins"][2] == {
        "name": "60-flaky",
        "endpoint": ENDPOINT,
        "failure_policy": "ignore",
        "breaker_threshold": 2,
    }
    (changed,) = [line for line in lines if line["kind"] == "plugins"]
    assert changed["plugins"] == [{"name": "50-annotate", "endpoint": ENDPOINT}]
    creates = [c for c in calls(path) if c.event is Event.CREATE_CONTAINER]
    assert [verdicts(c)["60-flaky"] for c in creates[:3]] == ["ignored"] * 3
    assert "circuit open" in creates[2].doc["hooks"][3]["detail"]  # the third: skipped
    assert verdicts(creates[0])["65-slow"] == "ignored"
    greedy = next(h for h in creates[0].doc["hooks"] if h["hook"] == "75-greedy")
    assert greedy["answer"] == {  # what the chain refused is kept
        "set": {"device '/dev/kvm'": {"container_path": "/dev/kvm", "host_path": "/dev/kvm",
                                      "permissions": "rwm"}}
    }  # fmt: skip
    secret = next(h for h in creates[0].doc["hooks"] if h["hook"] == "55-secret")
    assert secret["answer"]["set"]["env 'TOKEN'"] == "<redacted>"
    assert "s3cr3t" not in path.read_text()


async def test_plugins_round_trip_replays_clean(tmp_path: Path) -> None:
    path = await record(tmp_path)

    report = await replay(read_recording(path))

    assert [(r.entry.line, r.differences) for r in report.differing] == []
    assert report.warnings == []
    assert all(r.notes == [] for r in report.results)
    # The replay ran the plugins' answers through the chain: the same verdicts, in order.
    for result in report.results:
        if isinstance(result.entry, CallEntry):
            assert result.updated is not None
            replayed = [(h["hook"], h["verdict"]) for h in result.updated["hooks"]]
            assert replayed == [(h["hook"], h["verdict"]) for h in result.entry.doc["hooks"]]


async def test_a_rotated_file_replays_a_breaker_that_was_open_when_it_began(
    tmp_path: Path,
) -> None:
    """The flaky plugin's breaker opens at the second pod; the file rotates; the third pod's
    call, skipped by the open breaker, starts the new part. Its replay starts from the
    snapshot's breakers: skipped again, not called (and unavailable)."""
    node = await RecordingNode(tmp_path, CONFIG, PLUGINS[2:3]).start()
    for name in ("web-0", "web-1", "web-2"):
        if name == "web-2":
            node.rotate()
        spec = pod(name)
        await node.create(spec, sandbox_of(await node.run_pod(spec)), spec.containers[0])
    path = await node.close(tmp_path / "rec.jsonl")
    recording = read_recording(path)
    snapshot = recording.segments[1].entries[0]
    assert isinstance(snapshot, SyncEntry) and snapshot.breakers is not None
    (flaky,) = snapshot.breakers.values()
    assert flaky.failures == 2 and flaky.open_until is not None
    assert flaky.open_until > snapshot.doc["time"]  # open for the breaker's reset time
    skipped = calls(path)[-1]
    assert "': skipped: 2 consecutive failures" in _flaky(skipped.doc)["detail"]

    report = await replay(recording)

    assert [(r.entry.line, r.differences) for r in report.differing] == []
    replayed = report.results[-1].updated
    assert replayed is not None
    assert _flaky(replayed) == {**_flaky(skipped.doc), "ms": _flaky(replayed)["ms"]}


async def test_a_snapshot_without_breakers_leaves_them_closed(tmp_path: Path) -> None:
    """A recording made before snapshots carried breakers replays as it did: the breaker
    starts closed, so the skipped call is replayed as a call to the plugin that failed
    (the same verdict and request; only the detail tells)."""
    node = await RecordingNode(tmp_path, CONFIG, PLUGINS[2:3]).start()
    for name in ("web-0", "web-1", "web-2"):
        if name == "web-2":
            node.rotate()
            del node.lines[-1]["breakers"]
        spec = pod(name)
        await node.create(spec, sandbox_of(await node.run_pod(spec)), spec.containers[0])
    recording = read_recording(await node.close(tmp_path / "rec.jsonl"))
    snapshot = recording.segments[1].entries[0]
    assert isinstance(snapshot, SyncEntry) and snapshot.breakers is None

    report = await replay(recording)

    assert report.differing == []
    replayed = report.results[-1].updated
    assert replayed is not None
    assert _flaky(replayed)["verdict"] == "ignored"
    assert "': unavailable: skipped: 2 consecutive" in _flaky(replayed)["detail"]


def _flaky(call: dict[str, Any]) -> dict[str, Any]:
    """The flaky plugin's pre stage in a call line's hooks."""
    return next(h for h in call["hooks"] if h["hook"] == "60-flaky" and h["stage"] == "pre")


async def test_a_changed_plugin_answer_is_a_difference_naming_call_and_field(
    tmp_path: Path,
) -> None:
    path = await record(tmp_path)
    lines = path.read_text().splitlines()
    create = next(c for c in calls(path) if c.event is Event.CREATE_CONTAINER)
    doc = json.loads(lines[create.line - 1])
    annotate = next(h for h in doc["hooks"] if h["hook"] == "50-annotate")
    annotate["answer"]["set"]["annotation 'example.com/annotated'"] = "changed"
    lines[create.line - 1] = json.dumps(doc)
    path.write_text("\n".join(lines) + "\n")
    out = io.StringIO()

    code = await asyncio.to_thread(replay_command, path, None, None, False, out, ())

    assert code == 1, out.getvalue()
    text = out.getvalue()
    heading = f"line {create.line} (seq {create.seq}): CreateContainer, pod default/web-0, "
    assert heading + "container app\n" in text
    assert (
        '  forwarded config.annotations.example.com/annotated: recorded "by-plugin", '
        'replayed "changed"\n'
    ) in text
    assert text.rstrip().endswith("1 differ")


def dropins(directory: Path, *plugins: HookSettings) -> Settings:
    """A configuration whose plugins_dir holds these drop-ins."""
    directory.mkdir()
    for p in plugins:
        lines = [f'name = "{p.name}"', f'endpoint = "{p.endpoint}"']
        lines += [f'failure_policy = "{p.failure_policy}"', f"timeout_ms = {p.timeout_ms}"]
        lines += [f"breaker_threshold = {p.breaker_threshold}"]
        if p.allow is not None:
            lines.append(f"allow = {json.dumps(list(p.allow))}")
        (directory / f"{p.base_name}.toml").write_text("\n".join(lines) + "\n")
    return settings_from_toml({**CONFIG, "plugins_dir": str(directory)})


async def test_config_drop_ins_remove_and_move_plugins(tmp_path: Path) -> None:
    path = await record(tmp_path)
    kept = [p for p, _ in PLUGINS if p.base_name in ("secret", "flaky", "slow", "guard")]
    moved = plugin("05-greedy", failure_policy="ignore")
    config = dropins(tmp_path / "hooks.d", *kept, moved)

    report = await replay(read_recording(path), config)

    assert any("plugin annotate of the recording is not in" in w for w in report.warnings)
    first = next(r for r in report.results if getattr(r.entry, "label", "").startswith("Create"))
    # annotate is left out: its annotation is not forwarded any more; the others' are.
    assert [(d.what, d.field, d.recorded, d.replayed) for d in first.differences] == [
        ("forwarded", "config.annotations.example.com/annotated", "by-plugin", ABSENT)
    ]
    # greedy moved to the front of the chain.
    assert first.updated is not None
    assert [h["hook"] for h in first.updated["hooks"]][:2] == ["05-greedy", "40-oom"]


async def test_a_plugin_whose_policy_changed_fails_the_call_now(tmp_path: Path) -> None:
    path = await record(tmp_path)
    others = [p for p, _ in PLUGINS if p.base_name != "flaky"]
    stricter = plugin("60-flaky", failure_policy="fail", breaker_threshold=2)
    config = dropins(tmp_path / "hooks.d", *others, stricter)

    report = await replay(read_recording(path), config)

    first = next(r for r in report.results if getattr(r.entry, "label", "").startswith("Create"))
    assert [d.what for d in first.differences] == ["status", "forwarded"]
    assert first.differences[0].replayed == (
        "INTERNAL: crihook: hook '60-flaky': pre_create_container raised RuntimeError: "
        "plugin failed: disk on fire (pod default/web-0, container app)"
    )


async def test_update_with_config_drop_ins_writes_them_into_the_recording(
    tmp_path: Path,
) -> None:
    path = await record(tmp_path)
    config = dropins(tmp_path / "hooks.d", plugin("10-annotate"))
    report = await replay(read_recording(path), config)
    assert report.differing

    write_updated(report, config, None)

    again = await replay(read_recording(path))  # the recorded plugins are the drop-ins now
    assert again.differing == []
    headers = [json.loads(line) for line in path.read_text().splitlines()[:1]]
    assert headers[0]["plugins"] == [{"name": "10-annotate", "endpoint": ENDPOINT}]


async def test_a_missing_plugins_dir_replays_the_recorded_plugins(tmp_path: Path) -> None:
    path = await record(tmp_path)
    config = settings_from_toml({**CONFIG, "plugins_dir": str(tmp_path / "nowhere")})

    report = await replay(read_recording(path), config)

    assert report.differing == []
    assert report.warnings == [
        f"--config's plugins_dir {tmp_path / 'nowhere'} is not here: the recorded plugins "
        "are replayed"
    ]


# --- recorded failures and refusals, raised again ------------------------------------------


@pytest.mark.parametrize(
    ("detail", "kind", "message"),
    [
        ("hook '50-p': no answer to pre-CreateContainer within 20 ms (failure_policy=ignore)",
         TimeoutError, "no answer to pre-CreateContainer within 20 ms"),
        ("hook '50-p': unavailable: plugin not connected: connection refused",
         ConnectionError, "plugin not connected: connection refused"),
        ("hook '50-p': pre_create_container raised RuntimeError: plugin failed: x",
         RuntimeError, "plugin failed: x"),
        ("hook '50-p': pre_create_container raised ValueError: plugin returned an invalid "
         "adjustment: y", ValueError, "plugin returned an invalid adjustment: y"),
        ("hook '50-p' is required by the configuration ([hooks] required_hooks), and did not "
         "run: hook '50-p': unavailable: plugin connection lost: z",
         ConnectionError, "plugin connection lost: z"),
        ("hook '50-p': something else entirely", None, ""),
    ],
    ids=["timeout", "unavailable", "failed", "invalid", "required", "unknown"],
)  # fmt: skip
def test_a_recorded_failure_is_raised_again(
    detail: str, kind: type[BaseException] | None, message: str
) -> None:
    failure = failure_of(detail, Event.CREATE_CONTAINER, Stage.PRE)
    if kind is None:
        assert failure is None
        return
    assert type(failure) is kind
    assert str(failure) == message


@pytest.mark.parametrize(
    ("detail", "kind", "reason"),
    [
        ("hook '50-p': rejected RunPodSandbox: no room", Reject, "no room"),
        ("hook '50-p': RunPodSandbox not allowed: namespace x", Forbidden, "namespace x"),
        ("hook '50-p': RunPodSandbox: bad annotation", InvalidRequest, "bad annotation"),
    ],
    ids=["reject", "forbidden", "invalid"],
)
def test_a_recorded_refusal_is_raised_again(detail: str, kind: type[Reject], reason: str) -> None:
    refusal = refusal_of(detail, Event.RUN_POD_SANDBOX)
    assert type(refusal) is kind
    assert refusal.reason == reason
