"""Shared pytest configuration: the containerd test bed fixtures live in tests/lab/fixtures.py."""

import atexit
import shutil
import tempfile

from hypothesis import settings
from hypothesis.configuration import set_hypothesis_home_dir

pytest_plugins = ["tests.lab.fixtures"]

# Property tests keep no example database, and their caches live in a temp dir removed at the
# end: a test run leaves nothing in the working tree.
settings.register_profile("crihook", database=None)
settings.load_profile("crihook")
_HYPOTHESIS_HOME = tempfile.mkdtemp(prefix="crihook-hypothesis-")
set_hypothesis_home_dir(_HYPOTHESIS_HOME)
atexit.register(shutil.rmtree, _HYPOTHESIS_HOME, True)
