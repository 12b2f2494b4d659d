"""pytest fixtures for the containerd test bed (registered by tests/conftest.py).

- ``lab_images`` (session): the pause and busybox archives, cached in /tmp/crihook-lab-images.
- ``containerd`` (session): one private CRI runtime per runtime for the whole run, cleaned up
  at the end even when tests fail: a :class:`tests.lab.runtime_lab.RuntimeLab`. Parametrized
  by ``containerd_version`` ("1.6": Debian's containerd, "2": containerd 2.x built by
  tests.lab.peers, "crio": CRI-O built by tests.lab.peers); which runtimes a test gets is
  the ``--containerd`` option (alias ``--runtime``) and the ``both_containerds`` and
  ``on_crio`` markers (:mod:`tests.lab.containerd_versions`). Test ids say the runtime:
  ``[containerd-2]``, ``[crio]``. Not root, or the runtime cannot start: the tests fail
  with the reason (nothing is skipped).
- ``pod_cleanup`` (function): at teardown removes every sandbox that appeared on the lab
  containerd during the test, whoever created it (directly or through crihook).
- ``kubelet_direct`` (function): a KubeletClient on containerd's own socket; its pods are
  removed by ``pod_cleanup``.

``--data-path grpc|h2`` chooses the data path of every crihook the tests start without
naming one (tests/lab/crihook_proc.py); the fault and real-containerd proxy tests run on both.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest

from tests.lab import containerd_versions, peers
from tests.lab.containerd import LabError
from tests.lab.crihook_proc import DATA_PATH_ENV, DATA_PATHS, clean_up_after, made_so_far
from tests.lab.images import DEFAULT_CACHE_DIR, LabImages, build_images
from tests.lab.kubelet import KubeletClient, PodHandle
from tests.lab.runtime_lab import RuntimeLab

__all__ = [
    "PodCleanup",
    "containerd",
    "containerd_version",
    "kubelet_direct",
    "lab_images",
    "pod_cleanup",
]

# Short on purpose: <dir>/containerd.sock must fit the 107-byte unix socket limit.
LAB_DIR_PREFIX = "crihook-lab-"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        containerd_versions.OPTION,
        containerd_versions.OPTION_ALIAS,
        choices=containerd_versions.CHOICES,
        default=containerd_versions.DEFAULT,
        help="runtimes for the real-runtime tests: auto (default: every test on containerd "
        f"1.6, modules marked {containerd_versions.BOTH_MARKER} also on 2.x, modules marked "
        f"{containerd_versions.CRIO_MARKER} also on CRI-O), 1.6, 2, crio, both (every test on "
        "both containerds) or all (every test on all three)",
    )
    parser.addoption(
        "--data-path",
        choices=DATA_PATHS,
        default=None,
        help="the data path of every crihook started without one (default: "
        f"${DATA_PATH_ENV}, or crihook's own default)",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--data-path"):
        os.environ[DATA_PATH_ENV] = config.getoption("--data-path")
    config.addinivalue_line(
        "markers",
        f"{containerd_versions.BOTH_MARKER}: real-containerd tests that run on containerd 1.6 "
        "and 2.x by default (--containerd auto)",
    )
    config.addinivalue_line(
        "markers",
        f"{containerd_versions.CRIO_MARKER}: real-runtime tests that also run on CRI-O by "
        "default (--containerd auto)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test that uses the ``containerd`` fixture gets one run per chosen runtime."""
    if "containerd_version" not in metafunc.fixturenames:
        return
    marked = metafunc.definition.get_closest_marker
    versions = containerd_versions.versions_for(
        metafunc.config.getoption(containerd_versions.OPTION),
        marked_both=marked(containerd_versions.BOTH_MARKER) is not None,
        marked_crio=marked(containerd_versions.CRIO_MARKER) is not None,
    )
    metafunc.parametrize(
        "containerd_version",
        versions,
        indirect=True,
        scope="session",  # one runtime each; pytest groups the tests by it
        ids=[containerd_versions.runtime_id(v) for v in versions],
    )


@pytest.fixture(autouse=True, scope="session")
def _session_leftovers_removed() -> Iterator[None]:
    """What module and session fixtures made (short temp dirs, crihook processes) goes at
    the end of the session."""
    yield
    clean_up_after()


