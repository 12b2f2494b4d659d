"""The oom hook in-process: kubelet's oom_score_adj kept, or the score the policy chooses,
sticky across UpdateContainerResources, written to the processes of a running container when
kubelet's own value changes (containerd ignores it on update), and recorded as the runtime
applied it (containerd's restrict_oom_score_adj raises a score below its own). The runtime
is faked here (`FakeRuntime.oom_floor`); tests/integration has the real one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from crihook.api.cri.v1 import api_pb2
from crihook.hooks.oom import hook as oom_hook
from crihook.hooks.oom.hook import OomHook, OomOptions, chosen_score, parse_options
from crihook.hooks.oom.policy import ScoreClamp, ScoreRange, ScoreRanges
from crihook.hooks.spec import Event, Field, InvalidRequest, PodView, QoSClass, Stage
from crihook.proxy.core import observe
from crihook.proxy.core.observe import ObservedQueries
from crihook.proxy.replay.seams import RecordedNode
from crihook.proxy.state.store import Store
from tests.lab.kubelet_encoding import ContainerSpec, PodSpec
from tests.unit.hook_harness import (
    GIB,
    NODE_MEMORY,
    SMALL,
    Node,
    besteffort,
    burstable,
    guaranteed,
    topology_of,
)

TOPO = topology_of(SMALL)
ANNOTATION = "oom.crihook.io/score-adj"
# kubelet's score for a Burstable container with a 256 MiB request on a 64 GiB node.
KUBELET_BURSTABLE = 1000 - (1000 * 256 * (1 << 20)) // NODE_MEMORY


async def start(options: dict[str, Any] | None = None, floor: int | None = None) -> Node:
    """The hook on a node whose runtime raises scores below `floor` to it (containerd with
    restrict_oom_score_adj and its own score), or applies them as asked (None)."""
    node = Node(OomHook(options or {}), TOPO)
    node.runtime.oom_floor = floor
    await node.sync()
    return node


async def pod(
    node: Node,
    sandbox_id: str,
    *containers: ContainerSpec,
    namespace: str = "default",
    score: str | None = None,
) -> PodView:
    annotations = {} if score is None else {ANNOTATION: score}
    spec = PodSpec(
        sandbox_id, namespace=namespace, containers=list(containers), annotations=annotations
    )
    return await node.run_pod(spec, sandbox_id)


def score_of(adjustment: Any) -> int | None:
    if adjustment is None:
        return None
    return adjustment.changes.get((Field.OOM_SCORE_ADJ, ""))  # type: ignore[no-any-return]


def view(
    namespace: str = "default", qos: QoSClass = QoSClass.BURSTABLE, score: str | None = None
) -> PodView:
    return PodView(
        id="p",
        uid="u",
        name="p",
        namespace=namespace,
        qos_class=qos,
        annotations={} if score is None else {ANNOTATION: score},
    )


# --- options --------------------------------------------------------------------------------------


def test_options_parse() -> None:
    options = parse_options(
        {
            "override_ranges": {"batch": "500..1000", "*": "0..1000"},
            "qos_scores": {"BestEffort": 900, "Burstable": 500},
        }
    )
    assert options == OomOptions(
        ScoreRanges({"batch": ScoreRange(500, 1000)}, ScoreRange(0, 1000)),
        {QoSClass.BEST_EFFORT: 900, QoSClass.BURSTABLE: 500},
    )
    assert parse_options({}) == OomOptions()


BAD_OPTIONS = [
    pytest.param({"ranges": {}}, "oom: unknown option(s) ranges", id="unknown-key"),
    pytest.param({"override_ranges": "0..1000"}, "oom: override_ranges must be a table", id="str"),
    pytest.param(
        {"override_ranges": {"Batch": "0..1000"}}, "oom: override_ranges: ", id="bad-namespace"
    ),
    pytest.param(
        {"override_ranges": {"*": "1000..0"}}, "oom: override_ranges: ", id="inverted-range"
    ),
    pytest.param({"override_ranges": {"*": 5}}, "oom: override_ranges: ", id="not-a-string"),
    pytest.param({"qos_scores": [1]}, "oom: qos_scores must be a table", id="qos-list"),
    pytest.param(
        {"qos_scores": {"Unknown": 1}}, "oom: qos_scores: 'Unknown' is not one of", id="qos-name"
    ),
    pytest.param(
        {"qos_scores": {"BestEffort": 1001}}, "oom: qos_scores BestEffort: 1001", id="out-of-range"
    ),
    pytest.param(
        {"qos_scores": {"BestEffort": "900"}}, "oom: qos_scores BestEffort: '900'", id="string"
    ),
    pytest.param(
        {"qos_scores": {"BestEffort": True}}, "oom: qos_scores BestEffort: True", id="bool"
    ),
]


@pytest.mark.parametrize(("options", "message"), BAD_OPTIONS)
def test_bad_options_name_the_option(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as info:
        OomHook(options)
    assert message in str(info.value)


# --- the score chosen -----------------------------------------------------------------------------

RANGES = {"override_ranges": {"batch": "500..1000", "*": "0..400"}}
QOS = {"qos_scores": {"BestEffort": 900, "Burstable": 600}}

CHOSEN = [
    pytest.param({}, view(), None, id="kubelets-kept"),
    pytest.param(RANGES, view("batch", score="800"), 800, id="namespace-range"),
    pytest.param(RANGES, view("batch", score="500"), 500, id="range-low-end"),
    pytest.param(RANGES, view("web", score="400"), 400, id="fallback-range"),
    pytest.param(RANGES, view("web", score="+7"), 7, id="signed"),
    pytest.param(QOS, view(qos=QoSClass.BEST_EFFORT), 900, id="qos-besteffort"),
    pytest.param(QOS, view(qos=QoSClass.BURSTABLE), 600, id="qos-burstable"),
    pytest.param(QOS, view(qos=QoSClass.GUARANTEED), None, id="qos-not-configured"),
    pytest.param(
        {**RANGES, **QOS},
        view("batch", qos=QoSClass.BEST_EFFORT, score="700"),
        700,
        id="annotation-over-qos",
    ),
]


@pytest.mark.parametrize(("options", "pod", "expected"), CHOSEN)
def test_chosen_score(options: dict[str, Any], pod: PodView, expected: int | None) -> None:
    assert chosen_score(parse_options(options), pod) == expected


REFUSED = [
    pytest.param(RANGES, view("batch", score="499"), "outside", id="below"),
    pytest.param(RANGES, view("web", score="401"), "outside", id="fallback"),
    pytest.param({}, view("web", score="1"), "no override is allowed", id="none"),
    pytest.param(
        {"override_ranges": {"batch": "0..1000"}},
        view("web", score="1"),
        "no override is allowed",
        id="no-fallback",
    ),
    pytest.param(RANGES, view("batch", score="lots"), "not an integer", id="word"),
    pytest.param(RANGES, view("batch", score="8e2"), "not an integer", id="exp"),
    pytest.param(RANGES, view("batch", score=" 800"), "not an integer", id="space"),
    pytest.param(RANGES, view("batch", score="1001"), "-1000..1000", id="big"),
]


@pytest.mark.parametrize(("options", "pod", "why"), REFUSED)
def test_a_bad_annotation_is_an_invalid_request_naming_it(
    options: dict[str, Any], pod: PodView, why: str
) -> None:
    with pytest.raises(InvalidRequest) as info:
        chosen_score(parse_options(options), pod)
    assert ANNOTATION in info.value.reason
    assert why in info.value.reason


async def test_create_container_gets_the_chosen_score_or_kubelets() -> None:
    node = await start(RANGES)
    kept = await pod(node, "k", burstable("app"))
    created = await node.create(kept, burstable("app"), "c1")
    assert created.pre is None
    assert created.request.config.linux.resources.oom_score_adj == KUBELET_BURSTABLE
    chosen = await pod(node, "b", burstable("app"), namespace="batch", score="800")
    created = await node.create(chosen, burstable("app"), "c2")
    assert score_of(created.pre) == 800
    assert node.state.get("c:c1") == {
        "pod": "k",
        "asked": KUBELET_BURSTABLE,
        "score": KUBELET_BURSTABLE,
        "sticky": False,
    }
    assert node.state.get("c:c2") == {"pod": "b", "asked": 800, "score": 800, "sticky": True}


async def test_create_container_with_a_bad_annotation_is_refused_and_records_nothing() -> None:
    node = await start(RANGES)
    p = await pod(node, "b", burstable("app"), namespace="batch", score="100")
    with pytest.raises(InvalidRequest, match=ANNOTATION):
        await node.begin_create(p, burstable("app"))
    assert list(node.state.items()) == []


# --- what the runtime applied ---------------------------------------------------------------------

Learnt = tuple[int, int | None]

CLAMPS = [
    pytest.param([], [(1000, None), (-997, None)], id="nothing-known"),
    pytest.param([(1000, 1000)], [(1000, 1000), (999, None), (-997, None)], id="as-asked-above"),
    pytest.param(
        [(1000, 1000), (-997, 0)], [(-997, 0), (-1000, 0), (3, 3), (0, 0)], id="raised-to-floor"
    ),
    pytest.param([(-997, -997)], [(-997, -997), (500, 500), (-998, None)], id="no-floor-above"),
    pytest.param([(500, None)], [(-997, -997), (1000, 1000)], id="runtime-silent"),
    pytest.param([(5, 4)], [(5, None), (1000, None)], id="lowered-teaches-nothing"),
]


@pytest.mark.parametrize(("learnt", "expected"), CLAMPS)
def test_score_clamp_predicts_only_what_the_runtime_said(
    learnt: list[Learnt], expected: list[Learnt]
) -> None:
    clamp = ScoreClamp()
    for asked, applied in learnt:
        clamp.learn(asked, applied)
    assert [(asked, clamp.applied(asked)) for asked, _ in expected] == expected


async def test_the_score_the_runtime_applied_is_recorded_and_its_clamp_asked_once() -> None:
    """containerd with restrict_oom_score_adj (this VM lacks CAP_SYS_RESOURCE) raises a
    Guaranteed container's -997 to its own 0: the state records 0, what its processes have,
    beside what kubelet asked for. The runtime is asked until the clamp is known."""
    node = await start(floor=0)
    first = await pod(node, "g1", guaranteed("app", 1000))
    await node.create(first, guaranteed("app", 1000), "c1")
    assert node.state.get("c:c1") == {"pod": "g1", "asked": -997, "score": 0, "sticky": False}
    second = await pod(node, "g2", guaranteed("app", 1000))
    await node.create(second, guaranteed("app", 1000), "c2")
    spare = await pod(node, "b", besteffort("app"))
    await node.create(spare, besteffort("app"), "c3")
    assert node.state.get("c:c2") == {"pod": "g2", "asked": -997, "score": 0, "sticky": False}
    assert node.state.get("c:c3") == {"pod": "b", "asked": 1000, "score": 1000, "sticky": False}
    assert node.runtime.asked_scores == ["c1"]  # the floor is known from the first answer


async def test_without_a_clamp_the_score_is_recorded_as_asked() -> None:
    node = await start(floor=None)
    p = await pod(node, "g", guaranteed("app", 1000))
    await node.create(p, guaranteed("app", 1000), "c1")
    assert node.state.get("c:c1")["score"] == -997


# --- UpdateContainerResources ---------------------------------------------------------------------


def kubelet_update(score: int) -> api_pb2.LinuxContainerResources:
    return api_pb2.LinuxContainerResources(
        cpu_shares=102, cpu_period=100_000, memory_limit_in_bytes=GIB, oom_score_adj=score
    )


async def test_the_chosen_score_is_sticky_and_never_written_again() -> None:
    node = await start(RANGES)
    p = await pod(node, "b", burstable("app"), namespace="batch", score="800")
    await node.create(p, burstable("app"), "c1")
    node.host.pids["c1"] = [41, 42]
    pre, post, request = await node.update("c1", kubelet_update(KUBELET_BURSTABLE - 100))
    assert score_of(pre) == 800
    assert request.linux.oom_score_adj == 800
    assert post is None
    assert node.host.writes == []
    assert node.state.get("c:c1")["score"] == 800


async def test_a_new_kubelet_score_is_written_to_every_process_of_the_container() -> None:
    node = await start()
    p = await pod(node, "k", burstable("app"))
    await node.create(p, burstable("app"), "c1")
    node.host.pids["c1"] = [41, 42]
    pre, post, _ = await node.update("c1", kubelet_update(500))
    assert pre is None  # kubelet's value goes through
    assert post is None
    assert node.host.looked_up == [(p.cgroup_parent, "c1")]
    assert node.host.writes == [(41, 500), (42, 500)]
    assert node.state.get("c:c1")["score"] == 500
    # The same value again: nothing to write.
    await node.update("c1", kubelet_update(500))
    assert node.host.writes == [(41, 500), (42, 500)]
    # Nor when kubelet re-sends the score the container was created with.
    node.host.writes.clear()
    other = await pod(node, "o", burstable("app"))
    await node.create(other, burstable("app"), "c2")
    node.host.pids["c2"] = [50]
    await node.update("c2", kubelet_update(KUBELET_BURSTABLE))
    assert node.host.writes == []


PARTIAL_UPDATES = [
    pytest.param(api_pb2.LinuxContainerResources(cpuset_cpus="0-3"), id="static-cpu-manager"),
    pytest.param(api_pb2.LinuxContainerResources(cpu_shares=4), id="crictl-update-cpu-share"),
    pytest.param(
        api_pb2.LinuxContainerResources(memory_limit_in_bytes=GIB), id="crictl-update-memory"
    ),
]


@pytest.mark.parametrize("linux", PARTIAL_UPDATES)
async def test_a_partial_update_leaves_the_score_as_it_is(
    linux: api_pb2.LinuxContainerResources,
) -> None:
    """kubelet's static CPU manager sends only a cpuset (`updateContainerCPUSet`), crictl
    update only the flags given: their oom_score_adj reads 0, which is "unset" (containerd
    reads every number of an update so, and ignores the score on update anyway). A
    BestEffort container keeps 1000, in its processes and in the state."""
    node = await start()
    p = await pod(node, "be", besteffort("app"))
    await node.create(p, besteffort("app"), "c1")
    node.host.pids["c1"] = [41]
    node.host.scores[41] = 1000
    pre, post, request = await node.update("c1", linux)
    assert (pre, post) == (None, None)
    assert request.linux.oom_score_adj == 0  # forwarded as kubelet sent it
    assert node.host.writes == []
    assert node.state.get("c:c1") == {"pod": "be", "asked": 1000, "score": 1000, "sticky": False}
    assert node.containers["c1"].resources.oom_score_adj == 1000  # what crihook's store keeps


async def test_kubelets_resize_resending_a_clamped_score_changes_nothing() -> None:
    """A resize of a Guaranteed container: kubelet sends its whole resources again, -997
    among them. The container runs with 0 (containerd raised it): -997 is what it was asked
    for, not a new score, so nothing is written."""
    node = await start(floor=0)
    p = await pod(node, "g", guaranteed("app", 1000))
    await node.create(p, guaranteed("app", 1000), "c1")
    node.host.pids["c1"] = [41]
    resized = kubelet_update(-997)
    resized.memory_limit_in_bytes = 2 * GIB
    await node.update("c1", resized)
    assert node.host.writes == []
    assert node.state.get("c:c1") == {"pod": "g", "asked": -997, "score": 0, "sticky": False}


async def test_a_new_score_below_the_runtimes_floor_is_written_as_the_runtime_applies_it() -> None:
    node = await start(floor=0)
    g = await pod(node, "g", guaranteed("app", 1000))
    await node.create(g, guaranteed("app", 1000), "c0")  # the floor is learnt: 0
    p = await pod(node, "k", burstable("app"))
    await node.create(p, burstable("app"), "c1")
    node.host.pids["c1"] = [41]
    await node.update("c1", kubelet_update(-500))
    assert node.host.writes == [(41, 0)]
    assert node.state.get("c:c1") == {"pod": "k", "asked": -500, "score": 0, "sticky": False}


async def test_a_score_the_kernel_refuses_is_not_recorded() -> None:
    node = await start()
    p = await pod(node, "k", burstable("app"))
    await node.create(p, burstable("app"), "c1")
    node.host.pids["c1"] = [41]
    refuse = PermissionError(13, "cannot write -500 to /proc/41/oom_score_adj: Permission denied")
    node.host.refuse = refuse
    await node.update("c1", kubelet_update(-500))
    assert node.state.get("c:c1")["score"] == KUBELET_BURSTABLE
    assert node.state.get("c:c1")["asked"] == KUBELET_BURSTABLE


async def test_an_update_without_linux_resources_writes_nothing() -> None:
    node = await start()
    p = await pod(node, "k", burstable("app"))
    await node.create(p, burstable("app"), "c1")
    node.host.pids["c1"] = [41]
    request = api_pb2.UpdateContainerResourcesRequest(container_id="c1")
    request.annotations["example.com/x"] = "y"  # CRI lets an update carry only annotations

    response = api_pb2.UpdateContainerResourcesResponse()
    view = node.containers["c1"]
    await node.stage(Event.UPDATE_CONTAINER_RESOURCES, Stage.PRE, p, view, request)
    await node.stage(Event.UPDATE_CONTAINER_RESOURCES, Stage.POST, p, view, request, response)
    assert node.host.writes == []
    assert node.state.get("c:c1")["score"] == KUBELET_BURSTABLE


async def test_an_unknown_container_is_left_alone() -> None:
    node = await start(QOS)
    p = await pod(node, "k", burstable("app"))
    await node.create(p, burstable("app"), "c1")
    node.state.delete("c:c1")  # as if created before crihook
    node.host.pids["c1"] = [41]
    pre, post, request = await node.update("c1", kubelet_update(500))
    assert (pre, post, request.linux.oom_score_adj) == (None, None, 500)
    assert node.host.writes == []


# --- state cleanup --------------------------------------------------------------------------------


async def test_state_goes_with_the_container_and_the_pod() -> None:
    node = await start()
    a = await pod(node, "a", burstable("x"), burstable("y"))
    b = await pod(node, "b", burstable("z"))
    await node.create(a, burstable("x"), "c1")
    await node.create(a, burstable("y"), "c2")
    await node.create(b, burstable("z"), "c3")
    await node.remove("c1")
    assert sorted(k for k, _ in node.state.items()) == ["c:c2", "c:c3"]
    await node.remove_pod("a")
    assert sorted(k for k, _ in node.state.items()) == ["c:c3"]


async def test_synchronize_drops_the_state_of_containers_that_are_gone() -> None:
    node = await start()
    a = await pod(node, "a", burstable("x"), burstable("y"))
    await node.create(a, burstable("x"), "c1")
    await node.create(a, burstable("y"), "c2")
    del node.containers["c1"]  # gone while crihook was down
    restarted = Node(OomHook({}), TOPO, state=node.state)
    restarted.pods, restarted.containers, restarted.states = node.pods, node.containers, node.states
    assert await restarted.sync() == []
    assert sorted(k for k, _ in restarted.state.items()) == ["c:c2"]
    # The restarted hook writes through the host it was given.
    restarted.host.pids["c2"] = [7]
    await restarted.update("c2", kubelet_update(600))
    assert restarted.host.writes == [(7, 600)]


async def test_synchronize_adopts_containers_it_did_not_see_created() -> None:
    """crihook put in front of a running node: a container it never saw gets kubelet's
    later scores written too; one whose pod has an allowed override keeps it."""
    node = await start({"override_ranges": {"*": "0..1000"}})
    plain = await pod(node, "a", burstable("x"))
    pinned = await pod(node, "b", burstable("y"), score="700")
    await node.create(plain, burstable("x"), "c1")
    await node.create(pinned, burstable("y"), "c2")
    for key, _ in list(node.state.items()):
        node.state.delete(key)  # as if they were created before crihook
    assert await node.sync() == []
    assert node.state.get("c:c2")["sticky"] is True
    node.host.pids["c1"] = [11]
    node.host.pids["c2"] = [12]
    await node.update("c1", kubelet_update(600))
    _, _, request = await node.update("c2", kubelet_update(600))
    assert node.host.writes == [(11, 600)]  # the pinned one keeps 700: no write
    assert request.linux.oom_score_adj == 700


def test_the_hook_module_exports() -> None:
    assert set(oom_hook.__all__) == {"OomHook", "OomOptions", "chosen_score", "parse_options"}


# --- the runtime's answer in recordings and replays --------------------------------------------


async def test_the_runtimes_answer_is_noted_for_a_recording_and_answered_by_a_replay(
    tmp_path: Path,
) -> None:
    node = await start(floor=0)
    node.runtime.scores["c1"] = 0
    observed, token = observe.begin()
    try:
        assert await ObservedQueries(node.runtime).oom_score_adj("c1") == 0
        assert await ObservedQueries(node.runtime).oom_score_adj("c9") is None
    finally:
        observe.end(token)
    assert [(o.seam, o.op, o.args, o.result) for o in observed] == [
        ("runtime", "oom_score_adj", ["c1"], 0),
        ("runtime", "oom_score_adj", ["c9"], None),
    ]
    replayed = RecordedNode(Store(tmp_path))
    replayed.begin([o._asdict() for o in observed])
    assert await replayed.oom_score_adj("c1") == 0
    assert await replayed.oom_score_adj("c9") is None
    assert await replayed.oom_score_adj("c2") is None  # not recorded: the runtime does not say
    assert replayed.missing == ["runtime.oom_score_adj('c2',)"]
