"""crihook in front of the real runtime, containerd 1.6 and 2.x and CRI-O: every method the
runtime implements gives the same result through crihook as directly; the pod lifecycle runs
through crihook; the runtime killed and restarted under load never takes crihook down.

Where the runtimes differ the tests say so: containerd 2.x and CRI-O implement the methods 1.6
answers UNIMPLEMENTED (RuntimeConfig, ListMetricDescriptors, CheckpointContainer,
UpdatePodSandboxResources) and stream GetContainerEvents; the answers crihook forwards are
checked against the runtime's own either way.

PullImage is the one implemented method not called: no registry is reachable here, and
containerd would try the internet. The images come from the lab's local archives.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from crihook.api.cri.v1 import api_pb2, api_pb2_grpc
from tests.lab.crihook_proc import DATA_PATHS, PATIENCE, CrihookProcess, wait_for
from tests.lab.fixtures import PodCleanup
from tests.lab.images import BUSYBOX_REF
from tests.lab.kubelet import KubeletClient, PodHandle
from tests.lab.kubelet_encoding import burstable_pod
from tests.lab.runtime_lab import RuntimeLab

pytestmark = [pytest.mark.containerd, pytest.mark.both_containerds, pytest.mark.on_crio]

MiB = 1024 * 1024


@pytest.fixture(scope="module", params=DATA_PATHS)
def crihook(containerd: RuntimeLab, request: pytest.FixtureRequest) -> Iterator[CrihookProcess]:
    """On both data paths: grpc.aio, and crihook's own HTTP/2."""
    with CrihookProcess(containerd.endpoint, data_path=request.param) as proc:
        yield proc
        assert proc.stop() == 0


@pytest.fixture
def via(
    crihook: CrihookProcess, containerd: RuntimeLab, pod_cleanup: PodCleanup
) -> Iterator[KubeletClient]:
    with KubeletClient(crihook.endpoint, log_root=containerd.pod_log_dir) as client:
        yield client


class Stubs:
    def __init__(self, endpoint: str) -> None:
        self.channel = grpc.insecure_channel(endpoint)
        self.rt = api_pb2_grpc.RuntimeServiceStub(self.channel)
        self.img = api_pb2_grpc.ImageServiceStub(self.channel)


@pytest.fixture
def both(crihook: CrihookProcess, containerd: RuntimeLab) -> Iterator[tuple[Stubs, Stubs]]:
    direct, proxied = Stubs(containerd.endpoint), Stubs(crihook.endpoint)
    yield direct, proxied
    direct.channel.close()
    proxied.channel.close()


def _pod(via: KubeletClient, name: str) -> PodHandle:
    return via.run_pod(burstable_pod(name))


VOLATILE = frozenset(
    {
        "cpu",
        "memory",
        "writable_layer",
        "swap",
        "io",
        "network",
        "process",
        "timestamp",
        "used_bytes",
        "inodes_used",
    }
)


def _strip_volatile(message: Any) -> Any:
    """Usage counters move between two calls; everything else must be equal."""
    copy = type(message)()
    copy.CopyFrom(message)
    _clear(copy)
    for field, value in copy.ListFields():  # list answers come in the runtime's map order
        is_map = field.type == field.TYPE_MESSAGE and field.message_type.GetOptions().map_entry
        if field.is_repeated and field.type == field.TYPE_MESSAGE and not is_map:
            ordered = sorted(value, key=lambda m: m.SerializeToString(deterministic=True))
            del value[:]
            value.extend(ordered)
    return copy


def _clear(message: Any) -> None:
    for field, value in message.ListFields():
        if field.name in VOLATILE:
            message.ClearField(field.name)
        elif field.type == field.TYPE_MESSAGE:
            is_map = field.message_type.GetOptions().map_entry
            if field.is_repeated and not is_map:
                for item in value:
                    _clear(item)
            elif not is_map:
                _clear(value)


