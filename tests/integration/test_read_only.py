"""Read-only executions beside the writer (issue 17; W1, W2, E3–E7, DESIGN.md §5), with real
sandboxes on the local runner and on a runner daemon (the ``yard`` fixture).

A read-only execution takes no writer, sees the workspace's last committed snapshot bound
read-only at /workspace, and makes no snapshot; everything else is as for any execution.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import time
from pathlib import Path

import pytest
from runner_daemon_fixture import start_daemon

from conftest import Yard, kill_server, sy
from shellyard.contract.executions import (
    ExecutionCancelQuery,
    ExecutionLogsQuery,
    ExecutionState,
    ExecutionWait,
    RunShellRequest,
    RunShellResult,
)
from shellyard.errors import WorkspaceBusy
from shellyard.runner.protocol import SandboxPolicy
from shellyard.sdk.client import Client

needs_shared_network = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("nsenter") is None,
    reason="a network namespace per workspace needs root and util-linux's nsenter",
)


async def _wait_for_log(yard: Yard, execution_id: str, text: str, timeout_s: float = 30) -> None:
    """Until the execution's stdout holds ``text`` (the command reached that point)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        logs = await yard.plane.executions.logs(execution_id, ExecutionLogsQuery())
        if text in logs.data:
            return
        assert not logs.state.terminal, f"{execution_id} ended before printing {text!r}"
        await asyncio.sleep(0.05)
    raise AssertionError(f"{execution_id} did not print {text!r} within {timeout_s} s")


async def _background_writer(yard: Yard) -> RunShellResult:
    """A writer that changes the workspace's files in place, then holds the writer."""
    first = await yard.run("echo committed > data.txt")
    assert first.state == ExecutionState.completed
    writer = await yard.run(
        "echo half-written > data.txt; echo new > fresh.txt; echo changed; sleep 60",
        background=True,
    )
    await _wait_for_log(yard, writer.execution_id, "changed")
    return writer


async def test_reader_runs_beside_the_writer_on_committed_files(yard: Yard) -> None:
    """W1: a read-only execution starts while a background writer holds the workspace, where a
    writer is refused; W2: it reads the committed files, never the writer's half-written ones;
    it makes no snapshot and leaves the writer holding the workspace."""
    writer = await _background_writer(yard)
    workspace = writer.workspace_id
    before = [s.seq for s in await yard.runner.list_snapshots(workspace)]
    try:
        reader = await yard.run(
            "cat data.txt; test -e fresh.txt && echo sees-fresh || echo no-fresh", read_only=True
        )
        assert reader.state == ExecutionState.completed, reader
        assert reader.exit_code == 0
        assert reader.stdout == "committed\nno-fresh\n"
        assert reader.read_only and reader.snapshot_seq is None
        assert reader.workspace_id == workspace
        assert [s.seq for s in await yard.runner.list_snapshots(workspace)] == before
        try:
            await yard.run("true")
        except WorkspaceBusy as exc:  # the writer is still the background one
            assert writer.execution_id in exc.message
        else:
            raise AssertionError("a second writer ran beside the background writer")
    finally:
        await yard.plane.executions.cancel(writer.execution_id, ExecutionCancelQuery(wait_s=30))
    ended = await yard.plane.executions.status(writer.execution_id)
    assert ended.state == ExecutionState.cancelled and ended.snapshot_seq is not None
    assert await yard.read_file(workspace, ended.snapshot_seq, "data.txt") == b"half-written\n"
    # Now committed: a reader sees the writer's files.
    after = await yard.run("cat data.txt fresh.txt", read_only=True)
    assert after.stdout == "half-written\nnew\n"


async def test_reader_cannot_write_the_workspace(yard: Yard) -> None:
    """A read-only execution's writes to /workspace fail as on a read-only filesystem; /tmp
    takes writes; nothing it tried shows in the workspace afterwards."""
    await yard.run("echo keep > kept.txt")
    result = await yard.run(
        "echo x > /workspace/new.txt; echo rc=$?; rm -f kept.txt; echo rc=$?; "
        "mkdir sub; echo rc=$?; echo tmp > /tmp/t && cat /tmp/t",
        read_only=True,
    )
    assert result.state == ExecutionState.completed
    assert result.stdout == "rc=1\nrc=1\nrc=1\ntmp\n"
    assert "Read-only file system" in result.stderr
    check = await yard.run("ls")
    assert check.stdout == "kept.txt\n"


