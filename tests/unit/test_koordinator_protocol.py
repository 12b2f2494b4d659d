"""Koordinator's pod signals and batch arithmetic, table by table.

The examples are Koordinator's own: the annotation values of its docs and proposals
(`docs/proposals/scheduling/20220530-fine-grained-cpu-orchestration.md`: resource-status
`{"cpuset": "0-3"}`; the issue's `{"cpuset":"2,54"}`), the extended resource spec of its
`apis/extension` tests and webhook (batch-cpu "500"/"1000" milli-cores, batch-memory "1Gi",
"2Gi", "4Gi"), and the QoS table of its architecture docs (koordinator.sh/docs/architecture/qos)
with `GetPodQoSClassWithKubeQoS` for the fallback.
"""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Any

import pytest

from crihook.hooks.cpus.koordinator import (
    KoordinatorQoS,
    ScheduledResources,
    member_pool,
    parse_resource_status,
    raw_qos,
    scheduled_resources,
    shuns_exclusive_cpus,
)
from crihook.hooks.koordinator.batch import BatchResources, container_resources, pod_resources
from crihook.hooks.koordinator.options import (
    KoordinatorOptions,
    cpuset_options,
    parse_options,
)
from crihook.hooks.koordinator.protocol import (
    BatchSpec,
    ContainerBatch,
    batch_spec,
    is_batch,
    parse_extended_resource_spec,
    qos_class,
    skipped,
)
from crihook.hooks.koordinator.quantity import ceil_milli, ceil_value, parse_quantity
from crihook.hooks.spec import Adjustment, Field, PodView, QoSClass

GUARANTEED = QoSClass.GUARANTEED
BURSTABLE = QoSClass.BURSTABLE
BESTEFFORT = QoSClass.BEST_EFFORT
GI = 1 << 30


def pod(
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    qos: QoSClass = BURSTABLE,
) -> PodView:
    return PodView(
        id="p",
        uid="u",
        name="web",
        namespace="default",
        labels=labels or {},
        annotations=annotations or {},
        qos_class=qos,
    )


# --- QoS classes ------------------------------------------------------------------------------

QOS_CASES = [
    # (label value or None, Kubernetes QoS, class, raw class)
    pytest.param("LSE", GUARANTEED, KoordinatorQoS.LSE, KoordinatorQoS.LSE, id="LSE"),
    pytest.param("LSR", GUARANTEED, KoordinatorQoS.LSR, KoordinatorQoS.LSR, id="LSR"),
    pytest.param("LS", GUARANTEED, KoordinatorQoS.LS, KoordinatorQoS.LS, id="LS-guaranteed"),
    pytest.param("LS", BURSTABLE, KoordinatorQoS.LS, KoordinatorQoS.LS, id="LS-burstable"),
    pytest.param("BE", BESTEFFORT, KoordinatorQoS.BE, KoordinatorQoS.BE, id="BE"),
    pytest.param("SYSTEM", BURSTABLE, KoordinatorQoS.SYSTEM, KoordinatorQoS.SYSTEM, id="SYSTEM"),
    pytest.param(None, GUARANTEED, KoordinatorQoS.LSR, None, id="no-label-guaranteed-is-LSR"),
    pytest.param(None, BURSTABLE, KoordinatorQoS.LS, None, id="no-label-burstable-is-LS"),
    pytest.param(None, BESTEFFORT, KoordinatorQoS.BE, None, id="no-label-besteffort-is-BE"),
    pytest.param("Gold", BURSTABLE, KoordinatorQoS.LS, None, id="unknown-value-falls-back"),
    pytest.param("be", BESTEFFORT, KoordinatorQoS.BE, None, id="case-matters"),
    pytest.param(None, QoSClass.UNKNOWN, None, None, id="not-kubelets-cgroup"),
]


@pytest.mark.parametrize(("label", "kube", "want", "raw"), QOS_CASES)
def test_qos_class_with_koordinators_fallback(
    label: str | None, kube: QoSClass, want: KoordinatorQoS | None, raw: KoordinatorQoS | None
) -> None:
    p = pod({"koordinator.sh/qosClass": label} if label else None, qos=kube)
    assert qos_class(p) is want
    assert raw_qos(p) is raw


