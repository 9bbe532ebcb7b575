"""Uploads are bounded while they stream (R2, T2; docs/limits.md "Uploads and the quota"):
a plain file upload and a tar upload are refused once past the room left under the
workspace quota or below the volume's free-space reserve, and nothing half-written lands.
A sparse tar and a gzip bomb never fill the disk.

Real runners: the in-process local runner and a runner daemon (``local``/``direct``); the
volume cases mount a real tmpfs as the home (root needed, skipped with the reason otherwise),
as tests/integration/test_full_disk.py does."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from tmpfs_fixture import mounted_tmpfs

from conftest import Yard, open_yard
from shellyard.contract.files import FileListQuery
from shellyard.errors import InvalidInput, LowOnSpace, TooLarge
from shellyard.runner.protocol import SandboxPolicy

MIB = 1 << 20


async def chunks(total: int, size: int = MIB) -> AsyncIterator[bytes]:
    sent = 0
    while sent < total:
        n = min(size, total - sent)
        yield b"z" * n
        sent += n


def tar_of(files: dict[str, int]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, size in files.items():
            info = tarfile.TarInfo(name)
            info.size = size
            tar.addfile(info, io.BytesIO(b"t" * size))
    return out.getvalue()


async def once(body: bytes) -> AsyncIterator[bytes]:
    yield body


async def no_leftovers(yard: Yard, workspace_id: str) -> list[str]:
    listing = await yard.plane.files.list(
        FileListQuery(path="", workspace_id=workspace_id, runner_id=yard.runner_id, recursive=True)
    )
    return sorted(e.path for e in listing.entries)


@pytest.fixture
def small_volume() -> Iterator[Path]:
    """A 256 MiB tmpfs the test mounts: the whole home (database, runner) lives on it."""
    with mounted_tmpfs("256m", "shellyard-upl-") as path:
        yield path


async def yard_on(
    request: pytest.FixtureRequest, home: Path, policy: SandboxPolicy
) -> AsyncIterator[Yard]:
    home.mkdir(mode=0o711, exist_ok=True)
    plane, runner_id, daemon = await open_yard(home, request.param, policy)
    try:
        yield Yard(plane, runner_id, home, daemon)
    finally:
        await plane.aclose()
        if daemon is not None:
            await daemon.stop()


@pytest.fixture(params=["local", "direct"])
async def quota_yard(request: pytest.FixtureRequest, small_volume: Path) -> AsyncIterator[Yard]:
    """A workspace quota of 8 MiB; a reserve far below the volume's free space."""
    policy = SandboxPolicy(workspace_quota_bytes=8 * MIB, free_space_reserve_bytes=16 * MIB)
    async for yard in yard_on(request, small_volume / "y", policy):
        yield yard


@pytest.fixture(params=["local", "direct"])
async def reserve_yard(request: pytest.FixtureRequest, small_volume: Path) -> AsyncIterator[Yard]:
    """No quota: only the reserve (64 MiB of 256) stands between an upload and a full disk."""
    policy = SandboxPolicy(
        free_space_reserve_bytes=64 * MIB, workspace_quota_bytes=0, log_limit_bytes=0
    )
    async for yard in yard_on(request, small_volume / "y", policy):
        yield yard


def free_bytes(volume: Path) -> int:
    st = os.statvfs(volume)
    return st.f_bavail * st.f_frsize


