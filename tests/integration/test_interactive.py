"""E13: interactive executions in real sandboxes, on the local runner and a direct runner
daemon: input to a prompt, a pipe fed then closed, a terminal's screen, keys that signal
(C-c, C-d), the refusals (not interactive, ended, another session's agent), and a terminal
that outlives a kill -9 of the control plane."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from runner_daemon_fixture import start_daemon

from conftest import Yard, open_yard
from shellyard.contract.executions import (
    ExecutionCancelQuery,
    ExecutionList,
    ExecutionLogsQuery,
    ExecutionState,
    ExecutionWait,
    RunShellRequest,
)
from shellyard.contract.interactive import ExecutionInputRequest, ScreenView
from shellyard.errors import Conflict, NotFound
from shellyard.home import ensure_server, is_served
from shellyard.runner.protocol import SandboxPolicy
from shellyard.sdk.client import Client


@pytest.fixture
async def yard(yard_factory: Any) -> AsyncIterator[Yard]:
    """conftest's yard, and after the test whatever still runs is cancelled: a failed test
    leaves no program waiting for input forever (executions outlive their plane, E11)."""
    made: Yard = await yard_factory()
    yield made
    for view in await made.plane.executions.list(ExecutionList()):
        if not view.state.terminal:
            await made.plane.executions.cancel(view.execution_id, ExecutionCancelQuery(wait_s=20))


async def send(yard: Yard, execution_id: str, **fields: Any) -> int:
    request = ExecutionInputRequest(**fields)
    return (await yard.plane.executions.send_input(execution_id, request, None)).accepted_bytes


async def until_screen(
    look: Callable[[], Awaitable[ScreenView]], text: str, timeout_s: float = 20
) -> ScreenView:
    """The screen once it shows ``text`` (a program answers in its own time)."""
    deadline = time.monotonic() + timeout_s
    while True:
        screen = await look()
        if text in screen.text or time.monotonic() > deadline:
            assert text in screen.text, screen.text
            return screen
        await asyncio.sleep(0.05)


async def test_read_prompt_answered(yard: Yard) -> None:
    """E13: a `read -p` prompt (stdin a pipe) waits, is seen waiting, and takes the answer;
    what was typed is the stdin log stream."""
    ran = await yard.run('read -p "name? " n; echo "hello $n"', interactive=True, wait_ms=5000)
    # the wait returned early: the command waits for input (E13 awaiting_input)
    assert ran.state == ExecutionState.running and ran.interactive and not ran.tty, ran
    assert ran.awaiting_input is True, ran
    assert await send(yard, ran.execution_id, text="ada", keys=["Enter"]) == 4
    view = await yard.ended(ran.execution_id)
    assert view.exit_code == 0 and view.awaiting_input is None
    logs = await yard.plane.executions.logs(ran.execution_id, ExecutionLogsQuery())
    assert logs.data == "hello ada\n"
    typed = await yard.plane.executions.logs(ran.execution_id, ExecutionLogsQuery(stream="stdin"))
    assert typed.data == "ada\n"
    with pytest.raises(Conflict, match="has ended"):
        await send(yard, ran.execution_id, text="late")


async def test_wc_fed_three_lines_then_eof(yard: Yard) -> None:
    """E13: input in several parts, then the end of input: `wc -l` counts 3 lines."""
    ran = await yard.run("wc -l", interactive=True, wait_ms=0)
    await send(yard, ran.execution_id, text="one\ntwo\n")
    await send(yard, ran.execution_id, text="three", keys=["Enter"])
    await send(yard, ran.execution_id, eof=True)
    view = await yard.ended(ran.execution_id)
    assert view.exit_code == 0
    assert (
        await yard.plane.executions.logs(ran.execution_id, ExecutionLogsQuery())
    ).data.strip() == "3"


async def test_python_repl_in_a_terminal(yard: Yard) -> None:
    """E13: `python3 -q -i` on a terminal: print(6*7) shows 42 on the screen; C-d ends it
    with exit 0; the raw output stays in the stdout log."""
    ran = await yard.run("python3 -q -i", tty=True, tty_rows=20, tty_cols=60, wait_ms=5000)
    assert ran.tty and ran.state == ExecutionState.running, ran
    executions = yard.plane.executions
    screen = await until_screen(lambda: executions.screen(ran.execution_id, None), ">>>")
    assert (screen.rows, screen.cols) == (20, 60)
    assert await send(yard, ran.execution_id, text="print(6*7)", keys=["Enter"]) == 11
    screen = await until_screen(lambda: executions.screen(ran.execution_id, None), "42")
    lines = screen.text.split("\n")
    assert len(lines) == 20 and ">>> print(6*7)" in lines and "42" in lines, screen.text
    assert screen.cursor.row == lines.index("42") + 1  # on the next prompt
    await send(yard, ran.execution_id, keys=["C-d"])
    view = await yard.ended(ran.execution_id)
    assert view.state == ExecutionState.completed and view.exit_code == 0, view
    assert "42" in (await executions.logs(ran.execution_id, ExecutionLogsQuery())).data
    # an ended terminal still shows its last screen
    assert "42" in (await executions.screen(ran.execution_id, None)).text


async def test_ctrl_c_interrupts_sleep_in_a_terminal(yard: Yard) -> None:
    """E13: C-c reaches the foreground program as SIGINT (exit 130), not a cancel."""
    ran = await yard.run("sleep 300", tty=True, wait_ms=0)
    await asyncio.sleep(0.5)
    await send(yard, ran.execution_id, keys=["C-c"])
    view = await yard.ended(ran.execution_id)
    assert view.state == ExecutionState.completed and view.exit_code == 130, view
    assert not view.cancel_requested


async def test_resize_reaches_the_program(yard: Yard) -> None:
    """E13: a resize changes the terminal's size as the program sees it (stty size)."""
    ran = await yard.run("read x; stty size", tty=True, wait_ms=0)
    screen = await yard.plane.executions.screen(ran.execution_id, None, _size(30, 100))
    assert (screen.rows, screen.cols) == (30, 100)
    await send(yard, ran.execution_id, keys=["Enter"])
    await yard.ended(ran.execution_id)
    assert (
        "30 100" in (await yard.plane.executions.logs(ran.execution_id, ExecutionLogsQuery())).data
    )


