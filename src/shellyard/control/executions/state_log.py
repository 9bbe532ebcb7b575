"""Structured log lines of executions' state changes (``serve --log-format json``,
docs/operations.md): the ids an operator follows an execution by, its session among them."""

from __future__ import annotations

import logging

from shellyard.control.agents import session_of
from shellyard.store import Store
from shellyard.store.executions import Execution

log = logging.getLogger("shellyard.control.executions")


async def log_state(store: Store, row: Execution) -> None:
    """One ``info`` line for the record's state; its session is read once per agent
    (``session_of``), and only when ``info`` is logged."""
    if not log.isEnabledFor(logging.INFO):
        return
    fields = {
        "action": "execution_" + row.state,
        "execution_id": row.id,
        "session_id": await session_of(store, row.agent_id),
        "agent_id": row.agent_id,
        "runner_id": row.runner_id,
        "workspace_id": row.workspace_id,
        "exit_code": row.exit_code,
    }
    log.info("execution %s %s", row.id, row.state, extra=fields)