@pytest.mark.parametrize(
    ("label", "kube", "pool", "shuns"),
    [
        pytest.param("LS", GUARANTEED, "shared", True, id="LS-never-exclusive"),
        pytest.param("BE", BESTEFFORT, "be", True, id="BE-on-the-BE-pool"),
        pytest.param(None, BESTEFFORT, "be", False, id="k8s-besteffort-on-the-BE-pool"),
        pytest.param(None, BURSTABLE, "shared", False, id="burstable-shared"),
        pytest.param("LSR", GUARANTEED, "shared", False, id="LSR-without-cpuset"),
        pytest.param("BE", BURSTABLE, "shared", True, id="BE-label-on-a-burstable-pod"),
    ],
)
def test_the_pool_a_pod_runs_on(label: str | None, kube: QoSClass, pool: str, shuns: bool) -> None:
    p = pod({"koordinator.sh/qosClass": label} if label else None, qos=kube)
    assert member_pool(p) == pool
    assert shuns_exclusive_cpus(p) is shuns


@pytest.mark.parametrize(
    ("labels", "skip"),
    [
        pytest.param({"runtimeproxy.koordinator.sh/skip-hookserver": "true"}, True, id="true"),
        pytest.param({"runtimeproxy.koordinator.sh/skip-hookserver": "True"}, False, id="True"),
        pytest.param({"runtimeproxy.koordinator.sh/skip-hookserver": "false"}, False, id="false"),
        pytest.param({}, False, id="absent"),
    ],
)
def test_the_skip_label_is_compared_as_koord_runtime_proxy_does(
    labels: dict[str, str], skip: bool
) -> None:
    assert skipped(pod(labels)) is skip


# --- scheduling.koordinator.sh/resource-status -------------------------------------------------

RESOURCE_STATUS = [
    pytest.param('{"cpuset": "0-3"}', ScheduledResources(frozenset({0, 1, 2, 3})), id="proposal"),
    pytest.param('{"cpuset":"2,54"}', ScheduledResources(frozenset({2, 54})), id="issue"),
    pytest.param(
        '{\n  "cpuset": "0-3"\n}', ScheduledResources(frozenset(range(4))), id="multi-line"
    ),
    pytest.param(
        '{"numaNodeResources": [{"node": 1, "resources": {"cpu": "4", "memory": "8Gi"}}]}',
        ScheduledResources(numa_nodes=frozenset({1})),
        id="ls-numa-share-pool",
    ),
    pytest.param(
        '{"cpuset": "4-7", "numaNodeResources": [{"node": 0}, {"node": 1}]}',
        ScheduledResources(frozenset({4, 5, 6, 7}), frozenset({0, 1})),
        id="both",
    ),
    pytest.param("{}", ScheduledResources(), id="empty"),
    pytest.param('{"cpuset": ""}', ScheduledResources(), id="empty-cpuset"),
]


@pytest.mark.parametrize(("text", "want"), RESOURCE_STATUS)
def test_resource_status_formats(text: str, want: ScheduledResources) -> None:
    assert parse_resource_status(text) == want


MALFORMED_STATUS = [
    pytest.param("cpuset=0-3", "not JSON", id="not-json"),
    pytest.param('["0-3"]', "JSON object", id="a-list"),
    pytest.param('{"cpuset": 3}', "cpu list string", id="cpuset-number"),
    pytest.param('{"cpuset": "3-1"}', "descending range", id="descending"),
    pytest.param('{"cpuset": "0-3,"}', "bad element", id="dangling-comma"),
    # Four billion ids built on the event loop (minutes, gigabytes): refused at once.
    pytest.param('{"cpuset": "0-4294967295"}', "beyond any cpu id", id="huge-range"),
    pytest.param('{"cpuset": "1,65536"}', "65536 is beyond any cpu id", id="huge-id"),
    pytest.param('{"numaNodeResources": {"node": 0}}', "must be a list", id="numa-object"),
    pytest.param('{"numaNodeResources": [{"resources": {}}]}', "no NUMA node", id="numa-no-node"),
]


