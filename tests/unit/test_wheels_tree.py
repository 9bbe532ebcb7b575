"""``wheels.copy_tree``: the reader's whole-folder copy of a workspace's index, project folder
or CRAN repository (docs/environments.md "Sources"; docs/security.md, the reader's row). Run
with the reader as this process's own user: the uid drop is the integration tests' part."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shellyard.runner.environments.managers import wheels
from shellyard.runner.environments.managers.base import ManagerError


def _project(root: Path) -> Path:
    folder = root / "proj"
    (folder / "src" / "pkg").mkdir(parents=True)
    (folder / "empty").mkdir()
    (folder / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (folder / "src" / "pkg" / "__init__.py").write_bytes(b"\x00\xff" * 40_000)
    (folder / "build.sh").write_text("#!/bin/sh\n")
    (folder / "build.sh").chmod(0o700)
    return folder


def test_a_tree_is_copied_whole_with_its_folders_bytes_and_execute_bits(tmp_path: Path) -> None:
    folder = _project(tmp_path)
    into = tmp_path / "copy"
    assert wheels.copy_tree(folder, into) == 3
    copied = sorted(str(p.relative_to(into)) for p in into.rglob("*"))
    assert copied == sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))
    for path in folder.rglob("*"):
        twin = into / path.relative_to(folder)
        if path.is_file():
            assert twin.read_bytes() == path.read_bytes()
            assert twin.stat().st_mode & 0o777 == (0o755 if path.name == "build.sh" else 0o644)
        else:
            assert twin.stat().st_mode & 0o777 == 0o755


@pytest.mark.parametrize("where", ["top", "deep"])
def test_a_link_in_the_tree_is_refused_never_followed(tmp_path: Path, where: str) -> None:
    folder = _project(tmp_path)
    secret = tmp_path / "secret"
    secret.write_text("not for the build")
    link = folder / "readme" if where == "top" else folder / "src" / "pkg" / "data"
    link.symlink_to(secret)
    into = tmp_path / "copy"
    with pytest.raises(ManagerError, match="is a symbolic link"):
        wheels.copy_tree(folder, into)
    assert not any(b"not for the build" in p.read_bytes() for p in into.rglob("*") if p.is_file())


def test_a_fifo_in_the_tree_is_refused_without_blocking(tmp_path: Path) -> None:
    folder = _project(tmp_path)
    os.mkfifo(folder / "pipe")
    with pytest.raises(ManagerError, match="neither a regular file nor a folder"):
        wheels.copy_tree(folder, tmp_path / "copy")


def test_a_tree_over_the_bounds_is_refused_naming_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _project(tmp_path)
    monkeypatch.setattr(wheels, "TREE_ENTRIES", 4)
    with pytest.raises(ManagerError, match="more than 4 files and folders"):
        wheels.copy_tree(folder, tmp_path / "a")
    monkeypatch.setattr(wheels, "TREE_ENTRIES", 100)
    monkeypatch.setattr(wheels, "TREE_BYTES", 1000)
    with pytest.raises(ManagerError, match="more than 1000 bytes"):
        wheels.copy_tree(folder, tmp_path / "b")
