"""Helpers of the files, history and transfer tests (imported from tests/support, on sys.path)."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import tarfile
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from shellyard.contract.executions import ExecutionState, ExecutionWait, RunShellRequest
from shellyard.contract.files import FileListQuery
from shellyard.control.plane import ControlPlane
from shellyard.store.owners import Agent


async def run(plane: ControlPlane, command: str, runner_id: str = "local", **kw: Any) -> Any:
    """Run a command to its end (foreground, then wait) and check it completed with 0."""
    result = await plane.executions.run_shell(
        RunShellRequest(command=command, runner_id=runner_id, wait_ms=30_000, **kw)
    )
    view = await plane.executions.wait(result.execution_id, ExecutionWait(timeout_s=120))
    assert view.state == ExecutionState.completed and view.exit_code == 0, (view, result.stderr)
    return view


async def read_all(plane: ControlPlane, path: str, **where: Any) -> bytes:
    stream = await plane.files.open(path, **where)
    return b"".join([chunk async for chunk in stream.chunks])


async def tree(plane: ControlPlane, workspace_id: str, seq: int | None = None) -> dict[str, Any]:
    """Every entry of a workspace's snapshot (the head by default): path → entry."""
    entries: dict[str, Any] = {}
    after = None
    while True:
        page = await plane.files.list(
            FileListQuery(
                path="",
                workspace_id=workspace_id,
                seq=seq,
                recursive=True,
                after=after,
                limit=10_000,
            )
        )
        entries.update({e.path: e for e in page.entries})
        if page.next_after is None:
            return entries
        after = page.next_after


async def child_workspace(plane: ControlPlane, runner_id: str) -> tuple[Agent, str]:
    """A child agent of the default agent and its workspace on ``runner_id``."""
    parent = await plane.files.access.agent(None)
    child = await plane.store.create_agent(str(parent.session_id), str(parent.id))
    row = await plane.files.access.own(child, runner_id)
    return child, row.id


async def chunks_of(data: bytes, size: int = 1 << 20) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]
        await asyncio.sleep(0)


def runner_root(yard: Any) -> Path:
    """The folder of the yard's runner (the local runner's, or the daemon's)."""
    if yard.daemon is not None:
        return Path(yard.daemon.root)
    return Path(yard.plane.settings.local_runner_root)


def object_file(root: Path, sha256: str) -> Path:
    return root / "snapshots" / "objects" / sha256[:2] / sha256[2:]


@contextmanager
def small_tmpfs(where: Path, size: str, uid: int = 61000) -> Iterator[Path]:
    """A real tmpfs of ``size`` mounted at ``where`` (we are root), unmounted afterwards."""
    opts = f"size={size},mode=0700,uid={uid},gid={uid}" if os.geteuid() == 0 else f"size={size}"
    subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def archive(members: list[tuple[str, bytes | None, str | None]]) -> bytes:
    """A tar of (name, content or None for a folder, link target or None)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, content, link in members:
            info = tarfile.TarInfo(name)
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
                tar.addfile(info)
            elif content is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()