async def test_reader_budget_logs_cancel_and_notice(yard: Yard) -> None:
    """E3: wait_ms is a budget for a reader too; E6 logs; E7 cancel ends it as cancelled;
    N1: its end posts a notice. No snapshot either way."""
    head = (await yard.run("echo x > a.txt")).snapshot_seq
    slow = await yard.run("echo started; sleep 2; echo done", read_only=True, wait_ms=200)
    assert slow.state == ExecutionState.running and slow.read_only
    view = await yard.plane.executions.wait(slow.execution_id, ExecutionWait(timeout_s=30))
    assert view.state == ExecutionState.completed and view.exit_code == 0
    assert view.snapshot_seq is None
    logs = await yard.plane.executions.logs(slow.execution_id, ExecutionLogsQuery())
    assert logs.data == "started\ndone\n" and logs.complete

    long = await yard.run("echo up; sleep 120", read_only=True, background=True)
    await _wait_for_log(yard, long.execution_id, "up")
    cancelled = await yard.plane.executions.cancel(
        long.execution_id, ExecutionCancelQuery(wait_s=30)
    )
    assert cancelled.state == ExecutionState.cancelled and cancelled.snapshot_seq is None
    notices = await yard.plane.inbox.notices(None)
    assert any(n.subject_id == long.execution_id for n in notices)
    snapshots = await yard.runner.list_snapshots(long.workspace_id)
    assert max(s.seq for s in snapshots) == head


async def test_readers_run_beside_each_other(yard: Yard) -> None:
    """Readers take nothing: two at once both run, while no writer is involved at all."""
    first = await yard.run("echo one; sleep 60", read_only=True, background=True)
    await _wait_for_log(yard, first.execution_id, "one")
    try:
        second = await yard.run("echo two", read_only=True)
        assert second.state == ExecutionState.completed and second.stdout == "two\n"
        writer = await yard.run("echo w > w.txt")  # a reader never holds the writer
        assert writer.state == ExecutionState.completed and writer.snapshot_seq is not None
    finally:
        await yard.plane.executions.cancel(first.execution_id, ExecutionCancelQuery(wait_s=30))


# --------------------------------------------------------------------- one network per workspace

PORT = 8765

#: Fetch a path from the workspace's server on localhost, retrying until it listens.
FETCH = (
    "import sys, time, urllib.request\n"
    "for _ in range(200):\n"
    "    try:\n"
    "        print(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode(), end='')\n"
    "        sys.exit(0)\n"
    "    except OSError as exc:\n"
    "        err = exc\n"
    "        time.sleep(0.05)\n"
    "print('unreachable:', err, file=sys.stderr); sys.exit(3)\n"
)


def _fetch(path: str, attempts_script: str = FETCH) -> str:
    return f"python3 -c \"$(cat <<'PY'\n{attempts_script}PY\n)\" http://127.0.0.1:{PORT}/{path}"


async def _server(yard: Yard) -> RunShellResult:
    """A background http.server holding the writer; it serves a file written after the last
    commit, so only the server (not the reader's own view) can give it."""
    server = await yard.run(
        f"echo served-live > live.txt; echo listening; "
        f"exec python3 -m http.server {PORT} --bind 127.0.0.1 --directory /workspace",
        background=True,
    )
    await _wait_for_log(yard, server.execution_id, "listening")
    return server