def _size(rows: int, cols: int) -> Any:
    from shellyard.contract.interactive import TerminalSize

    return TerminalSize(rows=rows, cols=cols)


async def test_refused_to_a_command_that_did_not_ask(yard: Yard) -> None:
    """E13: input to a non-interactive command, or a screen of one without a terminal, is
    refused with what to do."""
    ran = await yard.run("sleep 30", wait_ms=0)
    with pytest.raises(Conflict, match="did not ask for input"):
        await send(yard, ran.execution_id, text="x")
    with pytest.raises(Conflict, match="has no terminal"):
        await yard.plane.executions.screen(ran.execution_id, None)
    await yard.plane.executions.cancel(ran.execution_id, ExecutionCancelQuery(wait_s=20))
    piped = await yard.run("cat", interactive=True, wait_ms=0)
    with pytest.raises(Conflict, match="has no terminal"):
        await yard.plane.executions.screen(piped.execution_id, None)
    await send(yard, piped.execution_id, eof=True)
    assert (await yard.ended(piped.execution_id)).exit_code == 0


async def test_another_sessions_agent_cannot_send(yard: Yard) -> None:
    """E13, E4: another session's agent sees the execution as missing and cannot type."""
    ran = await yard.run("cat", interactive=True, wait_ms=0)
    intruder = (await yard.plane.sessions.create()).main_agent_id
    request = ExecutionInputRequest(text="rm -rf /workspace\n")
    with pytest.raises(NotFound):
        await yard.plane.executions.send_input(ran.execution_id, request, intruder)
    await send(yard, ran.execution_id, text="mine\n", eof=True)
    await yard.ended(ran.execution_id)
    assert (
        await yard.plane.executions.logs(ran.execution_id, ExecutionLogsQuery())
    ).data == "mine\n"


