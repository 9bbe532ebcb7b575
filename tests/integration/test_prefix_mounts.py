"""A prefix's overlay of its own (runner/prefix_mounts.py; V4, R2, docs/security.md "Host
paths"): real overlays in this host's namespace, real processes as holders, real bwrap.
Root needed (the overlays are a root runner's), skipped with the reason otherwise."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from shellyard.runner.prefix_mounts import PrefixMounts

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(os.geteuid() != 0, reason="a prefix's own overlay is a root runner's"),
]


def mounts_under(folder: Path) -> list[str]:
    """Mount points of this namespace at or below ``folder`` (mountinfo field 5)."""
    with open("/proc/self/mountinfo") as lines:
        points = [line.split(" ")[4] for line in lines]
    return [p for p in points if p == str(folder) or p.startswith(f"{folder}/")]


@pytest.fixture
def prefix(tmp_path: Path) -> Path:
    made = tmp_path / "environments" / "env1" / "prefix"
    (made / "bin").mkdir(parents=True)
    (made / "bin" / "tool").write_text("one\n")
    return made


@pytest.fixture
def prefixes(tmp_path: Path) -> Iterator[PrefixMounts]:
    own = PrefixMounts(tmp_path / "prefixes")
    own.linger_s = 0  # no reaper thread: each test reaps when it says so
    own.startup(True)
    yield own
    own.close()
    assert mounts_under(tmp_path) == []


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "600"])


def ended(process: subprocess.Popen[bytes]) -> None:
    process.kill()
    process.wait()


def test_a_hold_binds_an_overlay_that_goes_after_its_holder(
    prefixes: PrefixMounts, prefix: Path
) -> None:
    """The prefix is replaced by a read-only overlay of it (its files, nothing writable), held
    by the spawned process until it exits; then reaped, mount point and all."""
    binds, hold = prefixes.hold([(prefix, Path("/env"))])
    ((point, seen),) = binds
    assert seen == Path("/env") and point != prefix and os.path.ismount(point)
    assert (point / "bin" / "tool").read_text() == "one\n"
    with pytest.raises(OSError, match="Read-only file system"):
        (point / "bin" / "new").write_text("x")
    holder = sleeper()
    hold.attach(holder.pid)
    hold.close()  # after a spawn: nothing more to let go
    assert prefixes.reap() == 0 and os.path.ismount(point)  # its holder runs
    ended(holder)
    assert prefixes.reap() == 1 and not point.exists()
    assert prefixes.holds() == {}


def test_a_spawn_that_never_happened_lets_go(prefixes: PrefixMounts, prefix: Path) -> None:
    binds, hold = prefixes.hold([(prefix, Path("/env"))])
    assert prefixes.holds() == {binds[0][0]: 1}
    hold.close()
    assert prefixes.reap() == 1 and mounts_under(prefixes.directory) == []


def test_holds_of_one_prefix_share_one_overlay(prefixes: PrefixMounts, prefix: Path) -> None:
    first, one = prefixes.hold([(prefix, Path("/env"))])
    second, two = prefixes.hold([(prefix, Path("/env"))])
    assert first == second and len(mounts_under(prefixes.directory)) == 1
    one.close()
    assert prefixes.reap() == 0  # the second still holds it
    two.close()
    assert prefixes.reap() == 1


def test_a_changed_prefix_gets_a_new_overlay_and_the_old_stays_with_its_holder(
    prefixes: PrefixMounts, prefix: Path
) -> None:
    """overlayfs leaves a lower layer changed under it undefined: a name looked up before it
    was made stays missing. A change (its journal written beside the prefix, files added and
    removed) makes the next hold mount a new overlay, which sees the change; the old one is
    not pulled from under its holder, and goes when that holder does."""
    ((old, _),), old_hold = prefixes.hold([(prefix, Path("/env"))])
    holder = sleeper()
    old_hold.attach(holder.pid)
    assert not (old / "bin" / "added").exists()  # a negative lookup, cached by the overlay
    journal = prefix.parent / "journal.json"
    journal.write_text("{}")  # what a change does first (store.py)
    (prefix / "bin" / "added").write_text("two\n")
    (prefix / "bin" / "tool").unlink()
    journal.unlink()
    ((new, _),), new_hold = prefixes.hold([(prefix, Path("/env"))])
    new_hold.close()
    assert new != old and os.path.ismount(old) and os.path.ismount(new)
    assert (new / "bin" / "added").read_text() == "two\n"
    assert not (new / "bin" / "tool").exists()
    assert prefixes.reap() == 1 and not new.exists()  # nothing holds the new one
    ended(holder)
    assert prefixes.reap() == 1 and mounts_under(prefixes.directory) == []


def test_holds_racing_the_reaper_always_get_a_mounted_overlay(
    prefixes: PrefixMounts, prefix: Path
) -> None:
    """A hold and the reaper meet on one prefix: the reaper may unmount an idle overlay just
    as a hold takes it. Every hold must come back with a mounted overlay (bwrap binds it
    next), and once all let go, all is reaped."""
    stop = threading.Event()
    failures: list[str] = []

    def reaper() -> None:
        while not stop.is_set():
            prefixes.reap()

    def holder() -> None:
        for _ in range(150):
            ((point, _),), hold = prefixes.hold([(prefix, Path("/env"))])
            if not os.path.ismount(point):
                failures.append(f"{point} not mounted when held")
            hold.close()

    threads = [threading.Thread(target=reaper)] + [
        threading.Thread(target=holder) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads[1:]:
        thread.join()
    stop.set()
    threads[0].join()
    assert failures == []
    prefixes.reap()
    assert prefixes.holds() == {} and mounts_under(prefixes.directory) == []


def test_a_failed_mount_binds_the_prefix_itself(prefixes: PrefixMounts, tmp_path: Path) -> None:
    """A prefix missing (bwrap says so, as before) is bound as given, nothing held."""
    gone = tmp_path / "nowhere" / "prefix"
    binds, hold = prefixes.hold([(gone, Path("/env"))])
    assert binds == [(gone, Path("/env"))] and prefixes.holds() == {}
    hold.close()


LEFT_BEHIND = """
import subprocess, sys, time
from pathlib import Path
from shellyard.runner.prefix_mounts import PrefixMounts
own = PrefixMounts(Path(sys.argv[1]))
own.startup(True)
(point, _), = own.hold([(Path(sys.argv[2]), Path("/env"))])[0]
print(point, flush=True)
time.sleep(600)
"""


def test_a_restart_after_kill_9_unmounts_what_was_left(tmp_path: Path, prefix: Path) -> None:
    """A runner killed (SIGKILL) leaves its overlays mounted in the host's namespace; the
    next start adopts them as idle (a sandbox spawned just before the kill may still be
    binding one) and the reaper unmounts them a linger later (the sandboxes bound to them
    keep their own copies)."""
    directory = tmp_path / "prefixes"
    child = subprocess.Popen(
        [sys.executable, "-c", LEFT_BEHIND, str(directory), str(prefix)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        point = Path(child.stdout.readline().strip())
        assert os.path.ismount(point)
    finally:
        child.kill()
        child.wait()
    assert mounts_under(directory) == [str(point)]  # what kill -9 left
    again = PrefixMounts(directory)
    again.linger_s = 0
    again.startup(True)
    try:
        assert mounts_under(directory) == [str(point)]  # adopted, not pulled at once
        assert again.reap() == 1
        assert mounts_under(directory) == [] and not point.exists()
    finally:
        again.close()


def test_the_reaper_ends_at_close_and_close_unmounts_what_it_had_left(
    tmp_path: Path, prefix: Path
) -> None:
    """V4, R2, E11 (docs/security.md "A prefix's own overlay"): ``close`` ends the
    ``prefixes`` thread (nothing else would: one per closed owner would pile up in a test
    process), and the overlay it was still to reap (its holder gone, within the linger) is
    unmounted by ``close`` itself (detached: a sandbox bound to it keeps its copy)."""
    before = {t for t in threading.enumerate() if t.name == "prefixes"}
    own = PrefixMounts(tmp_path / "prefixes")
    own.startup(True)  # the default linger (5 s): a reaper thread
    try:
        assert {t for t in threading.enumerate() if t.name == "prefixes"} - before
        ((point, _),), hold = own.hold([(prefix, Path("/env"))])
        holder = sleeper()
        hold.attach(holder.pid)
        hold.close()
        ended(holder)
        assert os.path.ismount(point)  # lingering: the reaper's, a linger from now
        own.close()
        assert not {t for t in threading.enumerate() if t.name == "prefixes"} - before
        assert mounts_under(tmp_path) == [] and not point.exists()
    finally:
        own.close()


def test_a_hold_that_meets_the_reaper_between_lookup_and_lock_mounts_anew(
    prefixes: PrefixMounts, prefix: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race above made certain: the reaper unmounts and drops an idle overlay after a
    hold has looked it up and before it takes its lock. The hold must not mount on the
    dropped entry (no reaper would see it again: a mount left for the runner's life)."""
    ((point, _),), hold = prefixes.hold([(prefix, Path("/env"))])
    hold.close()
    lookup = prefixes._overlay

    def reaped_between(at: Path) -> object:
        found = lookup(at)
        prefixes.reap()  # the reaper's turn, between the lookup and the lock
        return found

    monkeypatch.setattr(prefixes, "_overlay", reaped_between)
    ((again, _),), hold = prefixes.hold([(prefix, Path("/env"))])
    assert again == point and os.path.ismount(point)
    hold.close()
    monkeypatch.setattr(prefixes, "_overlay", lookup)
    assert prefixes.reap() == 1 and mounts_under(prefixes.directory) == []


