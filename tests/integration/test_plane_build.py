"""``build(settings)`` (control/plane.py, docs/architecture.md "Wiring"): a build that fails
part-way closes what it had opened before it raises, since its caller gets no plane to close;
a built plane's ``aclose`` closes it all."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from shellyard.config import Settings
from shellyard.control.plane import build


def _open_in(folder: Path) -> list[str]:
    """This process's descriptors that point into ``folder`` (the database, its -wal...)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the listing's own descriptor, closed meanwhile
        if target.startswith(f"{folder}/"):
            found.append(target)
    return found


def _threads() -> set[str]:
    # the loop's default executor keeps its workers for the next to_thread: not a leak
    return {t.name for t in threading.enumerate() if not t.name.startswith("asyncio_")}


async def test_a_build_that_fails_late_leaves_nothing_open(home: Path) -> None:
    settings = Settings(home=home / "home")
    # The local runner's root cannot be made (a file stands where its folder goes): the build
    # fails at the runner's start-up, after the store, the keeper and the registry exist.
    settings.local_runner_root.parent.mkdir(parents=True)
    settings.local_runner_root.write_text("not a folder")
    threads, tasks = _threads(), asyncio.all_tasks()
    with pytest.raises(OSError):
        await build(settings)
    assert (settings.home / "shellyard.db").exists(), "the store was opened before the failure"
    assert _open_in(settings.home) == []
    assert _threads() == threads
    assert asyncio.all_tasks() == tasks

    # the same home builds once its runner root can be made; closing it leaves nothing open
    settings.local_runner_root.unlink()
    plane = await build(settings)
    assert _open_in(settings.home) != []  # the check above sees an open store
    await plane.aclose()
    assert _open_in(settings.home) == []
    assert _threads() == threads