@pytest.mark.parametrize(("text", "message"), MALFORMED_STATUS)
def test_a_malformed_resource_status_names_the_annotation(text: str, message: str) -> None:
    p = pod(annotations={"scheduling.koordinator.sh/resource-status": text})
    with pytest.raises(ValueError, match=message) as info:
        scheduled_resources(p)
    assert "annotation scheduling.koordinator.sh/resource-status" in str(info.value)


def test_a_pod_without_resource_status_has_no_scheduled_cpus() -> None:
    assert scheduled_resources(pod()) == ScheduledResources()


# --- quantities ---------------------------------------------------------------------------------

QUANTITIES = [
    pytest.param("1000", Fraction(1000), 1000, 1_000_000, id="integer"),
    pytest.param("500m", Fraction(1, 2), 1, 500, id="milli"),
    pytest.param("4Gi", Fraction(4 * GI), 4 * GI, 4000 * GI, id="binary"),
    pytest.param("1.5", Fraction(3, 2), 2, 1500, id="decimal-point-rounds-up"),
    pytest.param("1e3", Fraction(1000), 1000, 1_000_000, id="exponent"),
    pytest.param("1E+3", Fraction(1000), 1000, 1_000_000, id="exponent-signed"),
    pytest.param("2G", Fraction(2 * 10**9), 2 * 10**9, 2 * 10**12, id="decimal-suffix"),
    pytest.param("0.5Ki", Fraction(512), 512, 512_000, id="fraction-of-binary"),
    pytest.param(".5", Fraction(1, 2), 1, 500, id="leading-point"),
    pytest.param("+1", Fraction(1), 1, 1000, id="plus"),
    pytest.param("100n", Fraction(1, 10**7), 1, 1, id="nano-rounds-up"),
]


@pytest.mark.parametrize(("text", "value", "units", "milli"), QUANTITIES)
def test_quantities_as_apimachinery_reads_them(
    text: str, value: Fraction, units: int, milli: int
) -> None:
    parsed = parse_quantity(text)
    assert parsed == value
    assert ceil_value(parsed) == units
    assert ceil_milli(parsed) == milli


@pytest.mark.parametrize(
    "text",
    ["", "Gi", "1 Gi", "1GiB", "0x10", "1.2.3", "1e", "1Mi2", "1e61", "5E-61", "1e" + "9" * 9],
)
def test_what_is_no_quantity(text: str) -> None:
    with pytest.raises(ValueError, match="quantity"):
        parse_quantity(text)


# --- node.koordinator.sh/extended-resource-spec --------------------------------------------------


def spec_text(containers: dict[str, Any]) -> str:
    return json.dumps({"containers": containers})


KOORD_SPEC = spec_text(
    {
        "test-container-1": {
            "requests": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "1Gi"},
            "limits": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "1Gi"},
        },
        "test-container-2": {
            "requests": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "2Gi"},
            "limits": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "2Gi"},
        },
    }
)

SPECS = [
    pytest.param(
        KOORD_SPEC,
        {
            "test-container-1": ContainerBatch(500, 500, GI, True, True),
            "test-container-2": ContainerBatch(500, 500, 2 * GI, True, True),
        },
        id="koordinator-apis-extension-test",
    ),
    pytest.param(
        spec_text(
            {
                "app": {
                    "limits": {
                        "kubernetes.io/batch-cpu": 1000,
                        "kubernetes.io/batch-memory": "4Gi",
                        "unknown-resource": "1",
                    },
                    "requests": {"kubernetes.io/batch-cpu": 1000},
                }
            }
        ),
        {"app": ContainerBatch(1000, 1000, 4 * GI, True, True)},
        id="webhook-json-numbers-and-other-resources",
    ),
    pytest.param(
        spec_text({"app": {"requests": {"kubernetes.io/batch-cpu": "500m"}}}),
        {"app": ContainerBatch(500, None, None, True, False)},
        id="fractional-cpu-read-as-cores",
    ),
    pytest.param(
        spec_text({"app": {"limits": {"kubernetes.io/batch-cpu": "2"}}}),
        {"app": ContainerBatch(None, 2, None, False, True)},
        id="integer-is-milli-cores",
    ),
    pytest.param(spec_text({"app": {}}), {"app": ContainerBatch()}, id="no-resources"),
    pytest.param("{}", {}, id="no-containers"),
]


