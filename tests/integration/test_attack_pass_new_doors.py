"""Attack pass on the batch's new doors (docs/security.md "Attack pass on the batch's new
doors"), E13 interactive executions: as the holder of another session's agent token, from
inside the sandbox, as a local unprivileged user, and as a program printing without end to a
terminal someone looks at. Real sandboxes, real pyte screens, real files."""

from __future__ import annotations

import asyncio
import os
import pwd
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from test_interactive import send

from conftest import Yard, open_yard
from shellyard.contract.executions import (
    ExecutionCancelQuery,
    ExecutionList,
    ExecutionLogsQuery,
    ExecutionWait,
)
from shellyard.contract.interactive import ExecutionInputRequest, TerminalSize
from shellyard.errors import NotFound
from shellyard.runner.sandbox import terminal


@pytest.fixture
async def yard(yard_factory: Any) -> AsyncIterator[Yard]:
    made: Yard = await yard_factory()
    yield made
    for view in await made.plane.executions.list(ExecutionList()):
        if not view.state.terminal:
            await made.plane.executions.cancel(view.execution_id, ExecutionCancelQuery(wait_s=20))


async def test_another_session_cannot_look_at_or_resize_a_terminal(yard: Yard) -> None:
    """E13, E4: the screen and the resize of another session's execution answer as for a
    missing one, and the owner's terminal keeps its size."""
    ran = await yard.run("cat", tty=True, tty_rows=20, tty_cols=60, wait_ms=0)
    executions = yard.plane.executions
    intruder = (await yard.plane.sessions.create()).main_agent_id
    with pytest.raises(NotFound):
        await executions.screen(ran.execution_id, intruder)
    with pytest.raises(NotFound):
        await executions.screen(ran.execution_id, intruder, TerminalSize(rows=5, cols=10))
    with pytest.raises(NotFound):
        await executions.send_input(ran.execution_id, ExecutionInputRequest(keys=["C-c"]), intruder)
    screen = await executions.screen(ran.execution_id, None)
    assert (screen.rows, screen.cols) == (20, 60)
    await send(yard, ran.execution_id, keys=["C-d"])
    await yard.ended(ran.execution_id)


async def test_a_sandboxed_command_sees_no_input_fifo_nor_holder(yard: Yard) -> None:
    """E13: the FIFO ``input`` and the holder live outside the sandbox: a command looking
    for any named pipe, or for a process besides its own, finds none."""
    script = (
        "find / -xdev -type p 2>/dev/null | grep -v '^/proc' ; echo fifos-end; "
        "for p in /proc/[0-9]*; do cat $p/comm; done | sort -u | tr '\\n' ' '; echo; read x"
    )
    ran = await yard.run(script, interactive=True, wait_ms=0)
    await asyncio.sleep(0.5)
    await send(yard, ran.execution_id, text="done\n", eof=True)
    await yard.ended(ran.execution_id)
    out = (await yard.plane.executions.logs(ran.execution_id, ExecutionLogsQuery())).data
    fifos, processes = out.split("fifos-end\n")
    assert fifos == ""
    assert "python" not in processes, processes  # the holder is python3 -I -S
    assert set(processes.split()) <= {"bwrap", "sh", "bash", "cat", "sort", "tr", "setsid", "init"}


