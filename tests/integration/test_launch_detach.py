"""A sandbox's launcher takes other workspaces' mounts out of the table bwrap copies (R2
tenants, launch.c ``--detach``; docs/benchmarks.md §73): every busy workspace keeps two
overlays and a network namespace mounted below the runner's folder, bwrap copies the whole
table and reads it at each of its binds, so each one made every other workspace's spawn
dearer. Real overlays, a real launcher built with the host's compiler, a real runner with
bubblewrap. Root needed (overlays and mount namespaces are a root runner's)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from leftover_mounts import remove_home
from local_runner import local_runner, process_tag, tagger, workspace_processes
from mount_table import host_points_below, points_below

from shellyard.runner.protocol import StartRequest
from shellyard.runner.sandbox import launch

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(os.geteuid() != 0, reason="mounts and mount namespaces are root's"),
]

eid = tagger(process_tag())


@pytest.fixture
def mounted(tmp_path: Path) -> Iterator[tuple[Path, list[Path]]]:
    """A runner-like folder with five overlays and a tmpfs (holding a socket-like file) below
    it, unmounted afterwards."""
    root = tmp_path / "runner"
    overlays = [root / "workspaces" / f"ws_{i}" for i in range(5)]
    made: list[Path] = []
    try:
        for i, folder in enumerate(overlays):
            work, lower = root / "work" / str(i), tmp_path / "lower" / str(i)
            for path in (folder, work, lower):
                path.mkdir(parents=True)
            options = f"lowerdir={lower},upperdir={folder},workdir={work}"
            subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(folder)],
                           check=True)  # fmt: skip
            made.append(folder)
        egress = root / "egress"
        egress.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(egress)], check=True)
        made.append(egress)
        (egress / "sock").write_text("")
        (overlays[0] / "mine").write_text("through my overlay\n")
        yield root, made
    finally:
        for folder in reversed(made):
            subprocess.run(["umount", "-l", str(folder)], check=False)


def test_the_launcher_leaves_bwrap_only_the_mounts_it_binds_and_the_host_all_of_them(
    tmp_path: Path, mounted: tuple[Path, list[Path]]
) -> None:
    root, made = mounted
    launcher = launch.build(tmp_path / "bin")
    assert launcher is not None, "the host's C compiler built no launcher"
    before = host_points_below(root)
    assert before == {str(p) for p in made}
    keep = made[0]
    seen = subprocess.run(
        [str(launcher), "--detach", str(root), "--keep", str(keep),
         "--keep", str(made[-1] / "sock"), "--keep", str(root / "not-there"),
         "--", "/bin/sh", "-c", f"cat /proc/self/mountinfo; cat {keep}/mine"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    # bwrap would start from a table with the overlay it binds and the tmpfs its socket is
    # on, none of the other four workspaces' overlays
    assert points_below(seen, root) == {str(keep), str(made[-1])}
    assert "through my overlay" in seen
    # and nothing of that reached the host: every overlay is still mounted here
    assert host_points_below(root) == before


def test_with_few_other_workspaces_mounts_the_launcher_keeps_its_callers_namespace(
    tmp_path: Path, mounted: tuple[Path, list[Path]]
) -> None:
    """Under ``DETACH_FROM`` (4) other workspaces' mounts below the runner's folder a namespace
    of its own costs a lone workspace's round trip more than it saves, however many host
    mounts bwrap needs none of (none is kept here: the host's cgroup hierarchies and the rest
    do not count, §78)."""
    root, made = mounted
    for folder in made[2:]:
        subprocess.run(["umount", "-l", str(folder)], check=True)
    launcher = launch.build(tmp_path / "bin")
    assert launcher is not None
    seen = subprocess.run(
        [str(launcher), "--detach", str(root), "--", "/bin/readlink", "/proc/self/ns/mnt"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert seen == os.readlink("/proc/self/ns/mnt")


def _points(table: str) -> set[str]:
    return {line.split(" ")[4] for line in table.splitlines() if len(line.split(" ")) > 4}


@pytest.fixture
def host_mounts(tmp_path: Path) -> Iterator[Path]:
    """Mounts outside a runner's folder, as a host has them: ``unused`` (a tmpfs with one on
    it, like /sys/fs/cgroup), ``shown`` (a bind source with a tmpfs below it) and ``target``
    (a tmpfs a keep names through the link ``link``). Unmounted afterwards."""
    host = tmp_path / "host"
    points = [host / "unused", host / "unused" / "inner", host / "shown", host / "shown" / "inner",
              host / "target"]  # fmt: skip
    made: list[Path] = []
    try:
        for point in points:
            point.mkdir(parents=True)
            subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(point)], check=True)
            made.append(point)
        (host / "shown" / "inner" / "file").write_text("below a bound folder\n")
        (host / "target" / "file").write_text("through a link\n")
        (host / "link").symlink_to(host / "target")
        yield host
    finally:
        for point in reversed(made):
            subprocess.run(["umount", "-l", str(point)], check=False)


def test_the_launcher_leaves_out_the_host_mounts_bwrap_binds_nothing_from(
    tmp_path: Path, mounted: tuple[Path, list[Path]], host_mounts: Path
) -> None:
    """Host mounts no bind source lies on or in (the cgroup hierarchies here) were copied into
    every sandbox's table and formatted again at each of bwrap's binds (§78): left out, the
    topmost of each with what is on it; kept: the root, /proc and /dev (bwrap's own), a
    source's mount and what is mounted below a source (a recursive bind shows it)."""
    root, made = mounted
    launcher = launch.build(tmp_path / "bin")
    assert launcher is not None
    host_before = _points(Path("/proc/self/mountinfo").read_text())
    seen = subprocess.run(
        [str(launcher), "--detach", str(root), "--keep", str(made[0]),
         "--keep", str(host_mounts / "shown"), "--keep", str(host_mounts / "target" / "file"),
         "--", "/bin/sh", "-c",
         f"cat /proc/self/mountinfo; cat {host_mounts}/shown/inner/file {host_mounts}/link/file"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    points = _points(seen)
    assert not {str(host_mounts / "unused"), str(host_mounts / "unused" / "inner")} & points
    assert {str(host_mounts / "shown"), str(host_mounts / "shown" / "inner"),
            str(host_mounts / "target"), str(made[0]), "/", "/proc", "/dev"} <= points  # fmt: skip
    assert "below a bound folder" in seen and "through a link" in seen
    # no other workspace's overlay, and whatever else the host has that nothing binds from
    assert not points_below(seen, root) - {str(made[0])}
    # nothing of it reached the host
    assert _points(Path("/proc/self/mountinfo").read_text()) == host_before


def test_a_host_source_through_a_link_keeps_every_host_mount(
    tmp_path: Path, mounted: tuple[Path, list[Path]], host_mounts: Path
) -> None:
    """bwrap looks a source up again, through every mount its links lie on: a keep through a
    link leaves the host's mounts as they are (attack pass, session 55: the mount a link lay
    on was unmounted and the sandbox read what it hid), while other workspaces' still go."""
    root, made = mounted
    launcher = launch.build(tmp_path / "bin")
    assert launcher is not None
    seen = subprocess.run(
        [str(launcher), "--detach", str(root), "--keep", str(made[0]),
         "--keep", str(host_mounts / "link" / "file"),
         "--", "/bin/sh", "-c", f"cat /proc/self/mountinfo; cat {host_mounts}/link/file"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    points = _points(seen)
    assert {str(host_mounts / "unused"), str(host_mounts / "unused" / "inner")} <= points
    assert "through a link" in seen
    assert not points_below(seen, root) - {str(made[0])}


@pytest.mark.parametrize(
    "arguments",
    [["--detach", "relative"], ["--detach", "/tmp/x/"], ["--keep", "/tmp/x"],
     ["--detach", "/tmp/x", "--keep", "etc"]],
)  # fmt: skip
def test_the_launcher_refuses_a_detach_it_cannot_read(tmp_path: Path, arguments: list[str]) -> None:
    launcher = launch.build(tmp_path / "bin")
    assert launcher is not None
    done = subprocess.run([str(launcher), *arguments, "--", "/bin/true"], capture_output=True,
                          text=True, check=False)  # fmt: skip
    assert done.returncode == 127 and "shellyard-launch:" in done.stderr


async def test_a_busy_workspace_spawn_copies_none_of_the_other_workspaces_mounts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """R2 tenants: four workspaces run (their trees and homes mounted, each its network
    namespace); a fifth one's sandbox was started from a table with its own mounts and none
    of theirs (its bwrap monitor lives in the launcher's namespace: its mountinfo is the
    table bwrap copied), while the host keeps every one of them for the runner."""
    # what a stopped runner leaves mounted for its next start stayed on this host (15 mounts a
    # run, copied into every later sandbox of the suite), even when the test fails or skips
    request.addfinalizer(lambda: remove_home(tmp_path / "runner"))
    monkeypatch.setenv("SHELLYARD_OWN_MOUNTS", "on")
    monkeypatch.setenv("SHELLYARD_WARM_SANDBOXES", "0")
    workspaces = [eid(f"ws{i}") for i in range(5)]
    async with local_runner(tmp_path, *workspaces) as local:
        root = local.root
        started = []
        for workspace in [*workspaces[1:], workspaces[0]]:  # the others' mounts made first
            execution = eid(f"ex-{workspace}")
            await local.start(StartRequest(execution_id=execution, workspace_id=workspace,
                                           command="sleep 60"))  # fmt: skip
            started.append(execution)
        try:
            mine = local.workspace_path(workspaces[0])
            others = [local.workspace_path(w) for w in workspaces[1:]]
            host = host_points_below(root)
            if str(mine) not in host:
                pytest.skip("this kernel mounted no overlay per workspace (own mounts off)")
            assert {str(p) for p in others} <= host
            tables = []
            for _ in range(100):  # the monitor is there once the sandbox started
                for pid in workspace_processes(workspaces[0]):
                    try:  # bwrap's, not the launcher's before its exec (the host's table)
                        if Path(f"/proc/{pid}/comm").read_text().strip() != "bwrap":
                            continue
                        text = Path(f"/proc/{pid}/mountinfo").read_text()
                    except OSError:
                        continue
                    if str(root) in text:  # the monitor's table, not the sandbox's own
                        tables.append(text)
                if tables:
                    break
                await asyncio.sleep(0.05)
            assert tables, "no process of the workspace shows the table bwrap started from"
            for text in tables:
                below = points_below(text, root)
                assert str(mine) in below, "the sandbox's own tree was taken away"
                assert not below & {str(p) for p in others}, below
            assert {str(p) for p in others} <= host_points_below(root), "the host lost a mount"
        finally:
            for execution in started:
                await local.cancel(execution)


# --- the clean namespace (clean_namespace.py, launch.c --clean-fd; docs/benchmarks.md §80) --


def _from_clean(launcher: Path, root: Path, fd: int, keeps: list[Path], script: str) -> str:
    argv = [str(launcher), "--detach", str(root), "--clean-fd", str(fd)]
    for keep in keeps:
        argv += ["--keep", str(keep)]
    return subprocess.run(
        [*argv, "--", "/bin/sh", "-c", script],
        capture_output=True, text=True, check=True, pass_fds=[fd],
    ).stdout  # fmt: skip


def test_a_spawn_from_the_clean_namespace_gets_copies_of_its_own_mounts_and_no_other(
    tmp_path: Path, mounted: tuple[Path, list[Path]]
) -> None:
    """The namespace was made while five overlays and a tmpfs were mounted below the
    folder: it holds none of them, nor a host mount the runner's view binds nothing from;
    the launcher brings the overlay it binds and the tmpfs its socket lies on (the topmost
    mount on the keep's path), reads the file through the overlay, leaves the host's table
    as it was, and the command inherits no descriptor of the namespace (R2). A spawn binding
    a host path outside the view is not covered (it starts the old way)."""
    from shellyard.runner.sandbox.clean_namespace import CleanNamespace

    root, made = mounted
    launcher = launch.build(tmp_path / "bin")
    assert launcher is not None, "the host's C compiler built no launcher"
    before = host_points_below(root)
    unbound = tmp_path / "unbound"  # a host mount the view binds nothing from
    unbound.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(unbound)], check=True)
    clean = CleanNamespace(launcher, os.path.realpath(root), ["/usr", "/etc"])
    try:
        assert clean.start()
        assert clean.covers(["/usr", str(made[0])]) and not clean.covers(["/usr", "/opt"])
        fd = clean.descriptor()
        assert fd is not None
        try:
            keep = made[0]
            seen = _from_clean(
                launcher, root, fd, [keep, made[-1] / "sock", root / "not-there"],
                f"cat /proc/self/mountinfo; cat {keep}/mine; ls -l /proc/self/fd",
            )  # fmt: skip
        finally:
            os.close(fd)
        assert points_below(seen, root) == {str(keep), str(made[-1])}
        assert "through my overlay" in seen
        assert f" {fd} -> " not in seen  # the namespace's descriptor: closed before the exec
        # left out once, when the namespace was made for the view's /usr and /etc
        assert f" {unbound} " not in seen
        assert host_points_below(root) == before
    finally:
        clean.close()
        subprocess.run(["umount", "-l", str(unbound)], check=False)


#: set in the copy of the test run in a mount namespace of its own
_IN_OWN_NAMESPACE = "SHELLYARD_TEST_OWN_MOUNT_NAMESPACE"
_LATER_MOUNT_TEST = "test_a_host_mount_made_later_reaches_the_clean_namespace_at_its_refresh"


def test_a_host_mount_made_later_reaches_the_clean_namespace_at_its_refresh(
    tmp_path: Path, mounted: tuple[Path, list[Path]]
) -> None:
    """Private, the clean namespace receives nothing the host mounts after it was made; the
    runner's refresh (every REFRESH_S) sees the host's mounts outside the folder changed and
    makes a new one: a mount an operator adds reaches the next spawn. No change, no new one;
    the runner's own mounts below the folder are no change."""
    from shellyard.runner.sandbox.clean_namespace import CleanNamespace

    if os.environ.get(_IN_OWN_NAMESPACE) != "1":
        # Other tests (xdist's workers) mount and unmount on the host meanwhile: a refresh
        # here would see their changes. In a private copy of the host's namespace the table
        # outside the folder changes only as this test changes it (it failed once so).
        done = subprocess.run(
            ["unshare", "-m", "--propagation", "private", sys.executable, "-m", "pytest",
             "-q", "-p", "no:cacheprovider", f"{__file__}::{_LATER_MOUNT_TEST}"],
            env={**os.environ, _IN_OWN_NAMESPACE: "1"}, capture_output=True, text=True,
            timeout=240, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
        assert "1 passed" in done.stdout, done.stdout[-2000:]
        return
    root, made = mounted
    launcher = launch.build(tmp_path / "bin")
    assert launcher is not None, "the host's C compiler built no launcher"
    later, below = tmp_path / "later", root / "workspaces" / "ws_new"
    clean = CleanNamespace(launcher, os.path.realpath(root), [str(later)])  # in the view
    assert clean.start()
    later.mkdir()
    below.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(below)], check=True)
        assert not clean.refresh()  # a mount below the folder is the runner's own
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(later)], check=True)
        (later / "news").write_text("mounted after\n")
        script = f"cat {later}/news 2>&1 || echo missing"

        def run() -> str:
            fd = clean.descriptor()
            assert fd is not None
            try:
                return _from_clean(launcher, root, fd, [made[0], later], script)
            finally:
                os.close(fd)

        assert "missing" in run()  # as the host was when the namespace was made
        assert clean.refresh()
        assert "mounted after" in run()
        assert not clean.refresh()
    finally:
        clean.close()
        for point in (later, below):
            subprocess.run(["umount", "-l", str(point)], check=False)


