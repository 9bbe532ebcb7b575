"""An execution's small records on disk (runner/sandbox/spawn.py): meta.json and
result.json replaced whole through a temporary file (E11 re-attach reads them after a
crash), a warm sandbox's warm.json made in one write, and ``warm.reap`` taking a torn
warm.json as no record (it removes the folder all the same)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from shellyard.runner.sandbox import warm
from shellyard.runner.sandbox.spawn import write_json_atomic, write_json_once


def test_atomic_write_replaces_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "meta.json"
    write_json_atomic(path, json.dumps({"pid": 1}))
    write_json_atomic(path, json.dumps({"pid": 2, "text": "é" * 5000}))
    assert json.loads(path.read_text()) == {"pid": 2, "text": "é" * 5000}
    assert sorted(os.listdir(tmp_path)) == ["meta.json"]
    assert path.stat().st_mode & 0o777 == 0o600


def test_once_write_fills_the_file_made_ahead_only(tmp_path: Path) -> None:
    """warm.json is made empty with the warm folder (``warm.make_folder``, in a worker
    thread): the write on the loop makes no inode, and never makes a file itself."""
    path = tmp_path / "warm.json"
    with pytest.raises(FileNotFoundError):
        write_json_once(path, "{}")
    path.touch(mode=0o600)
    inode = path.stat().st_ino
    write_json_once(path, json.dumps({"sandbox_id": "warm-1", "pid": 7}))
    assert json.loads(path.read_text()) == {"sandbox_id": "warm-1", "pid": 7}
    assert path.stat().st_ino == inode and path.stat().st_mode & 0o777 == 0o600


def test_reap_removes_a_warm_folder_whose_record_is_torn(tmp_path: Path) -> None:
    torn = tmp_path / "warm-torn"
    torn.mkdir()
    (torn / "warm.json").write_text('{"sandbox_id": "warm-to')
    empty = tmp_path / "warm-empty"
    empty.mkdir()
    (empty / "warm.json").write_text("")
    assert warm.reap(tmp_path) == 2
    assert list(tmp_path.iterdir()) == []


def test_atomic_write_over_a_spare_file_reuses_its_inode(tmp_path: Path) -> None:
    """docs/benchmarks.md §36: a warm sandbox's warm.json, no longer read once taken, is
    written over and renamed to meta.json: whole, 0600, no new inode, nothing left behind."""
    spare = tmp_path / "warm.json"
    spare.touch(mode=0o600)
    write_json_once(spare, json.dumps({"sandbox_id": "warm-1", "pid": 7}))
    inode = spare.stat().st_ino
    path = tmp_path / "meta.json"
    write_json_atomic(path, json.dumps({"pid": 2, "text": "é" * 5000}), spare)
    assert json.loads(path.read_text()) == {"pid": 2, "text": "é" * 5000}
    assert path.stat().st_ino == inode and path.stat().st_mode & 0o777 == 0o600
    assert sorted(os.listdir(tmp_path)) == ["meta.json"]
    write_json_atomic(path, "{}", tmp_path / "gone.json")  # no spare left: made, as .tmp is
    assert json.loads(path.read_text()) == {} and sorted(os.listdir(tmp_path)) == ["meta.json"]