def test_lifecycle_through_crihook_reaches_containerd(
    via: KubeletClient, containerd: RuntimeLab, both: tuple[Stubs, Stubs]
) -> None:
    handle = _pod(via, "lifecycle")
    direct, _ = both
    cid = handle.container_ids["app"]
    status = direct.rt.ContainerStatus(api_pb2.ContainerStatusRequest(container_id=cid))
    assert status.status.state == api_pb2.CONTAINER_RUNNING
    assert status.status.labels["io.kubernetes.container.name"] == "app"
    assert status.status.resources.linux.cpu_shares == 256
    assert status.status.resources.linux.cpu_quota == 50000
    assert status.status.resources.linux.memory_limit_in_bytes == 64 * MiB
    # 2.x and CRI-O fill the image id (ContainerStatus.image_id and Container.image_id,
    # newer in the CRI than 1.6), through crihook as directly; 1.6 leaves both empty.
    image = direct.img.ImageStatus(
        api_pb2.ImageStatusRequest(image=api_pb2.ImageSpec(image=BUSYBOX_REF))
    ).image
    via_status = via.container_status(cid).status
    (listed_container,) = [c for c in via.runtime.ListContainers(
        api_pb2.ListContainersRequest()).containers if c.id == cid]  # fmt: skip
    expected_id = "" if containerd.runtime == "containerd-1.6" else image.id
    assert (status.status.image_id, via_status.image_id) == (expected_id, expected_id)
    assert listed_container.image_id == expected_id
    assert via.exec_sync(cid, ["echo", "through-crihook"]).stdout == b"through-crihook\n"
    via.remove_pod(handle)
    listed = direct.rt.ListPodSandbox(api_pb2.ListPodSandboxRequest())
    assert handle.sandbox_id not in {p.id for p in listed.items}


READ_ONLY = [
    ("rt", "Version", lambda h: api_pb2.VersionRequest()),
    ("rt", "Status", lambda h: api_pb2.StatusRequest(verbose=False)),
    ("rt", "ListPodSandbox", lambda h: api_pb2.ListPodSandboxRequest()),
    (
        "rt",
        "PodSandboxStatus",
        lambda h: api_pb2.PodSandboxStatusRequest(pod_sandbox_id=h.sandbox_id),
    ),
    ("rt", "ListContainers", lambda h: api_pb2.ListContainersRequest()),
    (
        "rt",
        "ContainerStatus",
        lambda h: api_pb2.ContainerStatusRequest(container_id=h.container_ids["app"]),
    ),
    (
        "rt",
        "ContainerStats",
        lambda h: api_pb2.ContainerStatsRequest(container_id=h.container_ids["app"]),
    ),
    ("rt", "ListContainerStats", lambda h: api_pb2.ListContainerStatsRequest()),
    (
        "rt",
        "PodSandboxStats",
        lambda h: api_pb2.PodSandboxStatsRequest(pod_sandbox_id=h.sandbox_id),
    ),
    ("rt", "ListPodSandboxStats", lambda h: api_pb2.ListPodSandboxStatsRequest()),
    (
        "rt",
        "ExecSync",
        lambda h: api_pb2.ExecSyncRequest(
            container_id=h.container_ids["app"],
            cmd=["sh", "-c", "echo out; echo err >&2; exit 3"],
            timeout=60,
        ),
    ),
    ("img", "ListImages", lambda h: api_pb2.ListImagesRequest()),
    (
        "img",
        "ImageStatus",
        lambda h: api_pb2.ImageStatusRequest(
            image=api_pb2.ImageSpec(image="localhost/crihook/busybox:1.35")
        ),
    ),
    ("img", "ImageFsInfo", lambda h: api_pb2.ImageFsInfoRequest()),
]


def test_read_only_methods_equal_through_crihook_and_directly(
    via: KubeletClient, both: tuple[Stubs, Stubs]
) -> None:
    handle = _pod(via, "readonly")
    direct, proxied = both
    checked = []
    for service, method, build in READ_ONLY:
        request = build(handle)
        got_direct = getattr(getattr(direct, service), method)(request, timeout=30)
        got_proxied = getattr(getattr(proxied, service), method)(request, timeout=30)
        assert _strip_volatile(got_proxied) == _strip_volatile(got_direct), method
        checked.append(method)
    assert len(checked) == len(READ_ONLY)
    # ExecSync's exit code and both streams came through.
    out = proxied.rt.ExecSync(READ_ONLY[10][2](handle), timeout=30)
    assert (out.stdout, out.stderr, out.exit_code) == (b"out\n", b"err\n", 3)


