"""Backup's and restore's copy of the runner folder (docs/operations.md "Backups"; R4: root
copies an agent's tree without ever being led out of it, W6): links are kept as links, never
followed, on the way in and on the way back; holes stay holes (R2)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from shellyard.backup import BASE_LINKS, _copy_tree, _Counter, _link_bases
from shellyard.errors import InvalidInput


def _agent_tree(tmp_path: Path) -> tuple[Path, Path]:
    host = tmp_path / "host"
    host.mkdir(mode=0o700)
    (host / "secret").write_text("host only")
    runner = tmp_path / "runner"
    tree = runner / "workspaces" / "w1" / "tree"
    (tree / "src").mkdir(parents=True)
    (tree / "src" / "main.py").write_text("print('hi')")
    os.symlink(host, tree / "lnk")  # the agent's folder, a link at backup time
    return host, runner


def test_a_folder_that_is_a_link_is_backed_up_and_restored_as_the_link(tmp_path: Path) -> None:
    host, runner = _agent_tree(tmp_path)
    backup_dir = tmp_path / "backup"
    _copy_tree(runner, backup_dir, _Counter())
    copied = backup_dir / "workspaces" / "w1" / "tree"
    assert os.readlink(copied / "lnk") == str(host)
    assert (copied / "src" / "main.py").read_text() == "print('hi')"
    restored = tmp_path / "restored"
    _copy_tree(backup_dir, restored, _Counter())
    back = restored / "workspaces" / "w1" / "tree"
    assert back.joinpath("lnk").is_symlink() and os.readlink(back / "lnk") == str(host)
    assert sorted(os.listdir(host)) == ["secret"]


def test_a_restore_never_writes_through_a_link_it_restored(tmp_path: Path) -> None:
    """A backup whose base-links.jsonl names a path through the agent's link (a changed
    backup): the restore refuses it, and nothing lands in the folder the link names."""
    host, runner = _agent_tree(tmp_path)
    backup_dir = tmp_path / "backup"
    _copy_tree(runner, backup_dir, _Counter())
    base_file = tmp_path / "base.so"
    base_file.write_bytes(b"\x7fELF")
    ref = {"path": "workspaces/w1/tree/lnk/planted", "source": str(base_file), "size": 4}
    (backup_dir / BASE_LINKS).write_text(json.dumps(ref) + "\n")
    restored = tmp_path / "restored"
    _copy_tree(backup_dir, restored, _Counter())
    with pytest.raises(InvalidInput, match="lnk"):
        _link_bases(backup_dir / BASE_LINKS, restored, _Counter())
    assert sorted(os.listdir(host)) == ["secret"]


def test_a_sparse_file_is_copied_without_filling_its_holes(tmp_path: Path) -> None:
    runner = tmp_path / "runner"
    objects = runner / "snapshots" / "objects"
    objects.mkdir(parents=True)
    with open(objects / "big", "wb") as f:
        f.truncate(64 << 20)
        f.write(b"head")
    counter = _Counter()
    _copy_tree(runner, tmp_path / "backup", counter)
    copied = tmp_path / "backup" / "snapshots" / "objects" / "big"
    assert copied.stat().st_size == 64 << 20
    assert copied.read_bytes()[:4] == b"head"
    assert copied.stat().st_blocks * 512 < 1 << 20  # a hole, not 64 MiB of zeros


def test_a_tree_deeper_than_pythons_recursion_limit_is_copied(tmp_path: Path) -> None:
    """An agent's ``mkdir`` loop 1,500 folders deep (paths past PATH_MAX: made by
    descriptors, as a ``cd d`` loop would) must not make every backup fail. Before: a
    RecursionError."""
    runner = tmp_path / "runner"
    tree = runner / "workspaces" / "w1" / "tree"
    tree.mkdir(parents=True)
    fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1500):
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    with open(os.open("bottom", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as f:
        f.write("deep")
    os.close(fd)
    counter = _Counter()
    try:
        _copy_tree(runner, tmp_path / "backup", counter)
        assert counter.files == 1
    finally:
        # pytest's own clean-up recurses (shutil.rmtree): 1,500 levels would fail it, in
        # every later pytest run on this machine too; rm walks without recursion
        subprocess.run(["rm", "-rf", str(runner), str(tmp_path / "backup")], check=True)