@needs_shared_network
async def test_reader_reaches_the_background_server_on_localhost(yard: Yard) -> None:
    """Issue 17: the server holds the writer; a read-only execution in the same workspace
    fetches a file from it at localhost:PORT (one network per workspace); its own view holds
    only the committed files (W2)."""
    server = await _server(yard)
    try:
        reader = await yard.run(
            _fetch("live.txt") + "; test -e live.txt && echo view-has-it || echo view-lacks-it",
            read_only=True,
            wait_ms=30_000,
        )
        assert reader.state == ExecutionState.completed, reader.stderr
        assert reader.stdout == "served-live\nview-lacks-it\n", reader.stderr
        assert reader.workspace_id == server.workspace_id
        # the namespace outlives a reader: a second one reaches the server too
        again = await yard.run(_fetch("live.txt"), read_only=True, wait_ms=30_000)
        assert again.stdout == "served-live\n", again.stderr
    finally:
        await yard.plane.executions.cancel(server.execution_id, ExecutionCancelQuery(wait_s=30))


@needs_shared_network
async def test_other_workspace_and_host_cannot_reach_the_server(yard: Yard) -> None:
    """Issue 17: another agent's workspace on the same runner, and the host's loopback, do not
    reach the server of this workspace."""
    server = await _server(yard)
    try:
        ok = await yard.run(_fetch("live.txt"), read_only=True, wait_ms=30_000)
        assert ok.stdout == "served-live\n", ok.stderr  # it does listen
        other_session = await yard.plane.sessions.create()
        quick = FETCH.replace("range(200)", "range(3)")
        other = await yard.plane.executions.run_shell(
            RunShellRequest(command=_fetch("live.txt", quick), runner_id=yard.runner_id),
            other_session.main_agent_id,
        )
        assert other.workspace_id != server.workspace_id
        assert other.state == ExecutionState.completed
        assert other.exit_code == 3 and "unreachable" in other.stderr
        with socket.socket() as probe:
            probe.settimeout(2)
            assert probe.connect_ex(("127.0.0.1", PORT)) != 0
    finally:
        await yard.plane.executions.cancel(server.execution_id, ExecutionCancelQuery(wait_s=30))


@needs_shared_network
@pytest.mark.parametrize("runner", ["local", "direct"])
async def test_kill9_control_plane_keeps_server_reader_and_network(
    served_home: Path, runner: str
) -> None:
    """Issue 17, E11: kill -9 of the control plane while a server and a read-only client run;
    both are re-attached, the client ends with the server's answer, and the shared network
    still works for a new reader afterwards (for ``local`` the runner restarts too)."""
    home = served_home
    daemon = None
    runner_id = None
    if runner == "direct":
        daemon = await start_daemon(home / "daemon", SandboxPolicy(), subprocess=True)
        runner_id = "remote"
    client = Client.for_home(home)
    if daemon is not None:
        client._http.post(  # the REST registration the CLI's 'runner add' uses
            "/v1/runners",
            json={"runner_id": "remote", "address": daemon.url, "token": daemon.token},
        ).raise_for_status()
    server = client.run(
        f"echo served-live > live.txt; "
        f"exec python3 -m http.server {PORT} --bind 127.0.0.1 --directory /workspace",
        background=True,
        runner_id=runner_id,
    )
    reader = client.run(
        "sleep 3; " + _fetch("live.txt"), read_only=True, background=True, runner_id=runner_id
    )
    kill_server(home)
    await asyncio.sleep(1)
    client = Client.for_home(home)  # a new control plane on the same home
    try:
        view = client.wait(reader.execution_id, 30)
        assert view.state == ExecutionState.completed and view.exit_code == 0
        assert client.logs(reader.execution_id).data == "served-live\n"
        assert client.status(server.execution_id).state == ExecutionState.running
        again = client.run(_fetch("live.txt"), read_only=True, wait_ms=30_000, runner_id=runner_id)
        assert again.state == ExecutionState.completed and again.stdout == "served-live\n"
    finally:
        client.cancel(server.execution_id)
        assert client.wait(server.execution_id, 30).state == ExecutionState.cancelled
        if daemon is not None:
            await daemon.stop()