def test_streaming_urls_and_runtime_config_calls(
    via: KubeletClient, both: tuple[Stubs, Stubs]
) -> None:
    handle = _pod(via, "urls")
    _, proxied = both
    cid = handle.container_ids["app"]
    exec_url = proxied.rt.Exec(
        api_pb2.ExecRequest(container_id=cid, cmd=["sh"], stdout=True), timeout=60
    ).url
    attach_url = proxied.rt.Attach(
        api_pb2.AttachRequest(container_id=cid, stdout=True), timeout=60
    ).url
    pf_url = proxied.rt.PortForward(
        api_pb2.PortForwardRequest(pod_sandbox_id=handle.sandbox_id, port=[80]), timeout=60
    ).url
    for url, kind in ((exec_url, "exec"), (attach_url, "attach"), (pf_url, "portforward")):
        assert url.startswith("http://127.0.0.1:") and f"/{kind}/" in url
    proxied.rt.ReopenContainerLog(api_pb2.ReopenContainerLogRequest(container_id=cid), timeout=60)
    proxied.rt.UpdateRuntimeConfig(
        api_pb2.UpdateRuntimeConfigRequest(
            runtime_config=api_pb2.RuntimeConfig(network_config=api_pb2.NetworkConfig(pod_cidr=""))
        ),
        timeout=60,
    )


def test_update_container_resources_through_crihook(
    via: KubeletClient, both: tuple[Stubs, Stubs], containerd: RuntimeLab
) -> None:
    handle = _pod(via, "update")
    direct, proxied = both
    cid = handle.container_ids["app"]
    proxied.rt.UpdateContainerResources(
        api_pb2.UpdateContainerResourcesRequest(
            container_id=cid,
            linux=api_pb2.LinuxContainerResources(
                cpu_shares=512, cpu_period=100000, cpu_quota=80000, memory_limit_in_bytes=96 * MiB
            ),
        ),
        timeout=30,
    )
    res = direct.rt.ContainerStatus(api_pb2.ContainerStatusRequest(container_id=cid)).status
    assert (res.resources.linux.cpu_shares, res.resources.linux.cpu_quota) == (512, 80000)
    path = containerd.container_cgroup(handle.cgroup_parent, cid)
    cgroup = Path("/sys/fs/cgroup/cpu") / path.lstrip("/") / "cpu.shares"
    assert cgroup.read_text().strip() == "512"


def test_remove_image_through_crihook(containerd: RuntimeLab, both: tuple[Stubs, Stubs]) -> None:
    ref = "localhost/crihook/throwaway:1"
    containerd.tag_image("localhost/crihook/busybox:1.35", ref)
    direct, proxied = both
    spec = api_pb2.ImageSpec(image=ref)
    assert direct.img.ImageStatus(api_pb2.ImageStatusRequest(image=spec)).image.id
    try:
        proxied.img.RemoveImage(api_pb2.RemoveImageRequest(image=spec), timeout=30)
        assert not direct.img.ImageStatus(api_pb2.ImageStatusRequest(image=spec)).HasField("image")
    finally:
        containerd.import_images()  # CRI removes the image by id: every tag of it went


# Methods containerd 1.6 answers UNIMPLEMENTED; 2.x and CRI-O implement every one. The
# requests are the smallest each answers: both return their runtime config and metric
# descriptors (in map order: compared sorted), fail any checkpoint in their handler
# (UNKNOWN: the lab has no CRIU), and find no such sandbox to resize (NOT_FOUND).
NEWER_METHODS: dict[str, tuple[bytes, grpc.StatusCode, type[Any] | None]] = {
    "RuntimeConfig": (b"", grpc.StatusCode.OK, api_pb2.RuntimeConfigResponse),
    "ListMetricDescriptors": (b"", grpc.StatusCode.OK, api_pb2.ListMetricDescriptorsResponse),
    "CheckpointContainer": (b"", grpc.StatusCode.UNKNOWN, None),
    # intercepted: crihook refuses an empty id itself (INVALID_ARGUMENT), so a well-formed one
    "UpdatePodSandboxResources": (
        api_pb2.UpdatePodSandboxResourcesRequest(pod_sandbox_id="0" * 64).SerializeToString(),
        grpc.StatusCode.NOT_FOUND,
        None,
    ),
}


def _outcome(stubs: Stubs, method: str) -> tuple[grpc.StatusCode, object]:
    """(OK, the answer) or (status code, details) of one raw call."""
    request, _, answer_type = NEWER_METHODS[method]
    call = stubs.channel.unary_unary(f"/runtime.v1.RuntimeService/{method}")
    try:
        answer = call(request, timeout=60)
    except grpc.RpcError as exc:
        return exc.code(), exc.details()
    assert answer_type is not None, f"{method} answered"
    return grpc.StatusCode.OK, _strip_volatile(answer_type.FromString(answer))


