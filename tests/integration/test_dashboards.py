"""deploy/crihook-dashboard.json and deploy/crihook-alerts.yaml against a real crihook: every
metric, label and label value the dashboard's panels and the alert rules select, group or
print exists in what a running crihook serves at /metrics (with its resource and device hooks
at work, and once with its runtime gone, which the runtime alert is about). Grafana and
Prometheus are not on these machines; promtool is not built here (its cold build from the Go
module proxy takes far longer than the test bed's budget allows, docs/install.md), so the
files' structure is checked here too.
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from crihook.api.cri.v1 import api_pb2
from tests.integration.test_resource_hooks_fixtures import Node
from tests.lab.crihook_proc import short_tmpdir
from tests.lab.fixture_machine import crihook_on_fixture
from tests.lab.kubelet_encoding import ContainerSpec, PodSpec
from tests.lab.metrics_scrape import Samples, scrape, value
from tests.lab.promql import Expression, PromQLError, read, template_labels
from tests.lab.sysfs import DUAL_SOCKET_SMT2_2NUMA, GIB

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "crihook-alerts.yaml"
DASHBOARD = REPO / "deploy" / "crihook-dashboard.json"
SCRAPE_LABELS = frozenset({"job", "instance"})
"""Labels Prometheus adds to every series it scrapes."""
PROMETHEUS_METRICS = frozenset({"up"})
"""Series Prometheus makes itself for every target."""
DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")


@dataclass(frozen=True)
class Use:
    """One expression in one of the files, and the labels its text prints."""

    where: str
    expr: str
    prints: frozenset[str] = frozenset()


# --- what the files use ------------------------------------------------------------------------


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def rule_uses() -> list[Use]:
    uses = []
    for rule in rules():
        texts = " ".join(str(v) for v in rule.get("annotations", {}).values())
        uses.append(Use(f"alert {rule['alert']}", rule["expr"], frozenset(template_labels(texts))))
    return uses


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def panels(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in doc["panels"]:
        yield panel
        yield from panel.get("panels", [])


def dashboard_uses() -> list[Use]:
    doc = dashboard()
    uses = []
    for panel in panels(doc):
        for target in panel.get("targets", []):
            legend = frozenset(template_labels(target.get("legendFormat", "")))
            uses.append(Use(f"panel {panel['title']!r} {target['refId']}", target["expr"], legend))
    for variable in doc["templating"]["list"]:
        if variable["type"] != "query":
            continue
        # Grafana's label_values(SELECTOR, LABEL): the selector, and the label on it.
        query = variable["query"]["query"]
        m = re.fullmatch(r"label_values\((.+), *([a-zA-Z_]+)\)", query)
        assert m, f"variable {variable['name']}: {query}"
        uses.append(Use(f"variable {variable['name']}", m[1], frozenset({m[2]})))
    return uses


# --- what a running crihook serves --------------------------------------------------------------


@dataclass(frozen=True)
class Served:
    """Sample name → the labels it has, and the values each label takes."""

    labels: dict[str, set[str]]
    values: dict[tuple[str, str], set[str]]
    samples: Samples

    @classmethod
    def of(cls, *scrapes: Samples) -> Served:
        labels: dict[str, set[str]] = defaultdict(set)
        values: dict[tuple[str, str], set[str]] = defaultdict(set)
        merged: Samples = {}
        for samples in scrapes:
            merged |= samples
            for name, pairs in samples:
                labels[name] |= {k for k, _ in pairs}
                for k, v in pairs:
                    values[(name, k)].add(v)
        return cls(dict(labels), dict(values), merged)


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    """A crihook with cpuset, numa, oom and devices (a device pool) on a fixture machine,
    serving metrics; pods made through it, then its runtime gone and one more call."""
    workdir = short_tmpdir("db-")
    dev = workdir / "dev"
    dev.mkdir()
    os.mknod(dev / "gpu0", 0o666 | 0o020000, os.makedev(1, 7))  # S_IFCHR, /dev/full's
    config = (
        '[hooks.cpuset]\nreserved_cpus = "0"\n[hooks.devices]\nnamespaces = ["default"]\n'
        f'[hooks.devices.pools.gpu]\ndevices = [{{ id = "0", path = "{dev}/gpu0", numa = 0 }}]\n'
    )
    address = f"unix://{workdir}/metrics.sock"
    with crihook_on_fixture(
        workdir,
        DUAL_SOCKET_SMT2_2NUMA,
        config=config,
        hooks="cpuset,numa,oom,devices",
        args=["--metrics-listen", address],
    ) as m:
        node = Node(m.topology, m.runtime, m.proc, m.stub)
        node.pod("web", None)
        app = ContainerSpec("app", cpu_request=2000, cpu_limit=2000,
                            memory_request=GIB, memory_limit=GIB)  # fmt: skip
        spec = PodSpec(
            name="gpu",
            containers=[app],
            annotations={"pools.crihook.io/container.app": '{"gpu": 1}'},
        )
        node.create(spec, node.run_pod(spec), app)
        working = scrape(address)
        m.runtime.stop()  # containerd gone: kubelet's next calls fail
        with pytest.raises(grpc.RpcError) as failed:
            m.stub.ListContainers(api_pb2.ListContainersRequest(), timeout=10)
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        yield Served.of(working, scrape(address))


def problems(use: Use, served: Served) -> list[str]:
    """What `use` names that `served` does not have."""
    try:
        expr: Expression = read(use.expr)
    except PromQLError as exc:
        return [f"{use.where}: {exc}"]
    found = []
    known: set[str] = set(SCRAPE_LABELS)
    for selector in expr.selectors:
        if selector.metric in PROMETHEUS_METRICS:
            labels: set[str] = set()
        elif selector.metric not in served.labels:
            found.append(f"{use.where}: no metric {selector.metric}")
            continue
        else:
            labels = served.labels[selector.metric]
        known |= labels
        for matcher in selector.matchers:
            if matcher.label in SCRAPE_LABELS:
                continue
            if matcher.label not in labels:
                found.append(f"{use.where}: {selector.metric} has no label {matcher.label}")
            elif matcher.op in ("=", "!=") and matcher.value not in served.values.get(
                (selector.metric, matcher.label), set()
            ):
                found.append(
                    f"{use.where}: {selector.metric} never has {matcher.label}={matcher.value!r}"
                )
    for keyword, names in expr.grouping:
        found += [f"{use.where}: {keyword} ({n}): no such label" for n in names if n not in known]
    by = {n for keyword, names in expr.grouping if keyword == "by" for n in names}
    printable = by if by else known  # aggregated by: only those labels are left
    found += [f"{use.where}: prints {n}, which it has not" for n in use.prints - printable]
    return found


def test_every_metric_label_and_value_the_alert_rules_use_is_served(served: Served) -> None:
    uses = rule_uses()
    assert len(uses) == 6
    assert [p for use in uses for p in problems(use, served)] == []


def test_every_metric_label_and_value_the_dashboard_uses_is_served(served: Served) -> None:
    uses = dashboard_uses()
    assert len(uses) > 30
    assert [p for use in uses for p in problems(use, served)] == []


def test_the_runtime_alert_sees_a_runtime_that_is_gone(served: Served) -> None:
    errors = value(
        served.samples,
        "crihook_cri_errors_total",
        method="ListContainers",
        path="passthrough",
        code="UNAVAILABLE",
        origin="runtime",
    )
    assert errors == 1


@pytest.mark.parametrize(
    ("use", "problem"),
    [
        (Use("typo", "rate(crihook_cri_call_total[5m])"), "no metric crihook_cri_call_total"),
        (Use("label", 'crihook_hook_runs_total{verdikt="x"}'), "has no label verdikt"),
        (Use("value", 'crihook_hook_breaker_state{state="opened"}'), "never has state='opened'"),
        (Use("by", "sum by (pod) (crihook_cri_calls_total)"), "by (pod): no such label"),
        (
            Use("legend", "sum by (method) (crihook_cri_calls_total)", frozenset({"path"})),
            "prints path",
        ),
        (Use("func", "rated(crihook_cri_calls_total[5m])"), "unknown function 'rated'"),
    ],
    ids=["metric", "label", "value", "by", "printed", "function"],
)
def test_the_check_finds_what_is_not_served(served: Served, use: Use, problem: str) -> None:
    found = problems(use, served)
    assert len(found) == 1 and problem in found[0], found


# --- the files' structure ----------------------------------------------------------------------


def test_the_alert_rules_are_prometheus_rule_files() -> None:
    doc = yaml.safe_load(RULES.read_text())
    assert set(doc) == {"groups"}
    names = [g["name"] for g in doc["groups"]]
    assert len(names) == len(set(names))
    alerts = []
    for group in doc["groups"]:
        assert set(group) <= {"name", "interval", "rules", "limit"}, group.keys()
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
            assert re.fullmatch(r"Crihook[A-Z][A-Za-z]+", rule["alert"]), rule["alert"]
            assert isinstance(rule["expr"], str) and rule["expr"].strip()
            if "for" in rule:
                assert DURATION.match(rule["for"]), rule["for"]
            assert rule["labels"]["severity"] in ("critical", "warning")
            assert set(rule["annotations"]) == {"summary", "description"}
            alerts.append(rule["alert"])
    assert len(alerts) == len(set(alerts))
    assert set(alerts) == {
        "CrihookDown",
        "CrihookRuntimeUnavailable",
        "CrihookHookBreakerOpen",
        "CrihookContainerUpdateFailures",
        "CrihookStoreDegraded",
        "CrihookHookSlow",
    }


def test_the_dashboard_is_a_grafana_dashboard() -> None:
    doc = dashboard()
    assert doc["uid"] and doc["title"] and doc["schemaVersion"] >= 36
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = []
    used_variables: set[str] = set()
    for panel in panels(doc):
        ids.append(panel["id"])
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["w"] > 0 and grid["h"] > 0, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]
            used_variables |= set(re.findall(r"\$([a-z]+)\b", target["expr"]))
    assert len(ids) == len(set(ids))
    assert used_variables - {"__rate_interval"} <= set(variables)
    titles = " ".join(p["title"] for p in panels(doc)).lower()
    for subject in (
        "calls",
        "errors",
        "latency",
        "verdicts",
        "breakers",
        "pool",
        "store",
        "update",
    ):
        assert subject in titles, subject