def test_terminal_survives_kill9_of_the_control_plane(served_home: Path) -> None:
    """E13, E11: the runner's holder keeps the terminal: after a kill -9 of the control plane
    and its restart, input reaches the same process (its pid printed before and after)."""
    client = Client.for_home(served_home)
    ran = client.run("echo pid=$$; read a; echo got=$a pid=$$", tty=True, wait_ms=0)
    deadline = time.monotonic() + 20
    while "pid=" not in client.screen(ran.execution_id).text:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    first = client.screen(ran.execution_id).text.split("pid=")[1].split()[0]
    info = ensure_server(served_home)
    os.kill(info.pid, signal.SIGKILL)
    while is_served(served_home):
        time.sleep(0.02)
    client = Client.for_home(served_home)  # a new control plane on the same home
    assert client.status(ran.execution_id).state == ExecutionState.running
    assert client.input(ran.execution_id, text="after", keys=["Enter"]).accepted_bytes == 6
    view = client.wait(ran.execution_id, 20)
    assert view.state == ExecutionState.completed and view.exit_code == 0, view
    out = client.logs(ran.execution_id).data
    assert f"got=after pid={first}" in out, out


async def type_line(plane: Any, execution_id: str, line: str) -> None:
    await plane.executions.send_input(
        execution_id, ExecutionInputRequest(text=line, keys=["Enter"]), None
    )


async def test_a_terminal_outlives_a_runner_daemon_outage(home: Path) -> None:
    """E13/R3: a tty execution on a runner daemon: the daemon is killed -9, the record turns
    ``unknown`` and input is refused meanwhile with the runner's error; the daemon restarts,
    the record is running again (``was_unknown``), the same process takes input and its
    screen shows what came before the outage and after."""
    plane, _, _ = await open_yard(home, "local")
    daemon = await start_daemon(home / "daemon", SandboxPolicy(), subprocess=True)
    executions = plane.executions
    try:
        await plane.runners.add_direct("remote", daemon.url, daemon.token)
        ran = await executions.run_shell(
            RunShellRequest(command="python3 -q -i", runner_id="remote", tty=True, wait_ms=5000)
        )
        execution_id = ran.execution_id
        await until_screen(lambda: executions.screen(execution_id, None), ">>>")
        await executions.send_input(
            execution_id,
            ExecutionInputRequest(text="import os; a = os.getpid()", keys=["Enter"]),
            None,
        )
        await executions.send_input(
            execution_id, ExecutionInputRequest(text="print('before', a)", keys=["Enter"]), None
        )
        screen = await until_screen(lambda: executions.screen(execution_id, None), "before ")
        pid_before = screen.text.split("before ", 1)[1].split()[0]
        daemon.kill()
        view = await executions.wait(execution_id, ExecutionWait(timeout_s=30))
        assert view.state == ExecutionState.unknown, view
        # the runner cannot be reached: nothing is sent, and the caller is told to send again
        with pytest.raises(Conflict, match=r"cannot be reached now \(unknown\): nothing was sent"):
            await type_line(plane, execution_id, "print('lost')")
        await daemon.restart()
        deadline = time.monotonic() + 30
        while view.state == ExecutionState.unknown and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            view = await executions.status(execution_id)
        assert view.state == ExecutionState.running and view.was_unknown, view
        await type_line(plane, execution_id, "print('after', os.getpid())")
        screen = await until_screen(lambda: executions.screen(execution_id, None), "after ")
        assert f"after {pid_before}" in screen.text and f"before {pid_before}" in screen.text
        assert "lost" not in screen.text
        await executions.send_input(execution_id, ExecutionInputRequest(keys=["C-d"]), None)
        for _ in range(6):
            view = await executions.wait(execution_id, ExecutionWait(timeout_s=10))
            if view.state.terminal:
                break
        assert view.state == ExecutionState.completed and view.exit_code == 0, view
    finally:
        for view in await executions.list(ExecutionList()):
            if not view.state.terminal:
                with contextlib.suppress(Exception):
                    await executions.cancel(view.execution_id, ExecutionCancelQuery(wait_s=20))
        await plane.aclose()
        await daemon.stop()
