"""A foreground command's path stays on the event loop's thread where a worker thread's
hop cost more CPU than the work (docs/benchmarks.md §36, "Thread hops"): the snapshot commit
of a workspace nothing changed in (W3's change hints say so at once). The next warm sandbox's
spawn goes to a worker thread: the loop's thread blocked in vfork until the child exec'd
(docs/benchmarks.md §58); it still takes a group made ahead (R2). Real bubblewrap, real
inotify and cgroups; the spies only note the thread each call ran on (and one holds a spawn
until the loop has answered). Whatever changed is still committed whole before the end is
answered (E3, W3)."""

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


async def warm_waiting(warm: Any, deadline: float, missing: str, every_s: float = 0.02) -> None:
    """Until a warm sandbox of WS waits in the pool; past ``deadline`` (``time.monotonic``)
    the test fails saying ``missing``."""
    while WS not in warm.waiting():
        assert time.monotonic() < deadline, missing
        await asyncio.sleep(every_s)


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


async def test_the_next_warm_sandbox_is_spawned_off_the_loop(
    runner: LocalRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next warm sandbox's bwrap is spawned in a worker thread, never the loop's; its
    cgroups (R2) are an earlier execution's used again or made ahead by the removal thread,
    and a command takes it: its execution's record names the group it ran in."""
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
        await warm_waiting(warm, deadline, "no warm sandbox was made")
        spawned.clear()
        await finished(runner, f"e{index}", command)
        # the next one, made while this one ran
        await warm_waiting(warm, deadline, "no warm sandbox was made while it ran")
        assert len(spawned) == 1 and spawned[0] != loop_thread, spawned
        record = json.loads((runner.root / "executions" / f"e{index}" / "meta.json").read_text())
        assert record["sandbox_id"].startswith("warm-")  # it took a warm sandbox
        if runner._sandboxes.cgroups is not None and index > 2:  # made ahead of it
            assert record["cgroup"], record  # one waiting for it (used again or made ahead)
    assert warm.stats["taken"] >= 3


async def test_the_loop_answers_while_a_warm_sandbox_is_spawned(
    runner: LocalRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warm sandbox's spawn held until the event loop has run a callback: on the loop's own
    thread that could never happen (the hold times out and the spawn goes on unanswered);
    off it, the loop answers at once and the real spawn follows, its sandbox then taken."""
    loop = asyncio.get_running_loop()
    answered: list[bool] = []
    real = PendingSpawn.spawn

    def spawn(self: PendingSpawn) -> Any:
        if self.sandbox_id.startswith("warm-"):  # a cold one is spawned on the loop
            seen = threading.Event()
            loop.call_soon_threadsafe(seen.set)
            answered.append(seen.wait(10))
        return real(self)

    monkeypatch.setattr(PendingSpawn, "spawn", spawn)
    await runner.ensure_workspace(WS)
    warm = runner._runs.warm
    # made 200 ms into a 500 ms command: its group made ahead (R2), the spawn alone held
    warm.after_s = 0.2
    await finished(runner, "e1", "sleep 0.5")  # cold
    for index in range(2, 4):
        deadline = time.monotonic() + 30
        await warm_waiting(warm, deadline, "no warm sandbox was made")
        answered.clear()
        await finished(runner, f"e{index}", "sleep 0.5")  # takes it; the next one is made
        await warm_waiting(warm, deadline, "no warm sandbox was made while it ran")
        assert answered == [True]
        meta = (runner.root / "executions" / f"e{index}" / "meta.json").read_text()
        record = json.loads(meta)
        assert record["sandbox_id"].startswith("warm-")  # a held spawn made a working one
        if runner._sandboxes.cgroups is not None and index > 2:
            assert record["cgroup"], record  # its group made ahead: the spawn alone ran


async def test_the_next_warm_sandbox_made_at_an_end_takes_that_end_s_group(
    runner: LocalRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R2: a warm sandbox made right at a command's end (the command shorter than
    ``after_s``) waits for the group that end hands back to be reset by the removal thread
    (ready_groups.py ``when_ready``, at most ``GROUP_WAIT_S``) and takes it, rather than make a
    group of its own while the reset one waits unused (docs/benchmarks.md §55: on a loaded
    host the spawn raced that reset). The thread's reset is made 300 ms slow here (a loaded
    host's delay, the real reset after it); each command writes 4 MiB, so its group is not
    reset at once at its end but handed to that thread (cgroups.py ``_poolable``, ``_pool``)."""
    cgroups = runner._sandboxes.cgroups
    if cgroups is None:
        pytest.skip("no cgroups on this runner (R2 tenants off)")
    real = type(cgroups)._recycle

    def recycle(self: Any, workspace_id: str, name: str) -> None:
        time.sleep(0.3)
        real(self, workspace_id, name)

    monkeypatch.setattr(type(cgroups), "_recycle", recycle)
    await runner.ensure_workspace(WS)
    warm = runner._runs.warm
    warm.after_s = 3600.0  # made at each end, never during the command
    command = "head -c 4M /dev/zero > written"
    await finished(runner, "e1", command)
    for index in range(2, 6):
        deadline = time.monotonic() + 10
        await warm_waiting(warm, deadline, "no warm sandbox was made at the end", every_s=0.005)
        await finished(runner, f"e{index}", command)
        record = json.loads((runner.root / "executions" / f"e{index}" / "meta.json").read_text())
        assert record["sandbox_id"].startswith("warm-"), record
        if index > 2:  # the first warm one's group: none was handed back yet
            assert record.get("cgroup"), (index, record, dict(warm.stats))
    assert warm.stats["group_waited"] >= 1, dict(warm.stats)