@pytest.mark.parametrize("method", NEWER_METHODS)
def test_methods_16_lacks_answer_the_same_through_crihook(
    containerd: RuntimeLab, both: tuple[Stubs, Stubs], method: str
) -> None:
    direct, proxied = (_outcome(stubs, method) for stubs in both)
    assert proxied == direct
    on_2 = NEWER_METHODS[method][1]
    on_16 = containerd.runtime == "containerd-1.6"
    assert direct[0] == (grpc.StatusCode.UNIMPLEMENTED if on_16 else on_2)


def test_get_container_events_through_crihook(
    containerd: RuntimeLab, via: KubeletClient, both: tuple[Stubs, Stubs]
) -> None:
    if containerd.runtime == "containerd-1.6":
        # containerd 1.6 lacks GetContainerEvents: the same status both ways.
        results = []
        for stubs in both:
            stream = stubs.rt.GetContainerEvents(api_pb2.GetEventsRequest(), timeout=60)
            with pytest.raises(grpc.RpcError) as err:
                list(stream)
            results.append((err.value.code(), err.value.details()))
        assert results[0] == results[1]
        assert results[0][0] == grpc.StatusCode.UNIMPLEMENTED
        return
    # containerd 2.x and CRI-O (enable_pod_events) stream them (kubelet's evented PLEG).
    # On containerd a subscription is live once an
    # event of ours comes through it: containerd hands events published while nobody
    # listens to the next subscriber, but one published while only a client that has gone
    # is subscribed is lost (that subscription lingers until the next event). So: probe
    # containers until one's creation arrives, then watch the app container stop.
    handle = _pod(via, "events")
    cid = handle.container_ids["app"]
    _, proxied = both
    stream = proxied.rt.GetContainerEvents(api_pb2.GetEventsRequest())
    events: queue.Queue[api_pb2.ContainerEventResponse] = queue.Queue()
    reader = threading.Thread(target=_drain, args=(stream, events), name="events", daemon=True)
    reader.start()
    try:
        _probe_until_seen(via, handle, events)
        via.runtime.StopContainer(api_pb2.StopContainerRequest(container_id=cid, timeout=0))
        stopped = _next_event_of(events, cid)
    finally:
        stream.cancel()
        reader.join(PATIENCE)
    assert stopped.container_event_type == api_pb2.CONTAINER_STOPPED_EVENT
    assert stopped.pod_sandbox_status.id == handle.sandbox_id
    assert stopped.pod_sandbox_status.metadata.name == "events"
    statuses = {s.id: s for s in stopped.containers_statuses}
    assert statuses[cid].state == api_pb2.CONTAINER_EXITED
    assert statuses[cid].labels["io.kubernetes.container.name"] == "app"


def _drain(stream: Any, events: queue.Queue[api_pb2.ContainerEventResponse]) -> None:
    try:
        for event in stream:
            events.put(event)
    except grpc.RpcError:
        pass  # cancelled at the end of the test; a failure shows as a missing event


def _next_event_of(
    events: queue.Queue[api_pb2.ContainerEventResponse], container_id: str, timeout: float = 30
) -> api_pb2.ContainerEventResponse:
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            event = events.get(timeout=left)
        except queue.Empty:
            break
        if event.container_id == container_id:
            return event
    raise AssertionError(f"no event for {container_id[:12]} within {timeout}s")


def _probe_until_seen(
    via: KubeletClient, handle: PodHandle, events: queue.Queue[api_pb2.ContainerEventResponse]
) -> None:
    for attempt in range(20):
        config = api_pb2.ContainerConfig()
        config.CopyFrom(handle.container_configs["app"])
        config.metadata.name, config.metadata.attempt = "probe", attempt
        probe = via.runtime.CreateContainer(
            api_pb2.CreateContainerRequest(
                pod_sandbox_id=handle.sandbox_id,
                config=config,
                sandbox_config=handle.sandbox_config,
            )
        ).container_id
        try:
            event = _next_event_of(events, probe, timeout=3)
        except AssertionError:
            continue
        assert event.container_event_type == api_pb2.CONTAINER_CREATED_EVENT
        return
    raise AssertionError("no probe container's creation came through the event stream")


