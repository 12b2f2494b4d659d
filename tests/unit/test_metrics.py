"""The pure parts of metrics and the call log: histogram buckets, method labels, what an
outcome counts, and the call line's fields."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from prometheus_client.exposition import generate_latest

from crihook.hooks.spec import (
    Adjustment,
    ContainerView,
    Event,
    Hook,
    HookContext,
    PodView,
    ResourceDelta,
    Stage,
)
from crihook.proxy.chain.chain import Chain
from crihook.proxy.chain.local_hooks import LocalHook
from crihook.proxy.config import ChainSettings, HookSettings
from crihook.proxy.core.updates import WINDOW_BUCKETS
from crihook.proxy.cri.outcome import Outcome, Status
from crihook.proxy.cri.readiness import Readiness
from crihook.proxy.ops.call_log import call_fields
from crihook.proxy.ops.metrics import Histogram, Metrics, Sources, _histogram, method_label
from crihook.proxy.state.store import Store
from tests.lab.metrics_scrape import parse, value


@pytest.mark.parametrize(
    ("observed", "counts"),
    [
        (0.0, [1, 0, 0, 0]),
        (0.1, [1, 0, 0, 0]),  # on a bound: that bucket (le)
        (0.10001, [0, 1, 0, 0]),
        (1.0, [0, 1, 0, 0]),
        (5.0, [0, 0, 1, 0]),
        (99.0, [0, 0, 0, 1]),
    ],
    ids=["zero", "on-bound", "just-above", "second-bound", "last-bound", "inf"],
)
def test_histogram_bucket(observed: float, counts: list[int]) -> None:
    histogram = Histogram((0.1, 1.0, 5.0))
    histogram.observe(observed)
    assert histogram.counts == counts
    family = _histogram("h", "h", ("k",), (0.1, 1.0, 5.0), {("v",): (tuple(counts), observed)})
    buckets = [(s.labels["le"], s.value) for s in family.samples if s.name == "h_bucket"]
    assert buckets == [
        (le, float(sum(counts[: i + 1]))) for i, le in enumerate(("0.1", "1.0", "5.0", "+Inf"))
    ]


@pytest.mark.parametrize(
    ("path", "label"),
    [
        ("/runtime.v1.RuntimeService/ListContainers", "ListContainers"),
        ("/runtime.v1.ImageService/PullImage", "PullImage"),
        ("/runtime.v1.RuntimeService/MadeUpByAClient", "other"),
        ("/x.y/ListContainers/../../etc", "other"),
    ],
    ids=["runtime", "image", "unknown", "garbage"],
)
def test_method_label_is_a_known_method_or_other(path: str, label: str) -> None:
    assert method_label(path) == label


POD = PodView(id="p" * 64, uid="u1", name="web", namespace="default")
CONTAINER = ContainerView(id="c" * 64, pod_id="p" * 64, name="app")


def _outcome(trace: list[tuple[object, ...]], status: Status | None = None) -> Outcome:
    outcome = Outcome(Event.CREATE_CONTAINER, b"x", None)
    outcome.pod, outcome.container = POD, CONTAINER
    outcome.trace = list(trace)
    outcome.elapsed = 0.004
    outcome.forwarded = b"y"  # changed
    if status is not None:
        outcome.fail("runtime", status)
    return outcome


def _metrics(tmp_path: Path) -> Metrics:
    chain = Chain(ChainSettings(), lambda name: None)  # type: ignore[arg-type,return-value]
    sources = Sources(
        chain, Store(tmp_path), Readiness(), lambda: 3, lambda: 0, lambda: {"owner": 2}
    )
    return Metrics(sources)


def test_an_outcome_counts_the_call_and_each_hook_run(tmp_path: Path) -> None:
    adjustment = (
        Adjustment()
        .set_env("A", "1")
        .set_env("B", "2")
        .set_annotation("x", "y")
        .update_container("d" * 64, ResourceDelta(cpuset_cpus="0-1"))
    )
    metrics = _metrics(tmp_path)
    metrics.outcome(
        _outcome(
            [
                ("10-a", Stage.PRE, "adjusted", "", adjustment, 0.0002),
                ("10-a", Stage.POST, "nothing", "", None, 0.00001),
                ("20-b", Stage.PRE, "dry-run", "", Adjustment().set_label("k", "v"), 0.001),
            ]
        )
    )
    metrics.outcome(_outcome([], Status(grpc.StatusCode.NOT_FOUND, "gone")))
    samples = parse(generate_latest(_Families(metrics)).decode())
    call = {"method": "CreateContainer", "path": "intercepted"}
    assert value(samples, "crihook_cri_calls_total", **call) == 2
    assert value(samples, "crihook_cri_call_duration_seconds_count", **call) == 2
    assert value(samples, "crihook_cri_call_duration_seconds_sum", **call) == pytest.approx(0.008)
    assert value(samples, "crihook_cri_errors_total", code="NOT_FOUND", origin="runtime", **call)
    runs = "crihook_hook_runs_total"
    assert value(samples, runs, hook="10-a", stage="pre", verdict="adjusted") == 1
    assert value(samples, runs, hook="10-a", stage="post", verdict="nothing") == 1
    assert value(samples, runs, hook="20-b", stage="pre", verdict="dry-run") == 1
    adjusted = "crihook_hook_adjustments_total"
    # Once per field an adjustment sets (two env variables: one env), updates by count.
    assert value(samples, adjusted, hook="10-a", field="env") == 1
    assert value(samples, adjusted, hook="10-a", field="annotation") == 1
    assert value(samples, adjusted, hook="10-a", field="container_update") == 1
    assert value(samples, adjusted, hook="20-b", field="label") == 0  # dry-run: not applied
    assert value(samples, "crihook_hook_duration_seconds_count", hook="10-a", stage="pre") == 1
    assert value(samples, "crihook_container_update_failures_total") == 3
    assert value(samples, "crihook_ready") == 0
    refused = "crihook_plugin_dropins_refused_total"
    assert value(samples, refused, reason="owner") == 2
    assert value(samples, refused, reason="directory") == 0  # every reason, 0 until it happens


def test_fields_changed_after_crihook_are_counted_by_field(tmp_path: Path) -> None:
    """proxy.core.readback's counts, read when scraped."""
    chain = Chain(ChainSettings(), lambda name: None)  # type: ignore[arg-type,return-value]
    counts = {"env": 2, "cpuset_cpus": 1}
    metrics = Metrics(
        Sources(
            chain, Store(tmp_path), Readiness(), lambda: 0, lambda: 0, changed_after=lambda: counts
        )
    )
    samples = parse(generate_latest(_Families(metrics)).decode())
    name = "crihook_fields_changed_after_crihook_total"
    assert value(samples, name, field="env") == 2
    assert value(samples, name, field="cpuset_cpus") == 1
    counts["env"] += 1  # read when scraped, not when built
    samples = parse(generate_latest(_Families(metrics)).decode())
    assert value(samples, name, field="env") == 3


