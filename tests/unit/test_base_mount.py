"""Which base revision a command mounts (runner/environments/bases.py ``mount``, V4 and
docs/environments.md "Base environments"): read again whenever ``current`` moves, and never
a prefix that is not there, though a start no longer reads the revision's record each time."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from shellyard.runner.environments import bases


def _revision(root: Path, name: str, revision: int, *, venv: bool = True) -> Path:
    prefix = root / name / str(revision) / "prefix"
    (prefix / "bin").mkdir(parents=True)
    if venv:
        (prefix / "pyvenv.cfg").write_text("home = /usr/bin\n")
    record = {"packages": {"numpy": f"2.{revision}"}, "created_at": float(revision)}
    (root / name / f"{revision}.json").write_text(json.dumps(record))
    return prefix


def _point(root: Path, name: str, revision: int) -> None:
    """``current`` moved as ``prepare`` moves it: a new file put in place whole."""
    temp = root / name / "current.tmp"
    temp.write_text(f"{revision}\n")
    os.replace(temp, root / name / "current")


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SHELLYARD_BASES", str(tmp_path))
    return tmp_path


def test_a_moved_current_is_the_revision_the_next_command_mounts(root: Path) -> None:
    first = _revision(root, bases.PYTHON_BASE, 1)
    _point(root, bases.PYTHON_BASE, 1)
    found = bases.mount(bases.PYTHON_BASE)
    assert found is not None
    base, mount = found
    assert (base.revision, mount.prefix, base.packages) == (1, first, {"numpy": "2.1"})
    assert mount.variables["VIRTUAL_ENV"] == str(first)
    assert bases.mount(bases.PYTHON_BASE) == found  # read again: the same answer

    second = _revision(root, bases.PYTHON_BASE, 2, venv=False)
    _point(root, bases.PYTHON_BASE, 2)
    found = bases.mount(bases.PYTHON_BASE)
    assert found is not None
    base, mount = found
    assert (base.revision, mount.prefix, base.packages) == (2, second, {"numpy": "2.2"})
    assert "VIRTUAL_ENV" not in mount.variables  # the variables are the new prefix's

    # The companion r-base appears, then its prefix goes: mounted, then left out.
    companion = _revision(root, bases.R_BASE, 1, venv=False)
    (companion / "lib" / "R" / "library").mkdir(parents=True)
    _point(root, bases.R_BASE, 1)
    found = bases.mount(bases.PYTHON_BASE)
    assert found is not None and found[1].also == ((companion, companion),)
    assert found[1].variables["R_LIBS"] == str(companion / "lib" / "R" / "library")
    (companion / "lib" / "R" / "library").rmdir()
    (companion / "lib" / "R").rmdir()
    (companion / "lib").rmdir()
    (companion / "bin").rmdir()
    companion.rmdir()
    found = bases.mount(bases.PYTHON_BASE)
    assert found is not None and found[1].also == () and "R_LIBS" not in found[1].variables


def test_a_prefix_gone_or_a_current_gone_mounts_nothing(root: Path) -> None:
    prefix = _revision(root, bases.PYTHON_BASE, 1)
    _point(root, bases.PYTHON_BASE, 1)
    assert bases.mount(bases.PYTHON_BASE) is not None
    (prefix / "pyvenv.cfg").unlink()
    (prefix / "bin").rmdir()
    prefix.rmdir()
    assert bases.mount(bases.PYTHON_BASE) is None  # the same current: its prefix is gone
    (root / bases.PYTHON_BASE / "current").unlink()
    assert bases.mount(bases.PYTHON_BASE) is None


def test_a_caller_changing_its_mount_does_not_change_the_next(root: Path) -> None:
    _revision(root, bases.PYTHON_BASE, 1)
    _point(root, bases.PYTHON_BASE, 1)
    found = bases.mount(bases.PYTHON_BASE)
    assert found is not None
    found[1].variables["PATH"] = "/changed"
    again = bases.mount(bases.PYTHON_BASE)
    assert again is not None and again[1].variables["PATH"] != "/changed"
