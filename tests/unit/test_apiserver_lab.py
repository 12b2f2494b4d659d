"""The test bed's API server (tests/lab/apiserver.py) leaves nothing behind when its start
fails inside ``with`` (where ``__exit__`` does not run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.lab.apiserver import ApiServer


def test_a_start_that_fails_in_with_removes_its_dir(tmp_path: Path) -> None:
    server = ApiServer(tmp_path / "no-kube-apiserver", tmp_path / "no-kine")

    with pytest.raises(FileNotFoundError), server:
        pass

    assert not server.dir.exists()