def test_unknown_fields_reach_containerd_and_are_accepted(
    via: KubeletClient, both: tuple[Stubs, Stubs]
) -> None:
    handle = _pod(via, "unknown-fields")
    _, proxied = both
    config = api_pb2.ContainerConfig()
    config.CopyFrom(handle.container_configs["app"])
    config.metadata.name = "second"
    request = api_pb2.CreateContainerRequest(
        pod_sandbox_id=handle.sandbox_id, config=config, sandbox_config=handle.sandbox_config
    )
    raw = request.SerializeToString() + b"\xaa\x06\x03new"  # field 101, bytes "new"
    answer = proxied.channel.unary_unary("/runtime.v1.RuntimeService/CreateContainer")(
        raw, timeout=30
    )
    cid = api_pb2.CreateContainerResponse.FromString(answer).container_id
    status = proxied.rt.ContainerStatus(api_pb2.ContainerStatusRequest(container_id=cid))
    assert status.status.metadata.name == "second"


def test_a_field_newer_than_16_passes_through_crihook(
    containerd: RuntimeLab, via: KubeletClient, both: tuple[Stubs, Stubs]
) -> None:
    """kubelet 1.33+ sends a container's stop signal (ContainerConfig.stop_signal). crihook
    forwards it: 2.x accepts it and reports it back; 1.6 does not know the field, ignores it
    and reports none; CRI-O 1.34 stops the container with it but reports none."""
    handle = _pod(via, "stop-signal")
    direct, _ = both
    config = api_pb2.ContainerConfig()
    config.CopyFrom(handle.container_configs["app"])
    config.metadata.name = "signalled"
    config.stop_signal = api_pb2.SIGUSR1
    # It answers the signal: a container PID 1 ignores signals it has no handler for, and
    # CRI-O then waits a minute before it kills one that was stopped with timeout 0.
    del config.command[:], config.args[:]
    config.command.extend(["sh", "-c", "trap 'exit 0' USR1; while :; do sleep 1; done"])
    cid = via.runtime.CreateContainer(
        api_pb2.CreateContainerRequest(
            pod_sandbox_id=handle.sandbox_id, config=config, sandbox_config=handle.sandbox_config
        ),
        timeout=30,
    ).container_id
    via.runtime.StartContainer(api_pb2.StartContainerRequest(container_id=cid), timeout=30)
    status = direct.rt.ContainerStatus(api_pb2.ContainerStatusRequest(container_id=cid)).status
    expected = api_pb2.SIGUSR1 if containerd.runtime == "containerd-2" else api_pb2.RUNTIME_DEFAULT
    assert api_pb2.Signal.Name(status.stop_signal) == api_pb2.Signal.Name(expected)


def test_containerd_killed_and_restarted_under_load(
    containerd: RuntimeLab, via: KubeletClient, crihook: CrihookProcess, both: tuple[Stubs, Stubs]
) -> None:
    handle = _pod(via, "restart")
    _, proxied = both
    stop = threading.Event()
    outcomes: list[str] = []
    details: list[str] = []

    def load() -> None:
        while not stop.is_set():
            try:
                proxied.rt.ListContainers(api_pb2.ListContainersRequest(), timeout=2)
                outcomes.append("ok")
            except grpc.RpcError as exc:
                outcomes.append(exc.code().name)
                details.append(f"{exc.code().name}: {exc.details()}")

    workers = [threading.Thread(target=load) for _ in range(4)]
    for w in workers:
        w.start()
    try:
        wait_for(lambda: outcomes.count("ok") > 20, PATIENCE, "load before the kill")
        containerd.kill()
        wait_for(
            lambda: "UNAVAILABLE" in outcomes, PATIENCE, "calls to fail while containerd is down"
        )
        containerd.restart()
        before = outcomes.count("ok")
        wait_for(lambda: outcomes.count("ok") > before + 20, PATIENCE, "calls to succeed again")
    finally:
        stop.set()
        for w in workers:
            w.join(PATIENCE)
    assert crihook.proc is not None and crihook.proc.poll() is None
    # What a client talking to containerd directly sees too: connection errors, and
    # containerd's own answer while its CRI plugin starts.
    unexpected = {
        d
        for d in details
        if not d.startswith(("UNAVAILABLE", "DEADLINE_EXCEEDED"))
        and d != "UNKNOWN: server is not initialized yet"
    }
    assert not unexpected
    # The pod survived (the shims outlive containerd) and is still reachable through crihook.
    status = proxied.rt.ContainerStatus(
        api_pb2.ContainerStatusRequest(container_id=handle.container_ids["app"]), timeout=60
    )
    assert status.status.state == api_pb2.CONTAINER_RUNNING