def test_the_update_window_is_a_histogram_read_when_scraped(tmp_path: Path) -> None:
    """proxy.core.updates' window: from a container due new resources until they were applied."""
    chain = Chain(ChainSettings(), lambda name: None)  # type: ignore[arg-type,return-value]
    window = Histogram(WINDOW_BUCKETS)
    metrics = Metrics(
        Sources(
            chain, Store(tmp_path), Readiness(), lambda: 0, lambda: 0, update_window=lambda: window
        )
    )
    window.observe(0.004)
    window.observe(0.3)
    samples = parse(generate_latest(_Families(metrics)).decode())
    name = "crihook_container_update_window_seconds"
    assert value(samples, f"{name}_count") == 2
    assert value(samples, f"{name}_bucket", le="0.005") == 1
    assert value(samples, f"{name}_bucket", le="0.5") == 2
    assert value(samples, f"{name}_sum") == pytest.approx(0.304)


class _FailingBeside(Hook):
    """Counts work of its own that failed beside the calls (as koordinator's pod cgroups)."""

    def __init__(self) -> None:
        self.failed = {"pod_cgroup": 0, "other": 0}

    def failures(self) -> dict[str, int]:
        return dict(self.failed)

    async def post_run_pod_sandbox(self, ctx: HookContext) -> None:
        return None


