"""E13: input to a running interactive execution, its terminal's screen and size.

The runner holds the terminal and the input pipe (runner/sandbox/terminal.py); this room
checks who may send (the execution's owner, as every execution call: E4) and that the
execution takes input now, then passes the bytes through the Runner protocol. A wait on an
interactive execution may also end early when the program waits for input
(``until_prompt``): an agent learns it should answer instead of sitting out its wait."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Mapping
from typing import TypeVar

from shellyard.contract.interactive import (
    ExecutionInputRequest,
    InputResult,
    ScreenView,
    TerminalSize,
)
from shellyard.contract.rawjson import parse
from shellyard.control.executions import options
from shellyard.errors import Conflict, InvalidInput, ShellyardError
from shellyard.runner.protocol import Runner, RunnerExecState
from shellyard.store.executions import Execution

#: How often a wait on an interactive execution asks the runner whether it waits for input.
PROMPT_POLL_S = 0.05
#: A prompt must be seen this long (two polls) before a wait returns for it: a program
#: between two reads of its input is not yet waiting for the caller.
PROMPT_SETTLE_S = 0.1

T = TypeVar("T")
#: A request body, read after the owner check (a model already read passes as it is).
InputBody = ExecutionInputRequest | Mapping[str, object]
SizeBody = TerminalSize | Mapping[str, object]


def taking_input(row: Execution, execution_id: str, *, tty: bool = False) -> None:
    """Conflict unless the record is a running interactive execution (a tty one: ``tty``)."""
    fields = options.terminal_fields(options.of(row))
    if not fields["interactive"]:
        raise Conflict(
            f"execution {execution_id} did not ask for input: only a command started with "
            "interactive: true (or tty: true) takes execution_input; run it again with one"
        )
    if tty and not fields["tty"]:
        raise Conflict(
            f"execution {execution_id} has no terminal: start it with tty: true for a screen; "
            "read its output with execution_logs"
        )
    if row.state == "unknown":  # E9/R3: its runner may answer again; the program may live
        raise Conflict(
            f"execution {execution_id}'s runner cannot be reached now (unknown): nothing was "
            "sent; send it again once execution_status says running"
        )
    if row.state not in ("running", "queued"):
        raise Conflict(
            f"execution {execution_id} has ended ({row.state}): it takes no more input; "
            "its output stays in execution_logs"
        )
    if row.state == "queued":
        raise Conflict(
            f"execution {execution_id} is queued and has not started: send input once "
            "execution_status says running"
        )


async def send_input(runner: Runner, row: Execution, body: InputBody) -> InputResult:
    execution_id = row.id
    request = parse(ExecutionInputRequest, body)
    taking_input(row, execution_id)
    tty = bool(options.of(row).get("tty"))
    try:
        data = request.data(tty)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    eof = request.eof
    if tty and eof:  # a terminal has no end of its own: C-d ends a line discipline's input
        data, eof = data + b"\x04", False
    accepted = await runner.send_input(execution_id, data, eof)
    return InputResult(accepted_bytes=accepted)


async def screen(runner: Runner, row: Execution, size: SizeBody | None = None) -> ScreenView:
    """The screen now; with ``size``, the terminal resized first."""
    if size is not None:
        return await resize(runner, row, parse(TerminalSize, size))
    fields = options.terminal_fields(options.of(row))
    if not fields["tty"]:
        raise Conflict(
            f"execution {row.id} has no terminal: only a command started with tty: true "
            "has a screen; read its output with execution_logs"
        )
    if row.logs_pruned_at is not None:
        raise Conflict(
            f"execution {row.id} has no screen any more: retention deleted its logs "
            "(docs/operations.md)"
        )
    # An ended terminal still shows its last screen (the log is kept).
    return await runner.screen(row.id)


async def resize(runner: Runner, row: Execution, size: TerminalSize) -> ScreenView:
    taking_input(row, row.id, tty=True)
    return await runner.resize(row.id, size.rows, size.cols)


async def awaiting_input(runner: Runner, row: Execution) -> bool | None:
    """The runner's ``awaiting_input`` for a running interactive record, else None."""
    if row.state != "running" or not options.of(row).get("interactive"):
        return None
    with contextlib.suppress(ShellyardError):
        result = await runner.status(row.id)
        if result.state == RunnerExecState.running:
            return result.awaiting_input
    return None


async def until_prompt(wait: Awaitable[T], runner: Runner | None, execution_id: str) -> T | None:
    """``wait``'s result, or None as soon as the interactive execution waits for input
    (seen twice, ``PROMPT_SETTLE_S``); ``runner`` None: just ``wait``."""
    if runner is None:
        return await wait
    task = asyncio.ensure_future(wait)
    try:
        seen = 0
        while not task.done():
            done, _ = await asyncio.wait({task}, timeout=PROMPT_POLL_S)
            if done:
                break
            with contextlib.suppress(ShellyardError):
                status = await runner.status(execution_id)
                seen = seen + 1 if status.awaiting_input else 0
                if seen * PROMPT_POLL_S >= PROMPT_SETTLE_S:
                    return None
        return task.result()
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
