"""E1 per-command options: what the record keeps of ``timeout_ms``, ``env``, ``cwd`` and
``args`` (one JSON column, revision 0012_run_options), and the timeout's deadline.

The timeout is an explicit cancel on the caller's behalf (E5): the watcher of the execution
sends it at ``started_at + timeout_ms``, and marks the record ``ended_by_limit = "timeout"``
first, so a watcher taking over after a restart (E11) knows the deadline and the cause."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from shellyard.contract.executions import ExecutionState, RunShellRequest
from shellyard.paths import normalize_relative
from shellyard.runner.protocol import Runner, RunnerExecState, RunnerExecution
from shellyard.store import Store
from shellyard.store.executions import Execution

TIMEOUT = "timeout"


def record(request: RunShellRequest) -> str | None:
    """The ``run_options`` column for a request (None when it sets none)."""
    options = {
        "timeout_ms": request.timeout_ms,
        "env": request.env or None,
        # W6: "..", absolute paths, NUL refused (PathRefused) before anything is recorded
        "cwd": normalize_relative(request.cwd) or None if request.cwd is not None else None,
        "args": request.args or None,
        # E13: input while it runs; a terminal of this size
        "interactive": request.interactive or None,
        "tty": [request.tty_rows, request.tty_cols] if request.tty else None,
    }
    kept = {name: value for name, value in options.items() if value is not None}
    return json.dumps(kept) if kept else None


def of(row: Execution) -> dict[str, Any]:
    text = row.run_options
    return dict(json.loads(text)) if text else {}


def start_fields(row: Execution) -> dict[str, Any]:
    """The StartRequest fields the record's options fill in."""
    options = of(row)
    return {
        "env": options.get("env") or {},
        "cwd": options.get("cwd"),
        "args": options.get("args") or [],
        **terminal_fields(options),
    }


def terminal_fields(options: Mapping[str, Any]) -> dict[str, Any]:
    """E13: the StartRequest's (and the view's) ``interactive`` and ``tty`` fields."""
    size = options.get("tty")
    fields: dict[str, Any] = {"interactive": bool(options.get("interactive")), "tty": bool(size)}
    if size:
        fields["tty_rows"], fields["tty_cols"] = int(size[0]), int(size[1])
    return fields


def deadline(row: Execution) -> float | None:
    """When the timeout cancels it (wall clock, from its start), or None."""
    timeout_ms = of(row).get("timeout_ms")
    if timeout_ms is None:
        return None
    started = row.started_at or time.time()
    return started + int(timeout_ms) / 1000


def error(row: Execution) -> str:
    return (
        f"timeout: it ran longer than its timeout_ms ({of(row).get('timeout_ms')} ms) and was "
        "cancelled on the caller's behalf (E5)"
    )


async def expire(store: Store, runner: Runner, execution_id: str) -> bool:
    """The deadline passed: record the cause first (a restart finds it), then cancel (E7)."""
    await store.update_execution(execution_id, cancel_requested=True, ended_by_limit=TIMEOUT)
    await runner.cancel(execution_id)
    return True


def outcome(row: Execution, result: RunnerExecution) -> tuple[ExecutionState, str | None]:
    """The record's terminal state and error for the runner's ``result`` (E7, E9; a cancel of
    ``timeout_ms`` says so in the error, E5)."""
    if result.state == RunnerExecState.lost:
        return ExecutionState.unknown, result.error
    if result.cancelled:
        return ExecutionState.cancelled, error(row) if result.limit == TIMEOUT else None
    if result.exit_code is None:
        return ExecutionState.failed, result.error
    return ExecutionState.completed, result.error
