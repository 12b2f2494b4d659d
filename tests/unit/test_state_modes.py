"""The state directory and the recording are root's alone, on real files: whatever the umask,
crihook's writers make 0600 files (store.json, status.json, hooks/*.json through the one
atomic-write helper, the hook journal, a recording, a recording rewritten by `replay
--update`), and `secure_state_dir` fixes at start what an older crihook left readable."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from crihook.proxy.record.file import RecordFile
from crihook.proxy.state.directory import secure_state_dir
from crihook.proxy.state.journal import JournalFile, write_atomic


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture(autouse=True)
def no_umask() -> Iterator[None]:
    """Nothing may rely on the umask: a 0666 file would stay 0666."""
    previous = os.umask(0)
    yield
    os.umask(previous)


@pytest.mark.parametrize("durable", [True, False], ids=["state-file", "status-file"])
def test_the_atomic_writer_makes_files_only_the_owner_reads(tmp_path: Path, durable: bool) -> None:
    path = tmp_path / "store.json"
    write_atomic(path, b"{}", durable)
    assert mode(path) == 0o600
    path.chmod(0o644)  # an older file is replaced by a private one
    write_atomic(path, b"{}", durable)
    assert mode(path) == 0o600


def test_the_hook_journal_is_made_private_with_its_directory(tmp_path: Path) -> None:
    journal = JournalFile()
    path = tmp_path / "hooks" / "journal-1.jsonl"
    journal.append(path, b"{}\n")
    journal.close()
    assert (mode(path), mode(path.parent)) == (0o600, 0o700)


def test_a_recording_is_private_and_an_older_one_is_made_so(tmp_path: Path) -> None:
    fresh = RecordFile(tmp_path / "new" / "calls.jsonl", max_bytes=1 << 20, keep=2)
    fresh.take([("header", b"{}\n")])
    fresh.close()
    assert (mode(fresh.path), mode(fresh.path.parent)) == (0o600, 0o700)
    older = tmp_path / "old.jsonl"
    older.write_text("{}\n")
    older.chmod(0o644)
    again = RecordFile(older, max_bytes=1 << 20, keep=2)
    again.take([("header", b"{}\n")])
    again.close()
    assert mode(older) == 0o600
    assert older.read_text() == "{}\n{}\n"


def test_an_older_state_directory_is_made_root_s_alone(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "hooks").mkdir(parents=True)
    files = [state / "store.json", state / "status.json", state / "hooks" / "20-cpuset.json"]
    files.append(state / "hooks" / "journal-3.jsonl")
    for path in files:
        path.write_text("{}")
        path.chmod(0o644)
    (state / "hooks" / "odd.json").write_text("{}")
    (state / "hooks" / "odd.json").chmod(0o400)  # fewer bits than 0600: left as they are
    for directory in (state, state / "hooks"):
        directory.chmod(0o755)
    outside = tmp_path / "outside"
    outside.write_text("")
    outside.chmod(0o644)
    (state / "link.json").symlink_to(outside)
    os.mkfifo(state / "fifo", 0o666)  # not a regular file: never opened

    changed = secure_state_dir(state)

    assert {path: mode(path) for path in files} == dict.fromkeys(files, 0o600)
    assert (mode(state), mode(state / "hooks")) == (0o700, 0o700)
    assert mode(state / "hooks" / "odd.json") == 0o400
    assert mode(outside) == 0o644  # a symlink in the state directory is not followed
    assert mode(state / "fifo") == 0o666
    assert sorted(changed) == sorted(
        [f"{state} 0755 -> 0700", f"{state / 'hooks'} 0755 -> 0700"]
        + [f"{path} 0644 -> 0600" for path in files]
    )
    assert secure_state_dir(state) == []  # nothing left to change


def test_a_missing_state_directory_is_made_private(tmp_path: Path) -> None:
    state = tmp_path / "var" / "lib" / "crihook"
    assert secure_state_dir(state) == []
    assert mode(state) == 0o700
