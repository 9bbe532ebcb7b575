"""The local-source reader (``managers/readers.py``) is bounded by its progress and dies with
its change: a reader that sends nothing for ``stall_s`` is killed and the copy fails naming
the source; ``kill_all`` (the change abandoned) kills a running one at once and starts no
other. Real processes: the reader, behind a front that stops itself (SIGSTOP) before it
starts, which is a reader that makes no progress, whatever the machine's load."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from shellyard.runner.environments.managers import wheels
from shellyard.runner.environments.managers.base import ManagerError
from shellyard.runner.environments.managers.readers import Readers


def _stopping_front(pidfile: Path) -> list[str]:
    """A front that records its pid, stops itself, and (if ever continued) runs the reader."""
    return ["/bin/sh", "-c", f'echo $$ > {pidfile} && kill -STOP $$ && exec "$@"', "front"]


def _gone(pid: int) -> bool:
    """The process is dead and reaped (a zombie would still hold its pid)."""
    return not os.path.exists(f"/proc/{pid}")


def _wait_for(path: Path) -> int:
    for _ in range(500):
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        time.sleep(0.02)
    raise AssertionError(f"{path} was never written")


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    made = tmp_path / "idx"
    made.mkdir()
    (made / "a-1.0-py3-none-any.whl").write_bytes(b"wheel")
    return made


def test_a_reader_that_sends_nothing_is_killed_and_the_copy_fails_naming_the_path(
    folder: Path, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pid"
    readers = Readers(front=_stopping_front(pidfile), stall_s=0.5)
    with pytest.raises(ManagerError) as caught:
        wheels.copy_tree(folder, tmp_path / "copy", readers)
    assert str(folder) in caught.value.message
    assert "sent nothing for 0.5 s" in caught.value.message, caught.value.message
    assert _gone(_wait_for(pidfile))


def test_a_reader_sending_on_time_is_not_stopped(folder: Path, tmp_path: Path) -> None:
    """The same bound, a reader that sends: the copy is whole (the bound is on silence, not
    on the copy's length)."""
    for number in range(200):
        (folder / f"f{number}.txt").write_bytes(os.urandom(4096))
    assert wheels.copy_tree(folder, tmp_path / "copy", Readers(stall_s=0.5)) == 201
    assert (tmp_path / "copy" / "f199.txt").read_bytes() == (folder / "f199.txt").read_bytes()


def test_kill_all_stops_a_waiting_reader_at_once_and_starts_no_other(
    folder: Path, tmp_path: Path
) -> None:
    """A change abandoned (``EnvironmentStore``: a cancel or the runner's close) kills its
    reader though its stall bound (an hour) is far away; the waiting copy returns."""
    pidfile = tmp_path / "pid"
    readers = Readers(front=_stopping_front(pidfile), stall_s=3600)
    failures: list[ManagerError] = []

    def copy() -> None:
        try:
            wheels.copy_tree(folder, tmp_path / "copy", readers)
        except ManagerError as exc:
            failures.append(exc)

    thread = threading.Thread(target=copy)
    thread.start()
    pid = _wait_for(pidfile)
    readers.kill_all()
    thread.join(timeout=30)
    assert not thread.is_alive(), "the copy still waits on the killed reader"
    assert failures and str(folder) in failures[0].message
    assert _gone(pid)
    with pytest.raises(ManagerError, match="stopped before the reader could start"):
        wheels.copy_tree(folder, tmp_path / "again", readers)
