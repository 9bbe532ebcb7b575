"""A folder's overlay of its own (runner/own_mounts.py; R2, docs/security.md "A mount of its
own per workspace"): real mounts in this host's namespace, real threads. Root needed (the
overlays are a root runner's), skipped with the reason otherwise."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shellyard.runner.own_mounts import OwnMounts

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(os.geteuid() != 0, reason="a folder's own overlay is a root runner's"),
]


def mounted_over(folder: Path) -> int:
    """How many mounts of this namespace sit on ``folder`` (mountinfo field 5)."""
    target = str(folder)
    with open("/proc/self/mountinfo") as lines:
        return sum(1 for line in lines if line.split(" ")[4] == target)


@pytest.fixture
def mounts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[OwnMounts]:
    monkeypatch.setenv("SHELLYARD_OWN_MOUNTS", "on")
    workspaces = tmp_path / "workspaces"
    workspaces.mkdir()
    own = OwnMounts(tmp_path / "overlays", (workspaces,))
    if not own.startup():
        pytest.skip("this kernel refuses an overlay here (an upper layer on overlayfs?)")
    yield own
    for folder in workspaces.iterdir():
        own.unmount(folder)


def _race(count: int, action: Callable[[], None]) -> None:
    """``count`` threads released at once on ``action``; the first error raised again."""
    gate = threading.Barrier(count)
    errors: list[BaseException] = []

    def run() -> None:
        gate.wait()
        try:
            action()
        except BaseException as exc:  # a failed mount must fail the test, not vanish
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def test_threads_mounting_one_folder_at_once_stack_one_overlay(mounts: OwnMounts) -> None:
    """``ismount`` then ``mount`` is a check-then-act: two threads making a new home at once
    both saw a plain folder and stacked two overlays, the upper one blind to what went
    through the lower. Under the mount table's lock, one overlay whatever the race."""
    for round_ in range(20):  # the window is a mount(2) wide: many tries, each one must hold
        folder = mounts.parents[0] / f"ws_{round_}"
        folder.mkdir()
        _race(8, lambda folder=folder: mounts.mount(folder))
        assert mounted_over(folder) == 1, f"round {round_}: {mounted_over(folder)} overlays"
        _race(8, lambda folder=folder: mounts.unmount(folder))
        assert mounted_over(folder) == 0
