"""A runner killed (SIGKILL) in the middle of its start-up sweep (edits/placing.py
``Placer.startup``: a crashed writer's mark in ``staging/writing/<ws>`` names the tree whose
temp files it removes): the mark is only dropped once every marked tree was swept, so the
next start sweeps that tree again, to the end, and no committed file is lost (W1, R2).

Real runner processes on one root (the first killed mid-sweep, the second in-process); the
kill lands after the sweep removed some of the planted temp files and before the rest: the
child's ``workspace_paths.is_partial`` says so and stops there (a fault injected into the
real sweep, not a replacement of it)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shellyard.runner import workspace_paths
from shellyard.runner.local import LocalRunner

pytestmark = pytest.mark.timeout(180)

#: The runner's start in a child process; after the sweep's 40th temp file it says so on
#: stdout and waits there for the parent's SIGKILL.
STOPS_MID_SWEEP = """
import asyncio, sys, time
from pathlib import Path
from shellyard.runner import workspace_paths
from shellyard.runner.local import LocalRunner

real = workspace_paths.is_partial
seen = 0

def is_partial(name):
    global seen
    found = real(name)
    if found:
        seen += 1
        if seen == 40:
            print("mid-sweep", flush=True)
            time.sleep(3600)
    return found

workspace_paths.is_partial = is_partial
asyncio.run(LocalRunner(Path(sys.argv[1])).startup())
"""

PLANTED = 300


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data


def _partials(tree: Path) -> list[str]:
    return sorted(
        os.path.relpath(os.path.join(folder, name), tree)
        for folder, _dirs, files in os.walk(tree)
        for name in files
        if workspace_paths.is_partial(name)
    )


def _files(tree: Path) -> dict[str, bytes]:
    found: dict[str, bytes] = {}
    for folder, _dirs, files in os.walk(tree):
        for name in files:
            path = Path(folder) / name
            found[str(path.relative_to(tree))] = path.read_bytes()
    return found


def _kill_mid_sweep(root: Path) -> None:
    """Start a runner on ``root`` in a child, SIGKILL it once its sweep removed 40 files."""
    child = subprocess.Popen(
        [sys.executable, "-c", STOPS_MID_SWEEP, str(root)],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], 120)
        line = child.stdout.readline() if ready else b""
        assert line == b"mid-sweep\n", f"the child never reached the sweep ({child.poll()})"
    finally:
        child.kill()
        child.wait()


async def test_a_runner_killed_mid_sweep_sweeps_again_and_loses_no_committed_file(
    tmp_path: Path,
) -> None:
    tmp_path.chmod(0o711)
    root = tmp_path / "runner"
    runner = LocalRunner(root)
    await runner.startup()
    try:
        await runner.ensure_workspace("ws")
        committed = {f"d{i % 3}/f{i}.txt": f"file {i}\n".encode() for i in range(30)}
        committed[".shellyard-partial-notes"] = b"a command's own file, like a temp name\n"
        for path, data in committed.items():
            await runner.write_file("ws", path, _one(data), None)
        head = await runner.head("ws")
        before = await runner.list_dir("ws", None, "", True, None, 1000)
    finally:
        await runner.aclose()
    tree = root / "workspaces" / "ws"
    # what a writer killed mid-operation leaves: its mark and temp files beside targets
    for i in range(PLANTED):
        (tree / f"d{i % 3}" / workspace_paths.temp_name()).write_bytes(b"half written")
    mark = root / "staging" / "writing" / "ws"
    mark.touch()
    assert len(_partials(tree)) == PLANTED

    _kill_mid_sweep(root)
    left = _partials(tree)
    assert 0 < len(left) < PLANTED, len(left)  # killed in the middle of it
    assert mark.exists()  # so the next start knows the tree is not swept yet

    runner = LocalRunner(root)
    await runner.startup()
    try:
        assert _partials(tree) == [], "the second start did not finish the sweep"
        assert not mark.exists()
        assert _files(tree) == committed  # every committed file, unchanged on disk
        again = await runner.commit("ws")
        assert again.seq == head.seq  # nothing to commit: the tree is the committed one
        after = await runner.list_dir("ws", None, "", True, None, 1000)
        assert after.entries == before.entries
        for path, data in committed.items():
            chunk = await runner.read_file("ws", None, path, 0, 1 << 16)
            assert bytes(chunk.data) == data, path
    finally:
        await runner.aclose()


def _outside(tmp_path: Path) -> dict[str, bytes]:
    """Files outside the runner's root (its home), some with temp names, that links in a
    marked tree lead to: the sweep must neither delete nor follow into any of them."""
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    files = {
        "victim.txt": b"outside, reached by a temp-named link\n",
        "hard.txt": b"outside, with a temp-named hard link in the tree\n",
    }
    for _ in range(5):
        files[f"dir/{workspace_paths.temp_name()}"] = b"outside, a temp name in a linked folder\n"
    for name, data in files.items():
        (outside / name).write_bytes(data)
    return files


async def test_the_sweep_after_a_kill_follows_no_link_and_deletes_nothing_outside(
    tmp_path: Path,
) -> None:
    """W1, R2: a kill -9 mid-sweep with links a command planted in the marked tree: a
    temp-named link to an outside file, a temp-named link to an outside folder, a folder
    link (not a temp name) to a folder of temp-named files outside, and a temp-named hard
    link of an outside file (a command can make none to a host file: here planted as the
    root the runner is, across no bind mount). Both starts' sweeps remove only names in the
    tree; every outside file stays, with its content, and the folder link stays a link."""
    tmp_path.chmod(0o711)
    root = tmp_path / "runner"
    runner = LocalRunner(root)
    await runner.startup()
    try:
        await runner.ensure_workspace("ws")
        for i in range(3):
            await runner.write_file("ws", f"d{i}/kept.txt", _one(b"kept\n"), None)
    finally:
        await runner.aclose()
    outside = tmp_path / "outside"
    expected = _outside(tmp_path)
    tree = root / "workspaces" / "ws"
    for i in range(PLANTED):
        (tree / f"d{i % 3}" / workspace_paths.temp_name()).write_bytes(b"half written")
    (tree / "d0" / workspace_paths.temp_name()).symlink_to(outside / "victim.txt")
    (tree / "d1" / workspace_paths.temp_name()).symlink_to(outside / "dir")
    (tree / "linked").symlink_to(outside / "dir")
    os.link(outside / "hard.txt", tree / "d2" / workspace_paths.temp_name())
    (root / "staging" / "writing" / "ws").touch()

    _kill_mid_sweep(root)
    assert 0 < len(_partials(tree)) < PLANTED + 2  # killed in the middle of it
    assert _files(outside) == expected  # nothing outside gone after the killed sweep

    runner = LocalRunner(root)
    await runner.startup()
    try:
        assert _partials(tree) == []
        names = {
            os.path.relpath(os.path.join(folder, name), tree)
            for folder, dirs, files in os.walk(tree)
            for name in dirs + files
        }
        assert names == {"d0", "d1", "d2", "linked", *(f"d{i}/kept.txt" for i in range(3))}
        assert os.readlink(tree / "linked") == str(outside / "dir")
    finally:
        await runner.aclose()
    assert _files(outside) == expected
    assert os.stat(outside / "hard.txt").st_nlink == 1  # only the tree's name went