@pytest.mark.parametrize(("text", "want"), SPECS)
def test_extended_resource_spec_formats(text: str, want: dict[str, ContainerBatch]) -> None:
    assert dict(parse_extended_resource_spec(text).containers) == want


MALFORMED_SPECS = [
    pytest.param("batch-cpu=1", "not JSON", id="not-json"),
    pytest.param('{"containers": []}', '"containers" must be an object', id="containers-list"),
    pytest.param('{"containers": {"a": 1}}', "container 'a'", id="entry-not-object"),
    pytest.param(
        spec_text({"a": {"limits": ["kubernetes.io/batch-cpu"]}}), "limits", id="limits-list"
    ),
    pytest.param(
        spec_text({"a": {"limits": {"kubernetes.io/batch-cpu": "one"}}}),
        "'one' is not a quantity",
        id="bad-quantity",
    ),
    pytest.param(
        spec_text({"a": {"requests": {"kubernetes.io/batch-memory": "1GB"}}}),
        "unknown suffix",
        id="bad-suffix",
    ),
    pytest.param(
        spec_text({"a": {"requests": {"kubernetes.io/batch-memory": True}}}),
        "is no quantity",
        id="boolean",
    ),
    # 10**999999999 as an exact fraction: hours on the event loop. Refused at once, as a JSON
    # number (read as a Decimal) or as a string.
    pytest.param(
        '{"containers": {"a": {"limits": {"kubernetes.io/batch-cpu": 1e999999999}}}}',
        "exponent beyond",
        id="huge-exponent-number",
    ),
    pytest.param(
        spec_text({"a": {"limits": {"other.io/ignored": "1e-999999999"}}}),
        "exponent beyond",
        id="huge-exponent-any-resource",
    ),
]


@pytest.mark.parametrize(("text", "message"), MALFORMED_SPECS)
def test_a_malformed_spec_names_the_annotation(text: str, message: str) -> None:
    p = pod(annotations={"node.koordinator.sh/extended-resource-spec": text})
    with pytest.raises(ValueError, match=message) as info:
        batch_spec(p)
    assert str(info.value).startswith("annotation node.koordinator.sh/extended-resource-spec: ")


def test_batch_applies_to_pods_labelled_be_only() -> None:
    assert is_batch(pod({"koordinator.sh/qosClass": "BE"}, qos=BESTEFFORT))
    assert not is_batch(pod(qos=BESTEFFORT))  # the default class is not koordlet's test
    assert not is_batch(pod({"koordinator.sh/qosClass": "LS"}))


# --- the cgroup values (koordlet's batchresource hook) -----------------------------------------


def entry(req: int | None = None, lim: int | None = None, mem: int | None = None) -> ContainerBatch:
    return ContainerBatch(req, lim, mem, req is not None, lim is not None or mem is not None)


CONTAINER_VALUES = [
    pytest.param(entry(500, 1000, 2 * GI), True, BatchResources(512, 100_000, 2 * GI), id="full"),
    pytest.param(entry(500, 500, GI), True, BatchResources(512, 50_000, GI), id="koord-test-1"),
    pytest.param(entry(None, 1000), True, BatchResources(2, 100_000, None), id="no-request"),
    pytest.param(entry(1, None), True, BatchResources(2, -1, None), id="tiny-request-no-limit"),
    pytest.param(entry(1000, 5), True, BatchResources(1024, 1_000, None), id="min-quota-1000"),
    pytest.param(entry(1000, 2000), False, BatchResources(1024, -1, None), id="cfs-quota-off"),
    pytest.param(entry(0, 0, 0), True, BatchResources(2, -1, None), id="zeros-unlimited"),
    pytest.param(ContainerBatch(), True, BatchResources(2, -1, None), id="empty-entry"),
]


