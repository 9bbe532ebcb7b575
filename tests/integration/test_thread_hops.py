"""A foreground command's path stays on the event loop's thread where a worker thread's
hop cost more CPU than the work (docs/benchmarks.md §36, "Thread hops"): the snapshot commit
of a workspace nothing changed in (W3's change hints say so at once) and the next warm
sandbox's spawn (its cgroups made ahead, R2). Real bubblewrap, real inotify and cgroups; the
spies only note the thread each call ran on. Whatever changed is still committed whole
before the end is answered (E3, W3)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from shellyard.runner.local import LocalRunner
from shellyard.runner.protocol import RunnerExecState, SandboxPolicy, StartRequest
from shellyard.runner.sandbox.spawn import PendingSpawn
from shellyard.runner.snapshots.store import SnapshotStore

WS = "ws-hops"


@pytest.fixture
async def runner(tmp_path: Path) -> AsyncIterator[LocalRunner]:
    local = LocalRunner(tmp_path / "runner", SandboxPolicy())
    await local.startup()
    try:
        yield local
    finally:
        await local.aclose()


async def finished(local: LocalRunner, execution_id: str, command: str) -> Any:
    await local.start(StartRequest(execution_id=execution_id, workspace_id=WS, command=command))
    record = await local.wait(execution_id, 60)
    while record.state == RunnerExecState.running:
        record = await local.wait(execution_id, 60)
    assert record.exit_code == 0, record.error
    return record


async def test_an_unchanged_workspace_s_commit_is_answered_on_the_loop(
    runner: LocalRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """W3, E3: after ``true`` the head is answered on the loop's thread, the full commit not
    called; a command that writes is committed (on a worker thread) into a new snapshot
    holding what it wrote before its end is answered; ``true`` after it answers that one."""
    loop_thread = threading.current_thread().name
    full: list[str] = []
    real = SnapshotStore.commit

    def commit(self: SnapshotStore, *args: Any, **kwargs: Any) -> Any:
        full.append(threading.current_thread().name)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(SnapshotStore, "commit", commit)
    await runner.ensure_workspace(WS)
    await finished(runner, "e1", "true")  # the first: a full walk sets the watches up
    await finished(runner, "e2", "true")
    full.clear()
    same = await finished(runner, "e3", "true")
    assert full == []  # answered by ``commit_if_unchanged``, on the loop
    assert same.snapshot is not None and not same.snapshot.new
    wrote = await finished(runner, "e4", "echo hello > made.txt")
    assert full and loop_thread not in full  # a change: the full commit, off the loop
    assert wrote.snapshot is not None and wrote.snapshot.new
    assert wrote.snapshot.seq == same.snapshot.seq + 1
    chunk = await runner.read_file(WS, wrote.snapshot.seq, "made.txt", 0, 100)
    assert chunk.data == b"hello\n"
    full.clear()
    await finished(runner, "e5", "true")  # the racily clean folder is scanned again ...
    full.clear()
    after = await finished(runner, "e6", "true")  # ... then nothing changed: on the loop
    assert full == []
    assert after.snapshot is not None and after.snapshot.seq == wrote.snapshot.seq
    assert after.snapshot.root_hash == wrote.snapshot.root_hash


async def test_the_next_warm_sandbox_is_spawned_on_the_loop(
    runner: LocalRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next warm sandbox's bwrap is spawned on the loop's thread (its cgroups, R2, an
    earlier execution's used again or made ahead by the removal thread), and a command takes
    it: its execution's record names the group it ran in."""
    loop_thread = threading.current_thread().name
    spawned: list[str] = []
    real = PendingSpawn.spawn

    def spawn(self: PendingSpawn) -> Any:
        spawned.append(threading.current_thread().name)
        return real(self)

    monkeypatch.setattr(PendingSpawn, "spawn", spawn)
    await runner.ensure_workspace(WS)
    warm = runner._runs.warm
    # Each next sandbox is made 200 ms into a 500 ms command (docs/operations.md "Warm
    # sandboxes"), when the group the previous command's end left has long been used again
    # or made ahead: made right at an end, it may race that group's reset on a loaded host.
    warm.after_s = 0.2
    command = "sleep 0.5"
    await finished(runner, "e1", command)
    for index in range(2, 5):
        deadline = time.monotonic() + 10
        while WS not in warm.waiting():
            assert time.monotonic() < deadline, "no warm sandbox was made"
            await asyncio.sleep(0.02)
        spawned.clear()
        await finished(runner, f"e{index}", command)
        while WS not in warm.waiting():  # the next one, made while this one ran
            assert time.monotonic() < deadline, "no warm sandbox was made while it ran"
            await asyncio.sleep(0.02)
        assert spawned == [loop_thread]
        record = json.loads((runner.root / "executions" / f"e{index}" / "meta.json").read_text())
        assert record["sandbox_id"].startswith("warm-")  # it took a warm sandbox
        if runner._sandboxes.cgroups is not None and index > 2:  # made ahead of it
            assert record["cgroup"], record  # one waiting for it (used again or made ahead)
    assert warm.stats["taken"] >= 3