def test_a_hooks_own_failures_are_exported_by_what(tmp_path: Path) -> None:
    metrics = _metrics(tmp_path)
    hook = _FailingBeside()
    entry = Chain.entry(LocalHook("30-koord", hook), HookSettings(name="30-koord"))
    metrics.sources.chain.set_builtin([entry])
    hook.failed["pod_cgroup"] = 2
    samples = parse(generate_latest(_Families(metrics)).decode())
    failures = "crihook_hook_failures_total"
    assert value(samples, failures, hook="30-koord", what="pod_cgroup") == 2
    assert value(samples, failures, hook="30-koord", what="other") == 0
    assert metrics.sources.chain.status()[0]["failures"] == {"pod_cgroup": 2, "other": 0}


def test_each_hooks_timeout_and_the_stores_health_are_exported(tmp_path: Path) -> None:
    """What the alerts compare with: a hook's timeout (its p99 over half of it), and the
    store's writes failing."""
    metrics = _metrics(tmp_path)
    entry = Chain.entry(
        LocalHook("30-koord", _FailingBeside()), HookSettings(name="30-koord", timeout_ms=250)
    )
    metrics.sources.chain.set_builtin([entry])
    samples = parse(generate_latest(_Families(metrics)).decode())
    assert value(samples, "crihook_hook_timeout_seconds", hook="30-koord") == 0.25
    assert value(samples, "crihook_store_degraded") == 0
    assert value(samples, "crihook_store_write_failures_total") == 0
    store = metrics.sources.store
    store.degraded, store.write_failures = "disk full", 3
    samples = parse(generate_latest(_Families(metrics)).decode())
    assert value(samples, "crihook_store_degraded") == 1
    assert value(samples, "crihook_store_write_failures_total") == 3


class _Families:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> object:
        return self.metrics.collect()


@pytest.mark.parametrize(
    ("status", "origin", "message", "outcome"),
    [
        (None, "", "CreateContainer ok (adjusted)", "adjusted"),
        (
            Status(grpc.StatusCode.NOT_FOUND, "x"),
            "runtime",
            "CreateContainer failed in the runtime: NOT_FOUND",
            "NOT_FOUND",
        ),
        (
            Status(grpc.StatusCode.CANCELLED, "x"),
            "kubelet",
            "CreateContainer cancelled by kubelet",
            "CANCELLED",
        ),
        (
            Status(grpc.StatusCode.FAILED_PRECONDITION, "x"),
            "crihook",
            "CreateContainer refused by crihook: FAILED_PRECONDITION",
            "FAILED_PRECONDITION",
        ),
    ],
    ids=["ok", "runtime", "kubelet", "crihook"],
)
def test_call_line(status: Status | None, origin: str, message: str, outcome: str) -> None:
    ended = _outcome([("10-a", Stage.PRE, "adjusted", "", Adjustment(), 0.001)])
    if status is not None:
        ended.fail(origin, status)
    if origin in ("", "runtime"):  # the runtime answered, or failed it
        ended.runtime_elapsed = 0.0035
    text, fields = call_fields(ended)
    assert text == message
    assert fields["pod"] == "default/web" and fields["container"] == "app"
    assert fields["hooks"] == "10-a/pre:adjusted"
    assert fields["outcome"] == outcome
    assert fields["elapsed_ms"] == 4.0
    # the runtime's part, only where the call reached it
    assert fields.get("runtime_ms") == (3.5 if origin in ("", "runtime") else None)
    assert fields.get("origin", "") == origin


def test_adjustment_repr_shows_env_names_not_values() -> None:
    adjustment = Adjustment().set_env("TOKEN", "hunter2").remove_env("OLD").set_label("a", "b")
    assert repr(adjustment) == "Adjustment(env 'TOKEN'=<redacted>, env 'OLD'=REMOVE, label 'a'='b')"
