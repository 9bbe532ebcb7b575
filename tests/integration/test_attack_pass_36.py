"""Attack pass of session 36 (second engineer) on the fixes of the full disk, the tenants and
the agent-privileges work (docs/security.md "Attack pass (session 36)"). R2 (the free-space
reserve, tenants), E1/E7 (every input gets a terminal record), W5 (uploads).

Each test is an attack that succeeded on the tree before this pass and its fix. Real
bubblewrap sandboxes on the in-process local runner and a runner daemon; the volume is a
real tmpfs with a small inode table (root needed, skipped with the reason otherwise)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import os
import shutil
import subprocess
import tarfile
import textwrap
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from tmpfs_fixture import mounted_tmpfs, yard_on

from conftest import Yard
from shellyard.contract.environments import EnvironmentChangeBody, EnvironmentCreateRequest
from shellyard.contract.executions import (
    ExecutionCancelQuery,
    ExecutionLogsQuery,
    ExecutionState,
    ExecutionWait,
    RunShellRequest,
)
from shellyard.errors import ChangeFailed, LowOnSpace
from shellyard.runner.limits import reserve
from shellyard.runner.protocol import SandboxPolicy

MIB = 1 << 20
#: The volume's inode table (the tests keep a tenth of it, 2000, as the inode reserve).
INODES = 20_000


@pytest.fixture
def inode_volume() -> Iterator[Path]:
    """A tmpfs with plenty of bytes (512 MiB) and few inodes: only files can fill it."""
    with mounted_tmpfs("512m", "shellyard-inodes-", f"nr_inodes={INODES}") as path:
        yield path


@pytest.fixture(params=["local", "direct"])
async def inode_yard(request: pytest.FixtureRequest, inode_volume: Path) -> AsyncIterator[Yard]:
    # 10% of the volume's inodes: 2000 kept (a tenth at most), a margin the watcher's walk
    # of ~20,000 entries keeps even on a loaded machine
    policy = SandboxPolicy(free_space_reserve_bytes=64 * MIB, free_space_reserve_percent=10)
    async with yard_on(inode_volume, request.param, policy) as yard:
        yield yard


async def _other_session_run(yard: Yard, command: str) -> Any:
    other = await yard.plane.sessions.create()
    request = RunShellRequest(command=command, runner_id=yard.runner_id)
    return await yard.plane.executions.run_shell(request, other.main_agent_id)


def _free_inodes(volume: Path) -> int:
    return os.statvfs(volume).f_favail


#: Empty files, 50 at a time with a pause between (a little slower than tmpfs can, so the
#: watcher's tick comes before the table is empty), without end.
SLOW_FILLER = (
    "mkdir d; i=0; while :; do for j in $(seq 50); do : > d/f$i.$j; done; "
    "i=$((i+1)); sleep 0.05; done"
)
#: As fast as bash makes them: the table is empty within a second, before any tick.
FAST_FILLER = "mkdir d; i=0; while : > d/f$i; do i=$((i+1)); done; echo made $i"


async def test_a_command_making_empty_files_is_stopped_by_the_inode_reserve(
    inode_yard: Yard, inode_volume: Path
) -> None:
    """R2 reserve, in inodes: empty files take no bytes, so a byte reserve never saw them.
    Before: ~19,000 empty files in 0.6 s took every inode of a volume with 490 MiB free;
    the command's own commit failed (ENOSPC), another session's run failed with a raw
    ENOSPC (500) making its workspace, and nothing said why. Now the command is stopped with
    ``limit: "disk"`` naming the inode reserve, its files are committed, another session
    is refused cleanly (LowOnSpace, 503, retry later), and a delete brings work back."""
    yard = inode_yard
    filler = await yard.run(SLOW_FILLER, background=True)
    view = await yard.plane.executions.wait(filler.execution_id, ExecutionWait(timeout_s=120))
    assert view.state.terminal, view
    record = await yard.runner.status(filler.execution_id)
    assert record.limit == "disk", record
    assert record.error is not None and "free-inode reserve" in record.error, record
    assert record.snapshot is not None and record.snapshot.files > 10_000, record
    assert _free_inodes(inode_volume) > 100  # stopped before the table was empty
    with pytest.raises(LowOnSpace, match="files \\(inodes\\) free, below its reserve"):
        await _other_session_run(yard, "echo during")
    removed = await yard.runner.delete_path(filler.workspace_id, "d", True)
    assert removed.removed == ["d"]
    after = await _other_session_run(yard, "echo after")
    assert after.state == ExecutionState.completed and after.stdout == "after\n", after
    mine = await yard.run("ls | wc -l")
    assert mine.state == ExecutionState.completed and mine.stdout == "0\n", mine


async def test_a_filler_faster_than_the_watcher_ends_with_limit_disk_and_others_get_503(
    inode_yard: Yard, inode_volume: Path
) -> None:
    """R2, E7: a command emptying the inode table before the watcher's next look meets
    ENOSPC; its commit cannot be made (no inode for it). The record says ``limit: "disk"``
    and why, another session's new workspace is refused with LowOnSpace (before: a raw
    OSError from ``mkdir``, a 500), and a delete of the files brings work back without a
    restart."""
    yard = inode_yard
    filler = await yard.run(FAST_FILLER, background=True)  # the runner's first command
    view = await yard.plane.executions.wait(filler.execution_id, ExecutionWait(timeout_s=120))
    assert view.state.terminal, view
    record = await yard.runner.status(filler.execution_id)
    assert record.limit == "disk", record
    assert record.error is not None and "inode" in record.error, record
    with pytest.raises(LowOnSpace, match="retry later"):
        await _other_session_run(yard, "echo during")
    removed = await yard.runner.delete_path(filler.workspace_id, "d", True)
    assert removed.removed == ["d"]
    after = await _other_session_run(yard, "echo after")
    assert after.state == ExecutionState.completed and after.stdout == "after\n", after


def _empty_members_tar(count: int) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for i in range(count):
            tar.addfile(tarfile.TarInfo(f"m/f{i}"), io.BytesIO(b""))
    return buffer.getvalue()


async def test_an_upload_of_empty_members_stops_at_the_inode_reserve(
    inode_yard: Yard, inode_volume: Path
) -> None:
    """W5, R2: a tar of 19,500 empty members (within the 100,000-member bound, 0 bytes of
    content, so no byte check ever ran) used to take the volume's last inodes while it was
    unpacked. Now the unpack looks at the reserve every 1000 members: it is refused with
    LowOnSpace, nothing of it lands, and its staged entries are given back."""
    yard = inode_yard
    first = await yard.run("echo kept > kept.txt")
    body = _empty_members_tar(INODES - 500)
    before = _free_inodes(inode_volume)

    async def upload() -> AsyncIterator[bytes]:
        for start in range(0, len(body), MIB):
            yield body[start : start + MIB]

    with pytest.raises(LowOnSpace, match="unpacking an upload refused"):
        await yard.runner.write_tar(first.workspace_id, "up", upload())
    assert await yard.runner.stat_path(first.workspace_id, None, "up") is None
    assert _free_inodes(inode_volume) >= before - 16  # the staged entries went
    after = await yard.run("cat kept.txt")
    assert after.state == ExecutionState.completed and after.stdout == "kept\n"


def test_the_inode_reserve_is_off_where_the_byte_reserve_is_or_there_is_no_table() -> None:
    """The inode reserve follows the byte reserve's setting: the percentage of the volume's
    inodes (at least 1024, at most a tenth), none when the reserve is 0, none on a file
    system without a fixed inode table (``f_files`` 0: btrfs, an unbounded tmpfs)."""
    default = SandboxPolicy()
    assert reserve.inode_reserve(default, 16_777_216) == 838_860  # 5% of this ext4 root
    assert reserve.inode_reserve(default, INODES) == 1024
    assert reserve.inode_reserve(default, 5000) == 500
    assert reserve.inode_reserve(default, 0) == 0
    assert reserve.inode_reserve(SandboxPolicy(free_space_reserve_bytes=0), 16_777_216) == 0
    off = SandboxPolicy(free_space_reserve_percent=0)
    assert reserve.inode_reserve(off, 16_777_216) == 0


# ---------------------------------------------------------------- package builds (R2, V2)


@pytest.fixture(params=["local", "direct"])
async def small_yard(request: pytest.FixtureRequest) -> AsyncIterator[Yard]:
    """A 384 MiB tmpfs home with a 64 MiB reserve and no quota: only the reserve stands
    between a build and a full volume."""
    policy = SandboxPolicy(free_space_reserve_bytes=64 * MIB, workspace_quota_bytes=0)
    with mounted_tmpfs("384m", "shellyard-build-fill-") as volume:
        async with yard_on(volume, request.param, policy) as yard:
            yield yard


#: An in-tree build backend (the agent's code, run by uv in the tools' sandbox) that writes
#: zeros into its build folder (the environment's cache, on the runner's volume) until ENOSPC.
FILLING_BACKEND = textwrap.dedent(
    """
    import os

    def get_requires_for_build_wheel(config_settings=None):
        return []

    def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
        with open("junk", "wb") as f:
            while True:
                f.write(b"\\0" * (1 << 20))
                f.flush()
    """
)

#: The same, but the backend removes what it wrote once a write fails and then fails itself
#: (uv also drops a failed build's tree): the volume is above the reserve again when the tool
#: ends, the way a writer faster than the runner's check was seen to end in CI.
CLEANING_BACKEND = textwrap.dedent(
    """
    import os

    def get_requires_for_build_wheel(config_settings=None):
        return []

    def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
        try:
            with open("junk", "wb") as f:
                while True:
                    f.write(b"\\0" * (1 << 20))
                    f.flush()
        finally:
            os.remove("junk")
    """
)


def _largest(folder: Path) -> list[tuple[int, str]]:
    """The ten largest files below ``folder`` (what a failed assertion shows)."""
    sizes = []
    for path in folder.rglob("*"):
        with contextlib.suppress(OSError):
            if path.is_file() and not path.is_symlink():
                sizes.append((path.stat().st_blocks * 512, str(path.relative_to(folder))))
    return sorted(sizes, reverse=True)[:10]


def _filling_sdist(backend: str = FILLING_BACKEND) -> bytes:
    pyproject = '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        for name, text in (
            ("pyproject.toml", pyproject),
            ("backend.py", backend),
            ("PKG-INFO", "Metadata-Version: 2.1\nName: sy-fill\nVersion: 1.0\n"),
        ):
            member = tarfile.TarInfo(f"sy_fill-1.0/{name}")
            member.size, member.mode = len(text.encode()), 0o644
            archive.addfile(member, io.BytesIO(text.encode()))
    return out.getvalue()


@pytest.mark.parametrize("backend", [FILLING_BACKEND, CLEANING_BACKEND], ids=["fills", "cleans"])
async def test_a_build_backend_filling_the_volume_is_stopped_at_the_reserve(
    small_yard: Yard, backend: str
) -> None:
    """R2 reserve, V2: a package build runs the agent's code, and before this pass nothing
    held it to the free-space reserve: an sdist's backend wrote into its build folder (the
    environment's cache) until the runner's volume was full (ENOSPC), which fills it for
    every session (their writes fail, the database's ballast goes). Now the tool is killed
    once the volume is below the reserve, the change fails saying so, what the build left in
    the cache is dropped, and other sessions' work goes on."""
    yard = small_yard
    plane = yard.plane
    session = await plane.sessions.create()
    agent = session.main_agent_id
    blob = base64.b64encode(_filling_sdist(backend)).decode()
    put = await plane.executions.run_shell(
        RunShellRequest(
            command=f"mkdir dist && echo {blob} | base64 -d > dist/sy_fill-1.0.tar.gz",
            runner_id=yard.runner_id,
            wait_ms=30_000,
        ),
        agent,
    )
    assert put.exit_code == 0, put
    created = await plane.environments.create(
        EnvironmentCreateRequest(
            name="fill", language="python", runner_id=yard.runner_id, wait_ms=30_000
        ),
        agent,
    )
    if created.state != "ready":
        assert created.change_id is not None
        await plane.environments.wait(created.change_id, 120, agent)
    body = EnvironmentChangeBody(
        manager="pip",
        specs=["sy-fill"],
        index_url="none",
        find_links=["/workspace/dist"],
        wait_ms=30_000,
    )
    with pytest.raises(ChangeFailed, match=r"below its reserve of 64\.0 MiB") as failed:
        change = await plane.environments.install(created.environment_id, body, agent)
        if not change.done:
            await plane.environments.wait(change.change_id, 120, agent)
    assert "package tool" in str(failed.value)
    # The junk is gone once the killed build's processes have closed it (a loaded machine
    # takes a moment to end a pid namespace).
    for _ in range(300):
        stat = os.statvfs(yard.home)
        if stat.f_bavail * stat.f_frsize > 128 * MIB:
            break
        await asyncio.sleep(0.1)
    assert stat.f_bavail * stat.f_frsize > 128 * MIB, _largest(yard.home)
    after = await _other_session_run(yard, "echo after")
    assert after.state == ExecutionState.completed and after.stdout == "after\n", after


# ---------------------------------------------------------------- forwards (R5) vs local users

FORWARDED = 8767


def _relay_pids(port: int) -> list[int]:
    """Host pids of the relays forwarding to ``port`` of a workspace (from /proc)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        relay = any(a.endswith(b"relay.py") for a in argv) and b"--tcp-port" in argv
        if relay and argv[argv.index(b"--tcp-port") + 1] == b"%d" % port:
            found.append(int(proc.name))
    return found


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("nsenter") is None or shutil.which("setpriv") is None,
    reason="a root runner's forwards need root, util-linux's nsenter and setpriv",
)
async def test_a_local_user_running_as_nobody_cannot_kill_a_forwards_relay(yard: Yard) -> None:
    """R5 forwards, the local-user threat of docs/security.md: a root runner's relays
    dropped to ``nobody`` (65534), the uid a host's daemons run as; a process of the same
    uid may signal them, so any local ``nobody`` process closed every forward (and cut the
    egress of every sandbox) with one ``kill -9``. Now they run as the sandbox uid, which no
    account has: the kill is refused and the forward keeps answering."""
    server = await yard.run(
        f"echo alive > live.txt; echo listening; exec python3 -m http.server {FORWARDED} "
        "--bind 127.0.0.1 --directory /workspace",
        background=True,
    )
    try:
        for _ in range(600):
            logs = await yard.plane.executions.logs(server.execution_id, ExecutionLogsQuery())
            if "listening" in logs.data:
                break
            await asyncio.sleep(0.05)
        view = await yard.plane.ports.open(FORWARDED, workspace_id=server.workspace_id)
        assert _fetch(view.url + "live.txt") == "alive\n"
        pids = _relay_pids(FORWARDED)
        assert pids, "no relay found for the forward"
        as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        for pid in pids:
            killed = subprocess.run(
                [*as_nobody, "kill", "-9", str(pid)], capture_output=True, text=True
            )
            assert killed.returncode != 0, f"nobody killed relay {pid}"
            assert "not permitted" in killed.stderr, killed.stderr
        assert _fetch(view.url + "live.txt") == "alive\n"
    finally:
        await yard.plane.executions.cancel(server.execution_id, ExecutionCancelQuery(wait_s=30))


def _fetch(url: str) -> str:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    error: Exception | None = None
    for _ in range(100):
        try:
            with opener.open(url, timeout=5) as answer:
                return str(answer.read().decode())
        except OSError as exc:
            error = exc
            time.sleep(0.05)
    raise AssertionError(f"{url} did not answer: {error}")


# ---------------------------------------------------------------- held: /tmp (R2 memory)


async def test_files_in_a_sandboxs_tmp_count_against_its_memory_limit(
    yard_factory: Any,
) -> None:
    """R2: ``/tmp`` is a tmpfs per execution with the kernel's default size and inode count
    (half the host's RAM, millions of inodes): millions of empty files there would take
    the host's memory in inodes and dentries. Tried: 2,000,000 empty files under a 128 MiB
    memory limit; held: the tmpfs's pages and its inodes' kernel memory are charged to the
    execution's memory cgroup, so it is stopped with ``limit: "memory"`` long before."""
    yard = await yard_factory(SandboxPolicy(memory_limit_bytes=128 * MIB))
    limits = (await yard.runner.info()).limits
    if limits is None or not limits.enforcement.startswith("cgroup"):
        pytest.skip("no memory cgroup on this runner (rlimits only)")
    command = (
        'cd /tmp && python3 -c "\nimport os\nfor d in range(400):\n  os.mkdir(str(d))\n'
        "  for i in range(5000): open(f'{d}/{i}', 'w').close()\nprint('all made')\n\""
    )
    started = await yard.run(command, background=True)
    view = await yard.plane.executions.wait(started.execution_id, ExecutionWait(timeout_s=300))
    assert view.state.terminal, view
    record = await yard.runner.status(started.execution_id)
    assert record.limit == "memory", record
    logs = await yard.plane.executions.logs(started.execution_id, ExecutionLogsQuery())
    assert "all made" not in logs.data
