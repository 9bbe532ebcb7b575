"""Helpers of the tests that drive a real ``LocalRunner`` (bubblewrap sandboxes) in-process,
and of those that SIGKILL a ``shellyard serve`` while commands run: the cold spawn in a worker
thread, the warm pool, the attack passes on both (sessions 48-49). One copy here, so a fix to
how a test waits or counts is made once."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from conftest import kill_server
from shellyard.runner.local import LocalRunner
from shellyard.runner.protocol import RunnerExecState, SandboxPolicy, StartRequest
from shellyard.sdk.client import Client


def process_tag() -> str:
    """An id part naming this process and this moment: other engineers' tests may run beside,
    so every workspace and execution id a test makes carries one (each module takes its own)."""
    return f"{os.getpid()}-{time.time_ns()}"


def tagger(tag: str) -> Callable[[str], str]:
    """``eid``: a name made this module's own, ``f"{name}-{tag}"``."""

    def eid(name: str) -> str:
        return f"{name}-{tag}"

    return eid


@contextlib.asynccontextmanager
async def local_runner(tmp_path: Path, *workspaces: str) -> AsyncIterator[LocalRunner]:
    """A started ``LocalRunner`` in ``tmp_path/runner`` (default policy) holding
    ``workspaces``, closed on the way out."""
    local = LocalRunner(tmp_path / "runner", SandboxPolicy())
    await local.startup()
    try:
        for workspace in workspaces:
            await local.ensure_workspace(workspace)
        yield local
    finally:
        await local.aclose()


async def ended(local: LocalRunner, execution_id: str) -> Any:
    """The execution's record once it is no longer running."""
    record = await local.wait(execution_id, 60)
    while record.state == RunnerExecState.running:
        record = await local.wait(execution_id, 60)
    return record


def open_files() -> list[str]:
    """What this process's descriptors name (one closed meanwhile by another thread: left out)."""
    names = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            names.append(os.readlink(f"/proc/self/fd/{fd}"))
    return names


async def kill9_while_running(home: Path, round_: int) -> str:
    """SIGKILL the ``shellyard serve`` of ``home`` while a thread runs ``true`` back to back
    on a fresh client (after one first run, which starts the service if needed), so a start
    is often in flight; the moment of the kill moves with ``round_``. Asserts a command ran
    before the kill; answers the workspace the commands ran in."""
    client = Client.for_home(home)
    first = client.run("true", wait_ms=30000)
    assert first.exit_code == 0, first
    stop = threading.Event()
    ran = [0]

    def loop() -> None:
        while not stop.is_set():
            try:
                client.run("true", wait_ms=30000)
            except Exception:
                return  # the service is gone
            ran[0] += 1

    worker = threading.Thread(target=loop)
    worker.start()
    await asyncio.sleep(0.4 + 0.13 * round_)
    kill_server(home)
    stop.set()
    worker.join(60)
    assert ran[0] > 0, "no command ran before the kill"
    return first.workspace_id


def workspace_processes(workspace_id: str) -> list[int]:
    """Host pids of every process of a workspace (found by its environment)."""
    needle = f"SHELLYARD_WORKSPACE_ID={workspace_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if needle in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    found.append(int(entry))
    return found


async def runs_true(local: LocalRunner, execution_id: str, workspace_id: str) -> None:
    """``true`` started as ``execution_id`` in the workspace ends with exit code 0: nothing
    before it left the workspace busy or its writer held."""
    await local.start(
        StartRequest(execution_id=execution_id, workspace_id=workspace_id, command="true")
    )
    assert (await ended(local, execution_id)).exit_code == 0
