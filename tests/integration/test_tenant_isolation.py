"""Two workspaces on one root runner, attacked from each other (R2; docs/security.md "Tenants:
attack pass (second engineer)").

Every workspace uid shares the sandbox group (61000), which may pass every runner folder on the
way to a workspace: the workspace's own root, 0700 and owned by its uid, is the one barrier on
the host between two workspaces. These tests run real sandboxes on the in-process local runner
and on a runner daemon (``yard_factory``), in a uid range no other test uses."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conftest import Yard
from shellyard.contract.executions import ExecutionCancelQuery, ExecutionWait, RunShellRequest
from shellyard.runner.protocol import RunnerExecState, SandboxPolicy, StartRequest

ROOT = os.geteuid() == 0
UIDS = "62800-62899"
SHARED_GROUP = 61000

pytestmark = pytest.mark.skipif(not ROOT, reason="a uid per workspace needs a root runner")


def runner_root(yard: Yard) -> Path:
    if yard.daemon is not None:
        return Path(yard.daemon.root)
    from shellyard.config import Settings

    return Settings(home=yard.home / "home").local_runner_root


async def session_run(yard: Yard, command: str, **options: Any) -> Any:
    """A command of a session of its own, so of a workspace of its own."""
    session = await yard.plane.sessions.create()
    result = await yard.plane.executions.run_shell(
        RunShellRequest(command=command, runner_id=yard.runner_id, wait_ms=30_000, **options),
        session.main_agent_id,
    )
    return session, result


def as_uid(uid: int, *argv: str) -> subprocess.CompletedProcess[str]:
    """``argv`` on the host as a workspace uid with the shared group: what any process of
    that uid outside its mount namespace could do."""
    return subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={SHARED_GROUP}", "--clear-groups", *argv],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def tree_holding(yard: Yard, name: str) -> Path:
    found = [p.parent for p in (runner_root(yard) / "workspaces").glob(f"*/{name}")]
    assert len(found) == 1, found
    return found[0]


async def test_a_root_its_agent_opened_is_closed_at_the_end(yard_factory: Any) -> None:
    """R2: B's agent opens its workspace (``chmod 777 /workspace``, files 0664 and 0666 in a
    0777 folder: the shared group could read and write them): once its command ended the root
    is 0700 and B's uid's again, and A's uid on the host reads, lists and writes none of it."""
    yard: Yard = await yard_factory(SandboxPolicy(uid_range=UIDS))
    _, b = await session_run(
        yard,
        "chmod 777 /workspace; echo secret > b-secret; chmod 664 b-secret; "
        "mkdir -m 777 open; echo s2 > open/g; chmod 666 open/g; id -u",
    )
    assert b.exit_code == 0, b
    _, a = await session_run(yard, "id -u")
    uid_a, uid_b = int(a.stdout.split()[0]), int(b.stdout.split()[-1])
    assert uid_a != uid_b
    tree = tree_holding(yard, "b-secret")
    info = tree.stat()
    assert (info.st_mode & 0o7777, info.st_uid) == (0o700, uid_b), oct(info.st_mode)
    for argv in (
        ["cat", str(tree / "b-secret")],
        ["cat", str(tree / "open" / "g")],
        ["ls", str(tree)],
        ["sh", "-c", f"echo pwned >> {tree / 'open' / 'g'}"],
    ):
        attempt = as_uid(uid_a, *argv)
        assert attempt.returncode != 0 and "Permission denied" in attempt.stderr, (argv, attempt)
    assert (tree / "open" / "g").read_text() == "s2\n"


async def test_another_workspace_sees_and_signals_no_process_of_it(yard_factory: Any) -> None:
    """R2: B's running command is no process A's command sees (its own pid namespace) or can
    signal by its host pid; A's /proc lists only its own."""
    yard: Yard = await yard_factory(SandboxPolicy(uid_range=UIDS))
    session_b, b = await session_run(yard, "id -u; exec sleep 120", background=True)
    try:
        uid_b = None
        pid = None
        for _ in range(300):
            out = subprocess.run(
                ["pgrep", "-f", "-x", "sleep 120"], capture_output=True, text=True, check=False
            ).stdout.split()
            owned = [int(p) for p in out if Path(f"/proc/{p}").stat().st_uid >= 62800]
            if owned:
                pid = owned[0]
                uid_b = Path(f"/proc/{pid}").stat().st_uid
                break
            await asyncio.sleep(0.1)
        assert pid is not None and uid_b is not None and 62800 <= uid_b <= 62899
        _, a = await session_run(
            yard,
            f"kill -0 {pid} 2>&1; kill -9 {pid} 2>&1; ls /proc | grep -c '^[0-9]'; "
            f"cat /proc/{pid}/environ 2>&1 | head -c 200; id -u",
        )
        assert "No such process" in a.stdout, a
        assert int(a.stdout.split()[-1]) != uid_b
        assert os.path.exists(f"/proc/{pid}"), "A's kill reached B's process"
    finally:
        await yard.plane.executions.cancel(
            b.execution_id, ExecutionCancelQuery(), session_b.main_agent_id
        )
        await yard.plane.executions.wait(
            b.execution_id, ExecutionWait(timeout_s=60), session_b.main_agent_id
        )


async def test_a_migrated_workspace_root_is_0700_and_its_own(tmp_path: Path) -> None:
    """R2: a workspace an older runner made as the shared uid with an open root (0755, as
    releases before the private home left it) is given to its own uid and closed to 0700 on
    first use, before its command runs; the runner's own edits keep uid and group."""
    from shellyard.runner.local import LocalRunner

    async def run(runner: LocalRunner, execution_id: str, command: str) -> Any:
        await runner.start(
            StartRequest(execution_id=execution_id, workspace_id="ws", command=command)
        )
        record = await runner.wait(execution_id, 60)
        while record.state == RunnerExecState.running:
            record = await runner.wait(execution_id, 60)
        return record

    async def chunks(data: bytes) -> Any:
        yield data

    root = tmp_path / "runner"
    old = LocalRunner(root, SandboxPolicy(uid_range="off"))
    await old.startup()
    try:
        await old.ensure_workspace("ws")
        first = await run(old, "e1", "echo one > f; chmod 664 f")
        assert first.exit_code == 0, first.error
    finally:
        await old.aclose()
    tree = root / "workspaces" / "ws"
    tree.chmod(0o755)
    new = LocalRunner(root, SandboxPolicy(uid_range=UIDS))
    await new.startup()
    try:
        await new.ensure_workspace("ws")
        second = await run(new, "e2", "stat -c %a /workspace > mode; id -u > who")
        assert second.exit_code == 0, second.error
        await new.write_file("ws", "sub/put.txt", chunks(b"x"), 0o664)
    finally:
        await new.aclose()
    uid = int((tree / "who").read_text())
    assert (tree / "mode").read_text().strip() == "700"
    assert tree.stat().st_mode & 0o7777 == 0o700
    for path in (tree, tree / "f", tree / "sub", tree / "sub" / "put.txt"):
        assert (path.stat().st_uid, path.stat().st_gid) == (uid, SHARED_GROUP), path