@pytest.fixture(autouse=True)
def _test_leftovers_removed(_session_leftovers_removed: None) -> Iterator[None]:
    """Every test leaves /tmp as it found it: the short temp dirs it made (sockets, state
    dirs, plugin dirs) go after its other fixtures stopped what used them, and a crihook it
    started and did not stop is killed. Wider-scoped fixtures are set up before this one
    (pytest sets up higher scopes first), so what they made is before the mark and stays."""
    mark = made_so_far()
    yield
    clean_up_after(mark)


@pytest.fixture(scope="session")
def lab_images() -> LabImages:
    try:
        return build_images(DEFAULT_CACHE_DIR)
    except Exception as exc:
        pytest.fail(f"building the lab images failed: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def containerd_version(request: pytest.FixtureRequest) -> str:
    """The runtime, "1.6", "2" or "crio": set by pytest_generate_tests for each test."""
    version: str = request.param
    return version


@pytest.fixture(scope="session")
def containerd(containerd_version: str, lab_images: LabImages) -> Iterator[RuntimeLab]:
    """The lab runtime (named for the first one; CRI-O too: the suites are the same)."""
    if os.geteuid() != 0:
        pytest.fail("the runtime lab needs root (run the tests as root)", pytrace=False)
    failure = ""
    try:
        lab = peers.lab_runtime(
            containerd_version, tempfile.mkdtemp(prefix=LAB_DIR_PREFIX, dir="/tmp"), lab_images
        )
    except (LabError, peers.PeerError) as exc:
        failure = f"{containerd_versions.runtime_id(containerd_version)} is not available: {exc}"
    if failure:
        pytest.fail(f"{failure}\n(run sh deploy/setup.sh)", pytrace=False)
    try:
        lab.start()
    except BaseException as exc:  # also Ctrl-C: never leave a half-started containerd
        try:
            lab.cleanup()
        except LabError as cleanup_exc:
            exc.add_note(str(cleanup_exc))
        if not isinstance(exc, Exception):
            raise
        notes = "".join(f"\n{n}" for n in getattr(exc, "__notes__", []))
        failure = f"{lab.runtime} lab did not start: {exc}{notes}"
    if failure:  # outside the except block, so the report is not a chained traceback
        pytest.fail(f"{failure}\n(run tests/lab/install.sh if packages are missing)", pytrace=False)
    try:
        yield lab
    finally:
        lab.cleanup()


class PodCleanup:
    """Removes, at teardown, the sandboxes created on ``containerd`` since construction."""

    def __init__(self, containerd: RuntimeLab, client: KubeletClient) -> None:
        self.containerd = containerd
        self.client = client
        self._before = {p.id for p in client.list_pods()}
        self.handles: list[PodHandle] = []

    def add(self, handle: PodHandle) -> PodHandle:
        """Record a handle explicitly (optional: every new sandbox is removed anyway)."""
        self.handles.append(handle)
        return handle

    def new_sandbox_ids(self) -> list[str]:
        return [p.id for p in self.client.list_pods() if p.id not in self._before]

    def cleanup(self) -> None:
        # A fault test may have stopped or killed containerd: removal goes through CRI.
        self.containerd.ensure_running()
        parents = {h.sandbox_id: h.cgroup_parent for h in self.handles}
        errors: list[str] = []
        for sandbox_id in self.new_sandbox_ids():
            try:
                self.client.remove_pod_by_id(sandbox_id, cgroup_parent=parents.get(sandbox_id))
            except Exception as exc:  # try every pod, report all at the end
                errors.append(f"{sandbox_id[:12]}: {exc!r}")
        if errors:
            raise LabError("pod cleanup failed:\n  " + "\n  ".join(errors))


@pytest.fixture
def pod_cleanup(containerd: RuntimeLab) -> Iterator[PodCleanup]:
    containerd.ensure_running()
    with KubeletClient(containerd.endpoint, log_root=containerd.pod_log_dir) as client:
        tracker = PodCleanup(containerd, client)
        yield tracker
        tracker.cleanup()


@pytest.fixture
def kubelet_direct(containerd: RuntimeLab, pod_cleanup: PodCleanup) -> Iterator[KubeletClient]:
    with KubeletClient(containerd.endpoint, log_root=containerd.pod_log_dir) as client:
        yield client
