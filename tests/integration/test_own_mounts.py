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


#: A runner process stuck mid-upload: its temp file made beside the target (the staging
#: folder is on another device than the overlay), then the stream stalls until the kill.
STALLED_UPLOAD = """
import asyncio, sys
from pathlib import Path
from shellyard.runner.local import LocalRunner

async def main(root: str, ready: str) -> None:
    runner = LocalRunner(Path(root))
    await runner.startup()
    await runner.ensure_workspace("ws")
    await runner.write_file("ws", "d/a.txt", one(b"a"), None)

    async def stalled():
        yield b"x" * 100_000
        Path(ready).touch()
        await asyncio.sleep(3600)

    await runner.write_file("ws", "d/big.bin", stalled(), None)

async def one(data: bytes):
    yield data

asyncio.run(main(*sys.argv[1:]))
"""


def _partials(tree: Path) -> list[str]:
    return sorted(
        os.path.relpath(os.path.join(folder, name), tree)
        for folder, dirs, files in os.walk(tree)
        for name in [*dirs, *files]
        if name.startswith(".shellyard-partial-")
    )


async def test_a_temp_file_left_by_kill_9_mid_upload_is_never_committed_and_is_swept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R2 beside W1: under its overlay a workspace is on another device than the staging
    folder, so an upload's temp file is made beside its target. A runner killed (SIGKILL)
    mid-upload leaves it there; the restart removes it (the writer's mark in
    ``staging/writing`` names the workspace), and a commit never takes one (planted after
    the restart), while a command's own file of a like name stays and is committed."""
    import subprocess
    import sys
    import time

    from shellyard.runner.local import LocalRunner

    monkeypatch.setenv("SHELLYARD_OWN_MOUNTS", "on")
    tmp_path.chmod(0o711)
    root, ready = tmp_path / "runner", tmp_path / "ready"
    child = subprocess.Popen([sys.executable, "-c", STALLED_UPLOAD, str(root), str(ready)])
    try:
        for _ in range(600):
            if ready.exists() or child.poll() is not None:
                break
            time.sleep(0.05)
        assert ready.exists(), f"the runner never reached the upload (exit {child.poll()})"
        tree = root / "workspaces" / "ws"
        if not os.path.ismount(tree):
            pytest.skip("no overlay here: the temp file is made in the staging folder")
        left = _partials(tree)
        assert len(left) == 1 and left[0].startswith("d/"), left
    finally:
        child.kill()
        child.wait()
    runner = LocalRunner(root)
    await runner.startup()
    try:
        assert _partials(tree) == [], "the restart left the crashed upload's temp file"
        (tree / "d" / ".shellyard-partial-0123456789ab").write_bytes(b"planted")
        (tree / ".shellyard-partial-notes").write_bytes(b"a command's own file")
        await runner.commit("ws")
        listing = await runner.list_dir("ws", None, "", True, None, 1000)
        paths = sorted(entry.path for entry in listing.entries)
        assert paths == [".shellyard-partial-notes", "d", "d/a.txt"], paths
    finally:
        await runner.aclose()
