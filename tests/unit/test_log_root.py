"""The runner's one detached copy of its root (runner/sandbox/log_root.py; R2, docs/security.md
"Host paths"): the descriptors a sandbox inherits name no host path, through a copy made
before the folders they are in, and a warm folder renamed into ``executions/`` is followed.
Real open_tree; root needed (the kernel refuses the copy otherwise)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shellyard.runner.sandbox.log_root import LogRoot

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="open_tree's copy is root's")

FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC


def _link(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


def _close(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def test_folders_made_after_the_copy_are_opened_through_it(tmp_path: Path) -> None:
    root = tmp_path / "runner"
    root.mkdir()
    logs = LogRoot(root)
    logs.open()
    assert not logs.refused
    try:
        execution = root / "executions" / "ex_1"
        execution.mkdir(parents=True)  # after the copy: the same file system, seen through it
        fds = logs.open_files(execution, ("stdout", "stderr"), FLAGS, 0o600)
        try:
            assert [_link(fd) for fd in fds] == [
                "/executions/ex_1/stdout",
                "/executions/ex_1/stderr",
            ]
            os.write(fds[0], b"through the copy\n")
            assert (execution / "stdout").read_bytes() == b"through the copy\n"
            assert oct((execution / "stdout").stat().st_mode & 0o777) == oct(0o600)
        finally:
            _close(fds)
        warm = root / "sandbox" / "warm" / "warm-1"
        warm.mkdir(parents=True)
        fds = logs.open_files(warm, ("stdout",), FLAGS, 0o600)
        try:
            assert _link(fds[0]) == "/sandbox/warm/warm-1/stdout"
            os.replace(warm, root / "executions" / "ex_2")  # a warm sandbox taken (warm.py)
            assert _link(fds[0]) == "/executions/ex_2/stdout"
        finally:
            _close(fds)
    finally:
        logs.close()


def test_elsewhere_and_after_close_a_copy_of_its_own_no_host_path(tmp_path: Path) -> None:
    root, other = tmp_path / "runner", tmp_path / "build"
    (root / "executions" / "ex_1").mkdir(parents=True)
    other.mkdir()
    logs = LogRoot(root)
    logs.open()
    try:
        (fd,) = logs.open_files(other, ("log",), FLAGS, 0o600)  # an operator's build's log
        assert _link(fd) == "/log"
        os.close(fd)
    finally:
        logs.close()
    (fd,) = logs.open_files(root / "executions" / "ex_1", ("stdout",), FLAGS, 0o600)
    assert _link(fd) == "/stdout"  # no copy of the root any more: never the host path
    os.close(fd)
    for runner in (LogRoot(), LogRoot(root)):  # never opened: a copy per call
        (fd,) = runner.open_files(other, ("log",), FLAGS, 0o600)
        assert str(tmp_path) not in _link(fd)
        os.close(fd)
