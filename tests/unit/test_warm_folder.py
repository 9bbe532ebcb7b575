"""A warm sandbox's folder made ahead in a worker thread (runner/sandbox/warm.py
``make_folder``, docs/benchmarks.md §46): every inode its run will use (logs, status,
warm.json, the result's temporary) exists before the spawn, so the loop thread the
foreground run waits on makes none; a failure or a cancelled wait leaves nothing behind."""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from shellyard.runner.sandbox import warm
from shellyard.runner.sandbox.log_root import LogRoot
from shellyard.runner.sandbox.spawn import RESULT_TEMPORARY, write_json_atomic


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_the_folder_holds_every_inode_of_the_run(tmp_path: Path) -> None:
    (tmp_path / "sandbox").mkdir()
    pool = tmp_path / "sandbox" / "warm"  # absent: made the first time
    folder = pool / "warm-1"
    fds = warm.make_folder(LogRoot(), pool, folder)
    try:
        assert sorted(os.listdir(folder)) == sorted(
            ["stdout", "stderr", "status", "warm.json", RESULT_TEMPORARY]
        )
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        for name in os.listdir(folder):
            info = (folder / name).stat()
            assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_size == 0, name
        for fd, name in zip(fds, ("stdout", "stderr", "status"), strict=True):
            assert os.fstat(fd).st_ino == (folder / name).stat().st_ino
            assert os.get_blocking(fd) and os.write(fd, b"x") == 1
    finally:
        for fd in fds:
            os.close(fd)
    # The result's write at the end reuses the temporary's inode: none made then.
    inode = (folder / RESULT_TEMPORARY).stat().st_ino
    write_json_atomic(folder / "result.json", "{}", folder / RESULT_TEMPORARY)
    assert (folder / "result.json").stat().st_ino == inode
    assert not (folder / RESULT_TEMPORARY).exists()


class _Refusing(LogRoot):
    def open_files(self, directory: Path, names: Sequence[str], flags: int, mode: int) -> list[int]:
        raise OSError(28, "No space left on device")


def test_a_failure_leaves_no_folder_and_no_descriptor(tmp_path: Path) -> None:
    before = _open_fds()
    with pytest.raises(OSError, match="No space"):
        warm.make_folder(_Refusing(), tmp_path, tmp_path / "warm-1")
    assert not (tmp_path / "warm-1").exists() and _open_fds() == before
    (tmp_path / "warm-2").mkdir()  # a name taken: refused, the other folder untouched
    (tmp_path / "warm-2" / "kept").write_text("x")
    with pytest.raises(FileExistsError):
        warm.make_folder(LogRoot(), tmp_path, tmp_path / "warm-2")
    assert (tmp_path / "warm-2" / "kept").read_text() == "x" and _open_fds() == before


async def test_a_cancelled_wait_still_removes_what_the_thread_made(tmp_path: Path) -> None:
    """The loop stops while the thread works: its descriptors are closed and its folder
    removed once it is done, nothing left for ``reap`` to guess about."""
    before = _open_fds()
    slow_made = asyncio.Event()
    loop = asyncio.get_running_loop()

    def slow(logs: LogRoot, pool: Path, directory: Path) -> list[int]:
        fds = warm.make_folder(logs, pool, directory)
        loop.call_soon_threadsafe(slow_made.set)
        time.sleep(0.2)  # still working when the wait is cancelled
        return fds

    folder = tmp_path / "warm-1"
    task = asyncio.ensure_future(warm._in_thread(slow, LogRoot(), tmp_path, folder))
    await slow_made.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert folder.exists()  # the thread is not done yet
    deadline = time.monotonic() + 10
    while folder.exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert not folder.exists() and _open_fds() == before
