"""A folder's overlay of its own (runner/own_mounts.py; R2, docs/security.md "A mount of its
own per workspace"): real mounts in this host's namespace, real threads. Root needed (the
overlays are a root runner's), skipped with the reason otherwise."""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator
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
    own.close()  # its reaper ends: one was left per test before
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


def test_holds_mount_at_the_first_and_unmount_at_the_last(mounts: OwnMounts) -> None:
    """R2: a workspace's folders are mounted while something holds them (a sandbox, a warm
    one, a runner operation): the first hold mounts, a second adds none, the last release
    unmounts; an overlay already there (what a killed runner left) is adopted, not stacked."""
    mounts.linger_s = 0  # the last release unmounts at once
    tree = mounts.parents[0] / "ws"
    tree.mkdir()
    made: list[Path] = []
    mounts.mounted = made.append
    mounts.hold("ws")
    mounts.hold("ws")
    assert mounted_over(tree) == 1 and made == [tree] and mounts.holds("ws") == [2]
    mounts.let_go("ws")
    assert mounted_over(tree) == 1
    mounts.let_go("ws")
    assert mounted_over(tree) == 0 and mounts.holds("ws") == [0]
    mounts.mount(tree)  # a killed runner's overlay, still there at the restart
    with mounts.held("ws"):
        assert mounted_over(tree) == 1 and made == [tree]  # adopted: no new overlay
    assert mounted_over(tree) == 0
    mounts.let_go("ws")  # one too many: refused (logged), nothing unmounted twice
    assert mounts.holds("ws") == [0]


def test_an_overlay_lingers_after_its_last_hold_then_goes(mounts: OwnMounts) -> None:
    """The last release leaves the overlay mounted ``linger_s`` (an unmount costs 8-20 ms,
    a mount 0.3): a hold within it reuses the overlay (no new mount, so the change hints
    stay trusted), the reaper takes it once nothing held it that long."""
    mounts.linger_s = 3600.0  # only an explicit reap past it would unmount
    tree = mounts.parents[0] / "ws"
    tree.mkdir()
    made: list[Path] = []
    mounts.mounted = made.append
    with mounts.held("ws"):
        pass
    assert mounted_over(tree) == 1 and mounts.reap() == 0
    with mounts.held("ws"):
        assert made == [tree]
    mounts.linger_s = 0.0
    mounts.hold("ws")
    assert mounts.reap() == 0 and mounted_over(tree) == 1  # held: never reaped
    mounts.linger_s = 3600.0
    mounts.let_go("ws")
    mounts.linger_s = 0.0
    assert mounts.reap() == 1 and mounted_over(tree) == 0


def test_the_reaper_ends_at_close_and_what_it_had_left_goes_at_the_next_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R2, E11 (docs/security.md "A mount of its own per workspace"): ``close`` ends the
    ``own-mounts`` thread (nothing else would: one per closed owner piled up in a test
    process). An overlay still lingering then is not unmounted by the reaper on its way
    out: it is left to ``unmount_unheld``, which the runner's stop and its next start call
    (a kill -9 skips the stop), so a new owner over the same folders unmounts it."""
    monkeypatch.setenv("SHELLYARD_OWN_MOUNTS", "on")
    before = {t for t in threading.enumerate() if t.name == "own-mounts"}
    workspaces = tmp_path / "workspaces"
    workspaces.mkdir()
    tree = workspaces / "ws"
    tree.mkdir()
    first = OwnMounts(tmp_path / "overlays", (workspaces,))
    if not first.startup():
        pytest.skip("this kernel refuses an overlay here (an upper layer on overlayfs?)")
    again = OwnMounts(tmp_path / "overlays", (workspaces,))
    try:
        assert {t for t in threading.enumerate() if t.name == "own-mounts"} - before
        with first.held("ws"):
            assert mounted_over(tree) == 1
        first.close()  # within the linger (5 s): the reap was still to come
        assert not {t for t in threading.enumerate() if t.name == "own-mounts"} - before
        assert mounted_over(tree) == 1
        assert again.startup()
        again.unmount_unheld()  # the start's sweep (LocalRunner.startup)
        assert mounted_over(tree) == 0
        again.close()
        assert not {t for t in threading.enumerate() if t.name == "own-mounts"} - before
    finally:
        first.close()
        again.close()
        first.unmount(tree)


async def test_a_runner_mounts_a_workspace_only_while_it_is_in_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R2 without the cost of §22: an idle workspace is a plain folder (no mount for bwrap to
    copy into every sandbox); its tree and home are overlays while its command runs and while
    its warm sandbox waits, and go when both have; an edit between commands mounts and
    unmounts them around itself, and what it wrote is seen by the next command. A restart
    unmounts what a killed runner left mounted for no sandbox."""
    import asyncio

    from shellyard.runner.local import LocalRunner
    from shellyard.runner.protocol import StartRequest

    monkeypatch.setenv("SHELLYARD_OWN_MOUNTS", "on")
    tmp_path.chmod(0o711)
    root = tmp_path / "runner"
    runner = LocalRunner(root)
    await runner.startup()
    if not runner._mounts.enabled:
        pytest.skip("this kernel refuses an overlay here")
    runner._mounts.linger_s = 0  # the last release unmounts at once
    folders = [root / "workspaces" / "ws", root / "homes" / "ws"]

    def overlays() -> list[int]:
        return [mounted_over(folder) for folder in folders]

    async def unheld() -> None:
        for _ in range(500):
            if runner._mounts.holds("ws") == [0, 0]:
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"still held: {runner._mounts.holds('ws')}")

    try:
        await runner.ensure_workspace("ws")
        assert overlays() == [0, 0]
        request = StartRequest(execution_id="ex1", workspace_id="ws", command="sleep 1; echo a > f")
        await runner.start(request)
        assert overlays() == [1, 1]
        assert (await runner.wait("ex1", 30)).exit_code == 0
        runner._runs.warm.discard_all("test")  # its warm sandbox holds them until it goes
        await unheld()
        assert overlays() == [0, 0]

        async def data() -> AsyncIterator[bytes]:
            yield b"b\n"

        await runner.write_file("ws", "g", data(), None)
        assert overlays() == [0, 0]
        await runner.start(StartRequest(execution_id="ex2", workspace_id="ws", command="cat f g"))
        done = await runner.wait("ex2", 30)
        assert (
            done.exit_code == 0 and (root / "executions" / "ex2" / "stdout").read_text() == "a\nb\n"
        )
    finally:
        await runner.aclose()
    assert overlays() == [0, 0]
    runner._mounts.enabled = True
    runner._mounts.mount(folders[0])  # a killed runner's overlay of an idle workspace
    again = LocalRunner(root)
    await again.startup()
    try:
        assert overlays() == [0, 0]
    finally:
        await again.aclose()


def test_a_refused_mount_leaves_the_folder_plain_for_that_hold(mounts: OwnMounts) -> None:
    """A mount the kernel refuses (here: no work folder can be made) does not refuse the
    command: the folder stays plain while held, every side sees it the same way, and the
    next held period mounts it."""
    mounts.linger_s = 0
    tree = mounts.parents[0] / "ws"
    tree.mkdir()
    work = mounts._work
    work.rename(work.with_name("work.away"))
    work.write_bytes(b"")  # a file where the work folders go: their mkdir fails
    with mounts.held("ws"):
        assert mounted_over(tree) == 0 and mounts.holds("ws") == [1]
    work.unlink()
    work.with_name("work.away").rename(work)
    with mounts.held("ws"):
        assert mounted_over(tree) == 1
    assert mounted_over(tree) == 0