def test_a_descriptor_that_is_no_mount_namespace_detaches_the_old_way(
    tmp_path: Path, mounted: tuple[Path, list[Path]]
) -> None:
    """The kernel refuses to enter what is not a mount namespace: nothing has changed by
    then, the launcher unmounts the other mounts as before, and closes the descriptor."""
    root, made = mounted
    launcher = launch.build(tmp_path / "bin")
    assert launcher is not None, "the host's C compiler built no launcher"
    fd = os.open("/dev/null", os.O_RDONLY)
    try:
        seen = _from_clean(
            launcher, root, fd, [made[0], made[-1] / "sock"],
            f"cat /proc/self/mountinfo; cat {made[0]}/mine; ls -l /proc/self/fd",
        )  # fmt: skip
    finally:
        os.close(fd)
    assert points_below(seen, root) == {str(made[0]), str(made[-1])}
    assert "through my overlay" in seen
    assert f" {fd} -> " not in seen.split("through my overlay")[1]  # closed before the exec


def test_a_runner_folder_on_a_mount_of_its_own_keeps_that_mount_in_the_clean_namespace(
    tmp_path: Path,
) -> None:
    """The home on a volume of its own that no host path of the view lies on (a data disk):
    the namespace, leaving out the host's mounts the view binds nothing from, keeps the
    ones the runner's folder lies on, so a spawn's copies attach below it and a file on the
    folder's own mount (no copy) is read as on the host. (Left out at first: every spawn
    failed, "cannot attach the copy".)"""
    from shellyard.runner.sandbox.clean_namespace import CleanNamespace

    launcher = launch.build(tmp_path / "bin")
    assert launcher is not None, "the host's C compiler built no launcher"
    volume = tmp_path / "volume"
    volume.mkdir()
    mounted: list[Path] = []
    try:
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(volume)], check=True)
        mounted.append(volume)
        root = volume / "runner"
        folders = [root / "workspaces" / f"ws_{i}" for i in range(4)]
        for folder in folders:
            folder.mkdir(parents=True)
            subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(folder)], check=True)
            mounted.append(folder)
        (folders[0] / "mine").write_text("through my mount\n")
        (root / "plain").write_text("on the folder's own mount\n")
        clean = CleanNamespace(launcher, os.path.realpath(root), ["/usr", "/etc"])
        try:
            assert clean.start()
            fd = clean.descriptor()
            assert fd is not None
            try:
                seen = _from_clean(
                    launcher, root, fd, [folders[0], root / "plain"],
                    f"cat {folders[0]}/mine {root}/plain; cat /proc/self/mountinfo",
                )  # fmt: skip
            finally:
                os.close(fd)
        finally:
            clean.close()
        assert "through my mount" in seen and "on the folder's own mount" in seen
        assert points_below(seen, root) == {str(folders[0])}
    finally:
        for point in reversed(mounted):
            subprocess.run(["umount", "-l", str(point)], check=False)