async def test_a_file_upload_past_the_quota_is_refused_and_leaves_nothing(
    quota_yard: Yard, small_volume: Path
) -> None:
    """R2/T2: a streamed file upload stops with 413 ``too_large`` once past the room left
    under the quota (not at the volume's end); no file, no temp is left and the existing
    file it would have replaced is unchanged. Replacing a file counts only the growth."""
    yard = quota_yard
    first = await yard.run("head -c 5000000 /dev/zero > five.bin; echo kept > kept.txt")
    ws = first.workspace_id
    before = free_bytes(small_volume)
    with pytest.raises(TooLarge, match="room left under the workspace quota"):
        await yard.runner.write_file(ws, "big.bin", chunks(40 * MIB), None)
    with pytest.raises(TooLarge):
        await yard.runner.write_file(ws, "kept.txt", chunks(4 * MIB), None)
    assert await no_leftovers(yard, ws) == ["five.bin", "kept.txt"]
    assert await yard.read_file(ws, None, "kept.txt") == b"kept\n"
    assert free_bytes(small_volume) > before - 2 * MIB  # the temp's bytes were given back
    # replacing the 5 MB file with 7 MB fits (8 MiB quota: 5 MB + 5 B used, 5 MB freed)
    done = await yard.runner.write_file(ws, "five.bin", chunks(7 * 10**6, 10**6), None)
    assert done.written[0].size == 7 * 10**6
    # and a file that fits the room left still lands
    small = await yard.runner.write_file(ws, "small.bin", chunks(MIB // 2, 4096), None)
    assert small.written[0].size == MIB // 2


async def test_a_tar_upload_is_bounded_by_the_room_left_not_the_whole_quota(
    quota_yard: Yard,
) -> None:
    """R2: with 6 MB of the 8 MiB quota in use, an archive of 3 MB of files is refused at
    its header (413), though it is under the quota on its own; nothing is unpacked."""
    yard = quota_yard
    first = await yard.run("head -c 6000000 /dev/zero > six.bin")
    ws = first.workspace_id
    with pytest.raises(TooLarge, match="room left under the workspace quota"):
        await yard.runner.write_tar(ws, "up", once(tar_of({"a.bin": 3 * 10**6})))
    assert await no_leftovers(yard, ws) == ["six.bin"]
    fits = await yard.runner.write_tar(ws, "up", once(tar_of({"a.bin": MIB})))
    assert [e.path for e in fits.written if e.kind == "file"] == ["up/a.bin"]


async def test_a_file_upload_stops_at_the_reserve_not_at_a_full_disk(
    reserve_yard: Yard, small_volume: Path
) -> None:
    """R2: with no quota, a streamed upload larger than the volume is refused once the
    volume falls below its reserve (503 ``low_on_space``), never by ENOSPC; its temp is
    removed, so the space comes back at once, and work goes on."""
    yard = reserve_yard
    first = await yard.run("echo kept > kept.txt")
    ws = first.workspace_id
    with pytest.raises(LowOnSpace, match="reserve"):
        await yard.runner.write_file(ws, "fill.bin", chunks(400 * MIB), None)
    assert free_bytes(small_volume) > 64 * MIB
    assert await no_leftovers(yard, ws) == ["kept.txt"]
    after = await yard.run("cat kept.txt")
    assert after.stdout == "kept\n"


def sparse_tar(tmp: Path, fmt: str) -> bytes:
    """A GNU tar of one 2 GiB sparse file (a few KB of archive)."""
    (tmp / "hole").unlink(missing_ok=True)
    with open(tmp / "hole", "wb") as f:
        f.truncate(2 << 30)
        f.write(b"x")
    archive = tmp / f"s-{fmt}.tar"
    subprocess.run(
        ["tar", "-cS", f"--format={fmt}", "-f", str(archive), "-C", str(tmp), "hole"],
        check=True,
    )
    return archive.read_bytes()


@pytest.mark.parametrize("fmt", ["gnu", "posix"])
async def test_a_sparse_tar_is_refused_without_touching_the_disk(
    reserve_yard: Yard, small_volume: Path, tmp_path: Path, fmt: str
) -> None:
    """R2: a sparse archive of a few KB (GNU ``S`` members or pax ``GNU.sparse`` keys)
    declaring 2 GiB is refused by the scan (400) before a byte is unpacked."""
    body = sparse_tar(tmp_path, fmt)
    assert len(body) < 64 << 10
    yard = reserve_yard
    first = await yard.run("echo kept > kept.txt")
    before = free_bytes(small_volume)
    with pytest.raises(InvalidInput, match="sparse"):
        await yard.runner.write_tar(first.workspace_id, "up", once(body))
    assert free_bytes(small_volume) > before - MIB
    assert await no_leftovers(yard, first.workspace_id) == ["kept.txt"]


async def test_a_gzip_bomb_is_refused_at_its_header_under_a_quota(
    quota_yard: Yard, small_volume: Path
) -> None:
    """R2: a small tar.gz whose member declares 2 GiB of zeros (its first 64 MiB given;
    the rest of a bomb is never read) is refused at the member's header by the room left
    under the quota (413), before any byte lands on the volume."""
    import gzip

    info = tarfile.TarInfo("zeros.bin")
    info.size = 2 << 30
    body = gzip.compress(info.tobuf(format=tarfile.GNU_FORMAT) + bytes(64 * MIB), 1)
    assert len(body) < 1 * MIB
    yard = quota_yard
    first = await yard.run("echo kept > kept.txt")
    before = free_bytes(small_volume)
    with pytest.raises(TooLarge):
        await yard.runner.write_tar(first.workspace_id, "up", once(body))
    assert free_bytes(small_volume) > before - MIB
    assert await no_leftovers(yard, first.workspace_id) == ["kept.txt"]