@pytest.mark.parametrize(("batch", "cfs", "want"), CONTAINER_VALUES)
def test_container_values(batch: ContainerBatch, cfs: bool, want: BatchResources) -> None:
    assert container_resources(batch, cfs_quota=cfs) == want


def spec(**containers: ContainerBatch) -> BatchSpec:
    return BatchSpec(containers)


POD_VALUES = [
    pytest.param(
        parse_extended_resource_spec(KOORD_SPEC),
        True,
        BatchResources(1024, 100_000, 3 * GI),
        id="koordinator-two-containers",
    ),
    pytest.param(
        spec(a=entry(500, 1000, GI), b=entry(500, None, None)),
        True,
        BatchResources(1024, -1, None),
        id="one-unlimited-makes-the-pod-unlimited",
    ),
    pytest.param(
        spec(a=entry(500, 1000, GI), b=entry(None, 1000, None)),
        True,
        BatchResources(512, 200_000, None),
        id="memory-unlimited-cpu-limited",
    ),
    pytest.param(spec(), True, BatchResources(2, -1, None), id="no-containers"),
    pytest.param(spec(a=entry(500, 1000, GI)), False, BatchResources(512, -1, GI), id="cfs-off"),
]


@pytest.mark.parametrize(("batch", "cfs", "want"), POD_VALUES)
def test_pod_values_are_the_sums(batch: BatchSpec, cfs: bool, want: BatchResources) -> None:
    assert pod_resources(batch, cfs_quota=cfs) == want


def test_values_on_an_adjustment_set_the_period_with_a_quota_only() -> None:
    limited = BatchResources(512, 100_000, GI).apply(Adjustment())
    assert dict(limited.changes) == {
        (Field.CPU_SHARES, ""): 512,
        (Field.CPU_QUOTA, ""): 100_000,
        (Field.CPU_PERIOD, ""): 100_000,
        (Field.MEMORY_LIMIT, ""): GI,
    }
    unlimited = BatchResources(2, -1, None).apply(Adjustment())
    assert dict(unlimited.changes) == {(Field.CPU_SHARES, ""): 2, (Field.CPU_QUOTA, ""): -1}


# --- options ------------------------------------------------------------------------------------

OPTIONS = [
    pytest.param({}, KoordinatorOptions(), {"policy": "none"}, id="defaults"),
    pytest.param(
        {"cpu_manager": "cpuset", "batch_cfs_quota": False},
        KoordinatorOptions("cpuset", 0, False),
        {"policy": "none"},
        id="with-cpuset",
    ),
    pytest.param(
        {"reserved_cpus": "0-1"},
        KoordinatorOptions(reserved_cpus="0-1"),
        {
            "policy": "none",
            "reserved_cpus": "0-1",
            "policy_options": {"strict-cpu-reservation": "true"},
        },
        id="reserved-leave-every-pool",
    ),
]


@pytest.mark.parametrize(("options", "want", "ledger"), OPTIONS)
def test_options(options: dict[str, Any], want: KoordinatorOptions, ledger: dict[str, Any]) -> None:
    assert parse_options(options) == want
    assert cpuset_options(want) == ledger


@pytest.mark.parametrize(
    ("options", "message"),
    [
        pytest.param({"cpu_manger": "none"}, "unknown option", id="typo"),
        pytest.param({"cpu_manager": "static"}, "cpu_manager must be", id="static"),
        pytest.param({"reserved_cpus": "0-"}, "reserved_cpus", id="bad-cpulist"),
        pytest.param({"reserved_cpus": -1}, ">= 0", id="negative"),
        pytest.param(
            {"cpu_manager": "cpuset", "reserved_cpus": 2}, "[hooks.cpuset]", id="reserved-cpuset"
        ),
        pytest.param({"batch_cfs_quota": "yes"}, "true or false", id="quota-string"),
    ],
)
def test_bad_options_name_the_option(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        parse_options(options)
