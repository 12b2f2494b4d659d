"""Shared pytest configuration: the containerd test bed fixtures live in tests/lab/fixtures.py."""

import atexit
import shutil
import tempfile

from hypothesis import settings
from hypothesis.configuration import set_hypothesis_home_dir

pytest_plugins = ["tests.lab.fixtures"]

# Property tests keep no example database, and their caches live in a temp dir removed at the
# end: a test run leaves nothing in the working tree. No deadline per example: a property
# test asserts what the code does, never how fast (a loaded CI machine took 396 ms for one
# that takes 0.1 ms, and hypothesis failed it as flaky).
settings.register_profile("crihook", database=None, deadline=None)
settings.load_profile("crihook")
_HYPOTHESIS_HOME = tempfile.mkdtemp(prefix="crihook-hypothesis-")
set_hypothesis_home_dir(_HYPOTHESIS_HOME)
atexit.register(shutil.rmtree, _HYPOTHESIS_HOME, True)