def test_a_holder_past_descriptor_1024_is_seen_to_end(prefixes: PrefixMounts, prefix: Path) -> None:
    """A runner with many executions has descriptors past 1024 (logs, pidfds): a holder's
    pidfd there is still seen to exit (``select`` refuses such a descriptor; poll does not)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"this process may open {hard} descriptors, not past 1024")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    filler = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
    try:
        ((point, _),), hold = prefixes.hold([(prefix, Path("/env"))])
        holder = sleeper()
        hold.attach(holder.pid)
        assert prefixes.reap() == 0
        ended(holder)
        assert prefixes.reap() == 1 and not point.exists()
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize("refusal", [errno.EMFILE, errno.ENOSYS])
def test_a_holder_the_kernel_gives_no_pidfd_of_still_holds(
    prefixes: PrefixMounts, prefix: Path, monkeypatch: pytest.MonkeyPatch, refusal: int
) -> None:
    """E11: when ``pidfd_open`` is refused (EMFILE at the descriptor limit, ENOSYS before
    Linux 5.3: injected here, as in test_attack_pass_49b), the spawn is not failed after its
    sandbox started and the overlay is not left unheld under a running sandbox: the holder is
    kept by its pid and start time, and the overlay goes once that process has exited.
    (Before: ``attach`` raised the OSError out of a spawn that had happened.)"""

    def refused(pid: int, flags: int = 0) -> int:
        raise OSError(refusal, os.strerror(refusal))

    binds, hold = prefixes.hold([(prefix, Path("/env"))])
    ((point, _),) = binds
    holder = sleeper()
    monkeypatch.setattr(os, "pidfd_open", refused)
    hold.attach(holder.pid)
    hold.close()
    assert prefixes.holds() == {point: 1}
    assert prefixes.reap() == 0 and os.path.ismount(point)  # its holder runs
    ended(holder)
    assert prefixes.reap() == 1 and not point.exists()
    assert prefixes.holds() == {}