@pytest.mark.runner_kinds("local")
async def test_a_local_user_cannot_write_to_the_input_fifo(yard: Yard) -> None:
    """E13: the FIFO is the runner user's alone (0600 in the execution's folder): ``nobody``
    can neither open it to type nor read the terminal's log."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as nobody")
    ran = await yard.run("cat", tty=True, wait_ms=0)
    directory = yard.runner._runs.execution_folder(ran.execution_id)
    nobody = pwd.getpwnam("nobody")
    for path, mode in (
        (directory / terminal.INPUT, os.O_WRONLY),
        (directory / "stdout", os.O_RDONLY),
    ):
        probe = subprocess.run(
            [
                "/usr/bin/python3",
                "-c",
                f"import os; os.open({str(path)!r}, {mode} | os.O_NONBLOCK)",
            ],
            user=nobody.pw_uid,
            group=nobody.pw_gid,
            extra_groups=[],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert probe.returncode != 0 and "PermissionError" in probe.stderr, probe.stderr
    await send(yard, ran.execution_id, keys=["C-d"])
    await yard.ended(ran.execution_id)


def _terminal_folder(tmp_path: Path, log: bytes) -> Path:
    (tmp_path / terminal.SIZE).write_text("24 80")
    (tmp_path / "stdout").write_bytes(log)
    return tmp_path


def _append(directory: Path, data: bytes) -> None:
    with (directory / "stdout").open("ab") as handle:
        handle.write(data)


def test_a_look_feeds_at_most_replay_bytes_of_new_output(tmp_path: Path) -> None:
    """E13: a program that opened an OSC string and printed on for more than a look
    replays: the next look starts from the log's last REPLAY_BYTES (pyte, fed it all, would
    spend about a second a megabyte of the control plane's CPU and show nothing)."""
    directory = _terminal_folder(tmp_path, b"\x1b]0;")
    screens = terminal.Screens()
    assert screens.view(directory).text.strip() == ""
    _append(directory, b"a" * (terminal.REPLAY_BYTES + 1) + b"\r\n\x1b[2Jvisible")
    assert "visible" in screens.view(directory).text


def test_a_screen_fed_on_and_on_is_rebuilt(tmp_path: Path) -> None:
    """E13: an OSC string never ended, printed a little between each two looks, is not kept
    whole in memory for ever: once a screen was fed REBUILD_BYTES it is built again from the
    log's end."""
    directory = _terminal_folder(tmp_path, b"\x1b]0;")
    screens = terminal.Screens()
    piece = b"b" * (terminal.REPLAY_BYTES // 2)
    for _ in range(terminal.REBUILD_BYTES // len(piece) - 1):
        _append(directory, piece)
        assert screens.view(directory).text.strip() == ""  # still inside the OSC string
    _append(directory, piece + b"\r\n\x1b[2Jvisible")
    assert "visible" in screens.view(directory).text


async def test_a_command_leaves_nothing_a_warm_sandbox_shows(home: Path) -> None:
    """E1, E2 with warm sandboxes: a command that left a process behind and, while it still
    runs, looks for the next command's waiting sandbox finds neither the waiter nor its pipe;
    the next command (in the warm sandbox) sees no process, file in /tmp or descriptor of the
    earlier one: only its own stdin, stdout and stderr are open."""
    from test_warm_sandbox import meta, run, wait_for_warm

    plane, _, _ = await open_yard(home, "local")
    try:
        runner = plane.runners.get("local")
        first = await run(
            plane,
            "touch /tmp/left; (setsid sleep 300 &) ; sleep 2; "
            "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done; "
            "grep -ls SANDBOX_ID=warm /proc/[0-9]*/environ; true",
            wait_ms=0,
        )
        await wait_for_warm(runner, first.workspace_id)  # made while the first runs
        done = await plane.executions.wait(first.execution_id, ExecutionWait(timeout_s=30))
        assert done.exit_code == 0, done
        seen = (await plane.executions.logs(first.execution_id, ExecutionLogsQuery())).data
        # its own leftover, and no waiter (run as /proc/self/fd/N, its id in its environment)
        lines = seen.splitlines()
        assert "sleep 300 " in lines and not [x for x in lines if x.startswith("/proc/")], seen
        await wait_for_warm(runner, first.workspace_id)
        look = "ls /tmp; for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done"
        second = await run(plane, f"{look}; ls /proc/self/fd")
        assert meta(runner, second.execution_id)["sandbox_id"].startswith("warm-")
        assert "left" not in second.stdout and "sleep 300" not in second.stdout
        assert second.stdout.split()[-4:] == ["0", "1", "2", "3"]  # 3: ls's own listing
    finally:
        await plane.aclose()
