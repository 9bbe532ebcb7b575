"""Attack pass of session 41 (second engineer) on the day's work: overlays mounted only while
held (runner/own_mounts.py), the upload temp files never committed and swept after a crash
(workspace_paths.is_partial, edits/placing.py), the runner root's one detached copy for log
descriptors (sandbox/log_root.py) and the detached ``name=shellyard-favordynmods`` cgroup
hierarchy (limits/dynmods.py). R2; docs/security.md "Attack pass (session 41)".

As the holder of one session's agent token (a second session made through the admin API)
and from inside its sandbox, on real bubblewrap sandboxes (the in-process local runner and a
runner daemon). The overlays are a root runner's: skipped with that reason otherwise."""

from __future__ import annotations

import asyncio
import io
import os
import tarfile
import threading
from pathlib import Path
from typing import Any

import pytest

from conftest import Yard
from shellyard.contract.executions import RunShellRequest, RunShellResult
from shellyard.errors import PathRefused

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(os.geteuid() != 0, reason="a sandbox's own mounts are a root runner's"),
]

#: A name ``workspace_paths.temp_name()`` could give: the prefix and 12 lowercase hex digits.
KEPT = ".shellyard-partial-0123456789ab"


@pytest.fixture(autouse=True)
def own_mounts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The overlays are on by default (SHELLYARD_OWN_MOUNTS); on here whatever the CI sets."""
    monkeypatch.setenv("SHELLYARD_OWN_MOUNTS", "on")


async def _agent(yard: Yard) -> str:
    """The main agent of a second session (not the admin's): the attacker."""
    other = await yard.plane.sessions.create()
    agent: str = other.main_agent_id
    return agent


async def _run(yard: Yard, agent: str, command: str, **options: Any) -> RunShellResult:
    request = RunShellRequest(command=command, runner_id=yard.runner_id, **options)
    return await yard.plane.executions.run_shell(request, agent)


def _tar(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def test_a_door_refuses_a_name_kept_for_the_runners_temp_files(yard: Yard) -> None:
    """An agent's upload named like a runner temp file was answered ``written`` with its hash
    while the commit skipped it (snapshots/scan.py): no snapshot, view or listing had it, and
    the start after a crash would delete it — data lost behind a success. Every writer door
    now refuses such a name (a path component of it too) with ``PathRefused`` saying why: a
    file write, a move's destination, a tar member, an archive's target folder. Other names
    with the prefix stay ordinary files."""
    agent = await _agent(yard)
    made = await _run(yard, agent, "echo a > a.txt")
    assert made.exit_code == 0, made
    ws = made.workspace_id
    refused = [
        yard.plane.files.write(KEPT, b"x", workspace_id=ws, agent_id=agent),
        yard.plane.files.write(f"d/{KEPT}/f", b"x", workspace_id=ws, agent_id=agent),
        yard.plane.files.move("a.txt", KEPT, workspace_id=ws, agent_id=agent),
        yard.plane.files.upload_archive(_tar({KEPT: b"x"}), workspace_id=ws, agent_id=agent),
        yard.plane.files.upload_archive(
            _tar({"f": b"x"}), path=KEPT, workspace_id=ws, agent_id=agent
        ),
    ]
    for call in refused:
        with pytest.raises(PathRefused, match="temp files"):
            await call
    kept = await yard.plane.files.write(
        ".shellyard-partial-notes", b"mine\n", workspace_id=ws, agent_id=agent
    )
    assert kept.new_snapshot, kept
    seen = await _run(yard, agent, "ls -A; cat .shellyard-partial-notes", read_only=True)
    assert seen.stdout == ".shellyard-partial-notes\na.txt\nmine\n", seen
    # a command's own file or folder of such a name: not refused (nothing sees its writes
    # as they happen), left out of every snapshot, as docs/files-and-transfers.md says
    own = await _run(yard, agent, f"mkdir -p {KEPT[:-1]}c/d && echo x > {KEPT[:-1]}c/d/f")
    assert own.exit_code == 0, own
    seen = await _run(yard, agent, "ls -A", read_only=True)
    assert seen.stdout == ".shellyard-partial-notes\na.txt\n", seen


@pytest.mark.runner_kinds("local")
async def test_the_sweep_removes_only_the_links_a_command_names_like_temp_files(
    yard: Yard, tmp_path: Path
) -> None:
    """The start-up sweep (root, edits/placing.py) unlinks every temp-file name in a tree a
    crash left marked. A command plants such names as a symbolic link to a host file, a hard
    link to its own file and a folder, and tries a hard link to a file it does not own: the
    sweep unlinks the two links (never what they name), leaves the folder, and the hard
    link to a foreign file is refused by the kernel (``protected_hardlinks``)."""
    canary = tmp_path / "canary"
    canary.write_text("host\n")
    agent = await _agent(yard)
    plant = (
        f"echo mine > own; ln own {KEPT[:-1]}1; ln -s {canary} {KEPT[:-1]}2; "
        f"mkdir {KEPT[:-1]}3; ln /etc/passwd theirs 2>/dev/null; echo ln=$?"
    )
    done = await _run(yard, agent, plant)
    assert done.stdout == "ln=1\n", done
    editor = yard.runner._editor
    with yard.runner._mounts.held(done.workspace_id):  # as Placer.startup does
        swept = editor.sweep(done.workspace_id)
    assert swept == 2
    assert canary.read_text() == "host\n"
    seen = await _run(yard, agent, "ls -A; cat own", read_only=False)
    assert seen.stdout == f"{KEPT[:-1]}3\nown\nmine\n", seen


@pytest.mark.runner_kinds("local")
async def test_a_process_left_behind_does_not_outlive_its_command_or_its_overlay(
    yard: Yard,
) -> None:
    """A command that leaves ``setsid`` and double-forked children would keep a cwd in the
    workspace's overlay past its end: the lazy unmount (MNT_DETACH) would leave them writing
    through a detached overlay while the next hold mounts a new one over the same upper layer
    (undefined for overlayfs). None survives (the sandbox's pid namespace ends with its
    init), and once nothing holds the workspace its overlays go."""
    agent = await _agent(yard)
    tag = "987641"
    done = await _run(
        yard,
        agent,
        f"setsid sh -c 'cd /workspace; sleep {tag}1 & sleep {tag}2 &'; (cd ~ && sleep {tag}3 &)",
    )
    assert done.exit_code == 0, done
    mounts = yard.runner._mounts
    left: list[str] = []
    for _ in range(200):
        left = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if tag.encode() in cmdline and b"setsid" not in cmdline:
                left.append(cmdline.decode(errors="replace"))
        if not left and not any(mounts.holds(done.workspace_id)):
            break
        await asyncio.sleep(0.05)
    assert not left, left
    waiting = yard.runner._runs.warm.waiting()
    if done.workspace_id in waiting:  # a warm sandbox holds it: discard it to let go
        yard.runner._runs.warm.discard_workspace(done.workspace_id, "test")
    mounts.linger_s = 0.0
    for _ in range(200):
        mounts.reap()
        if not any(mounts.holds(done.workspace_id)) and _mounted(yard, done.workspace_id) == 0:
            break
        await asyncio.sleep(0.05)
    assert _mounted(yard, done.workspace_id) == 0


@pytest.mark.runner_kinds("local")
async def test_a_reaper_racing_every_start_and_edit_keeps_the_tree_coherent(yard: Yard) -> None:
    """The linger at 0 and a second reaper calling ``OwnMounts.reap`` without pause, beside
    the runner's own: every door write, command, read-only view and delete in a row crosses
    a mount or unmount. What the runner wrote the command reads, what the command wrote the
    runner commits and a reader sees, no ``ls -l`` line is ``-?????????`` and nothing is
    left mounted once nothing holds the workspace. Then 12 more sessions' workspaces: the
    runner's overlays go back to none (no mount growth with the number of workspaces)."""
    agent = await _agent(yard)
    mounts = yard.runner._mounts
    mounts.linger_s = 0.0
    stop = threading.Event()
    reaped = [0]
    made: list[Path] = []
    hook = mounts.mounted

    def mounted(folder: Path) -> None:
        made.append(folder)
        if hook is not None:
            hook(folder)

    mounts.mounted = mounted

    def reaper() -> None:
        while not stop.is_set():
            reaped[0] += mounts.reap()
            stop.wait(0.001)

    thread = threading.Thread(target=reaper, daemon=True)
    thread.start()
    try:
        ws = (await _run(yard, agent, "true")).workspace_id
        warm = yard.runner._runs.warm
        for i in range(12):
            warm.discard_workspace(ws, "test")  # else it holds the workspace between commands
            await yard.plane.files.write(
                f"r{i}", f"{i}\n".encode(), workspace_id=ws, agent_id=agent
            )
            if i:
                await yard.plane.files.delete(f"c{i - 1}", workspace_id=ws, agent_id=agent)
            done = await _run(
                yard, agent, f"cat r{i}; echo c > c{i}; ls -la | grep -c '?'; ls c* | wc -l"
            )
            assert done.stdout == f"{i}\n0\n1\n", done
            assert await yard.read_file(ws, None, f"c{i}") == b"c\n"
            seen = await _run(yard, agent, f"cat c{i} r{i}; ls -la | grep -c '?'", read_only=True)
            assert seen.stdout == f"c\n{i}\n0\n", seen
        for _ in range(12):
            other = await _agent(yard)
            assert (await _run(yard, other, "echo x > f")).exit_code == 0
    finally:
        stop.set()
        thread.join()
    # the race ran: the tree was mounted again and again between the steps
    assert len([f for f in made if f.name == ws]) >= 12, (made, reaped)
    # a warm sandbox still in the making binds the tree once made, after a discard: none is
    # made any more, those in flight end first (16 places and a loaded host, CI of 6b01f18)
    await yard.runner._runs.warm.drain()
    yard.runner._runs.warm.discard_all("test")
    runner = yard.home / "home" / "runners" / "local"
    left: list[str] = []
    for _ in range(400):
        mounts.reap()
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
        left = [line for line in lines if " overlay " in line and str(runner) in line]
        if not left:
            break
        await asyncio.sleep(0.05)
    assert not left, left


@pytest.mark.runner_kinds("local")
async def test_a_read_view_nobody_reads_is_not_left_mounted(yard: Yard) -> None:
    """A reader's view (snapshots/views.py) was mounted as a read-only overlay at its first
    reader and stayed mounted after the last while it was the head's: one mount per
    workspace ever read, kept for the runner's life, which bwrap copies into every sandbox
    start (docs/benchmarks.md §22, the cost holds avoid). Now the view stays as a folder
    and its overlay goes a linger after its last reader; the next reader mounts it again and still
    sees no host path (its root field is ``/``)."""
    views = yard.home / "home" / "runners" / "local" / "views"
    yard.runner._mounts.linger_s = 0.2  # the holds' linger, which a view's unmount waits too

    def view_mounts() -> list[str]:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
        return [line for line in lines if f"{views}/" in line]

    async def settled() -> list[str]:
        """The view mounts once the unmounts a reader's end starts (off its finish) ran."""
        for _ in range(400):
            if not (left := view_mounts()):
                return left
            await asyncio.sleep(0.025)
        return left

    workspaces = []
    for _ in range(4):
        agent = await _agent(yard)
        made = await _run(yard, agent, "echo x > f")
        seen = await _run(yard, agent, "cat f", read_only=True)
        assert seen.stdout == "x\n", seen
        workspaces.append((agent, made.workspace_id))
    assert await settled() == []
    assert sorted(p.name.split(".")[0] for p in views.iterdir()) == sorted(
        ws for _agent_id, ws in workspaces
    )  # kept (the base the next head's view is patched from), unmounted
    agent = workspaces[0][0]
    again = await _run(
        yard, agent, "cat f; grep ' /workspace ' /proc/self/mountinfo", read_only=True
    )
    assert again.stdout.startswith("x\n"), again
    assert again.stdout.splitlines()[1].split()[3] == "/", again.stdout
    assert str(yard.home) not in again.stdout, again.stdout
    assert await settled() == []
    # a runner killed with a view mounted and no reader (as before this fix): the restart's
    # clean-up (ReadViews.forget_unused, after re-attaching) leaves it plain
    kept = next(views.iterdir())
    yard.runner._mounts.mount(kept, read_only=True)
    assert len(view_mounts()) == 1
    yard.runner._runs.views.forget_unused()
    assert view_mounts() == [] and kept.is_dir()


def _mounted(yard: Yard, workspace_id: str) -> int:
    """Overlays over the workspace's tree and home (its network namespace's file lingers
    on purpose: SHELLYARD_NETWORK_LINGER_S)."""
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    mine = [line.split() for line in lines if line.split()[4].endswith("/" + workspace_id)]
    return sum(1 for fields in mine if fields[fields.index("-") + 1] == "overlay")


async def test_the_log_descriptors_give_no_way_up_to_the_runners_root(yard: Yard) -> None:
    """The log descriptors are opened through the runner's one detached copy of its root
    (sandbox/log_root.py). From them a command reaches nothing else of it: ``..`` from
    ``/proc/self/fd/1``, an ``O_PATH`` descriptor of it and ``openat(fd, "..")`` are refused
    (a file is no folder), and a command inherits no descriptor beyond 0, 1 and 2 (the
    sandbox's init holds an eventfd of bwrap's, no folder)."""
    probe = r"""
import os
print(sorted(int(fd) for fd in os.listdir("/proc/self/fd")))
tried = []
for what in ("/proc/self/fd/1/..", "/proc/self/fd/1/../..", "/proc/1/fd/1/.."):
    try:
        os.listdir(what); tried.append(what)
    except OSError as exc:
        tried.append(exc.errno)
for fd in (1, 2):
    p = os.open(f"/proc/self/fd/{fd}", os.O_PATH)
    try:
        os.open("..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=p); tried.append("up")
    except OSError as exc:
        tried.append(exc.errno)
for fd in os.listdir("/proc/1/fd"):
    target = os.readlink(f"/proc/1/fd/{fd}")
    if not target.startswith(("/dev/null", "/executions/", "anon_inode:")):
        tried.append(target)
print(tried)
"""
    agent = await _agent(yard)
    for read_only in (False, True):
        done = await _run(yard, agent, f"python3 -c '{probe}'", read_only=read_only)
        assert done.exit_code == 0, done
        fds, tried = done.stdout.splitlines()
        assert fds == "[0, 1, 2, 3]", done.stdout  # 3: listdir's own
        assert tried == "[20, 20, 20, 20, 20]", done.stdout  # ENOTDIR each


async def test_the_dynmods_hierarchy_can_be_neither_mounted_nor_joined(yard: Yard) -> None:
    """limits/dynmods.py keeps a detached v1 hierarchy ``name=shellyard-favordynmods`` for
    the runner's life. A sandbox sees its line in ``/proc/self/cgroup`` (the kernel lists
    every hierarchy; its path is ``/``, no host path), but cannot mount it (by name or
    ``none,name=``), find a cgroup file system of it, or move itself anywhere."""
    probe = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
out = []
for opts in (b"none,name=shellyard-favordynmods", b"name=shellyard-favordynmods"):
    os.makedirs("/tmp/cg", exist_ok=True)
    rc = libc.mount(b"none", b"/tmp/cg", b"cgroup", 0, opts)
    out.append(ctypes.get_errno() if rc else "mounted")
line = [l for l in open("/proc/self/cgroup") if "favordynmods" in l]
out.append(line[0].split(":", 2)[2].strip() if line else "none")
out.append(any("favordynmods" in l for l in open("/proc/self/mountinfo")))
print(out)
"""
    agent = await _agent(yard)
    done = await _run(yard, agent, f"python3 -c '{probe}'")
    assert done.exit_code == 0, done
    assert done.stdout.strip() in ("[1, 1, '/', False]", "[1, 1, 'none', False]"), done.stdout