def test_cli_read_only_runs_beside_a_background_writer(served_home: Path) -> None:
    """Issue 17: ``shellyard run --read-only`` runs while a background writer holds the
    workspace (a plain ``run`` is refused, exit 75), reads the committed files and cannot
    write them."""
    assert sy(served_home, "run", "--", "echo committed > data.txt").returncode == 0
    writer = sy(served_home, "run", "--background", "--", "sleep 600").stdout.strip()
    try:
        refused = sy(served_home, "run", "--", "true")
        assert refused.returncode == 75 and writer in refused.stderr
        reader = sy(served_home, "run", "--read-only", "--", "cat data.txt; touch x")
        assert reader.returncode == 1, reader.stderr
        assert reader.stdout == "committed\n" and "Read-only file system" in reader.stderr
        view = json.loads(sy(served_home, "run", "--read-only", "--json", "--", "true").stdout)
        assert view["read_only"] is True and view["snapshot_seq"] is None
    finally:
        sy(served_home, "cancel", writer)


def _plant(folder: Path) -> dict[str, bytes]:
    """A host folder a link-swap test aims at: a subfolder with a file, and a file."""
    (folder / "victim-dir").mkdir(parents=True)
    (folder / "victim-dir" / "inner").write_bytes(b"inner")
    (folder / "victim-file").write_bytes(b"victim")
    return {"victim-dir/inner": b"inner", "victim-file": b"victim"}


async def test_view_patch_never_follows_a_link_that_replaced_a_folder(yard: Yard) -> None:
    """W2, W6 (docs/security.md, "File trees never follow a link"): a folder of the last
    view replaced by a symbolic link to a host folder, then another reader: patching the
    kept view removes the old folder's entries before placing the link and never works
    through it, so the host folder and the control plane's database stay whole."""
    canary = yard.home / "canary"
    planted = _plant(canary)
    home = yard.home / "home"
    db_files = sorted(p.name for p in home.iterdir() if p.name.startswith("shellyard.db"))
    assert "shellyard.db" in db_files
    made = await yard.run(
        "mkdir -p d/victim-dir e && touch d/victim-file d/victim-dir/inner && "
        + " ".join(f"touch e/{name};" for name in db_files)
    )
    assert made.state == ExecutionState.completed, made.stderr
    first = await yard.run("ls d e", read_only=True)
    assert first.state == ExecutionState.completed and "victim-file" in first.stdout
    swap = await yard.run(f"rm -rf d e && ln -s {canary} d && ln -s {home} e")
    assert swap.state == ExecutionState.completed, swap.stderr
    second = await yard.run("readlink d e", read_only=True)
    assert second.state == ExecutionState.completed, second.stderr
    assert second.stdout == f"{canary}\n{home}\n"
    for rel, data in planted.items():
        assert (canary / rel).read_bytes() == data, rel
    assert sorted(p.name for p in home.iterdir() if p.name.startswith("shellyard.db")) == (db_files)
    assert (await yard.run("echo still-here")).stdout == "still-here\n"


async def test_read_view_link_counts_are_independent_of_other_workspaces(yard: Yard) -> None:
    """W2 (docs/security.md, "Read views"): a file of a read view shares no inode with
    another workspace's view of the same content, so its link count cannot confirm that
    another session holds a guessed file."""
    other_session = await yard.plane.sessions.create()
    script = "printf 'a guessed secret' > f && cp f g && chmod +x g"
    mine = await yard.run(script)
    assert mine.state == ExecutionState.completed
    before = await yard.run("stat -c %h f g", read_only=True)
    assert before.state == ExecutionState.completed, before.stderr
    for _ in range(2):  # the other session's view of the same bytes, read by two readers
        theirs = await yard.plane.executions.run_shell(
            RunShellRequest(command=script, runner_id=yard.runner_id),
            other_session.main_agent_id,
        )
        assert theirs.workspace_id != mine.workspace_id
        held = await yard.plane.executions.run_shell(
            RunShellRequest(command="stat -c %h f g", read_only=True, runner_id=yard.runner_id),
            other_session.main_agent_id,
        )
        assert held.stdout == "1\n1\n", held.stderr
    after = await yard.run("stat -c %h f g", read_only=True)
    assert before.stdout == after.stdout == "1\n1\n"
