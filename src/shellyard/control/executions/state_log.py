"""Structured log lines of executions' state changes (``serve --log-format json``,
docs/operations.md): the ids an operator follows an execution by, its session among them."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from shellyard.store import Store

log = logging.getLogger("shellyard.control.executions")

#: agent id → its session id, the oldest forgotten beyond SESSIONS_KEPT. An agent never moves
#: to another session (store/sessions.py changes only its state and gate) and ids are never
#: reused, so an entry cannot go stale; it spares the store a read at every state change
#: (docs/benchmarks.md, section 20: 7% of a replica's CPU per run).
_sessions: dict[str, str | None] = {}
SESSIONS_KEPT = 4096


async def log_state(store: Store, row: Mapping[str, Any]) -> None:
    """One ``info`` line for the record's state; its session costs a read the first time an
    agent is seen, so only when ``info`` is logged."""
    if not log.isEnabledFor(logging.INFO):
        return
    agent_id = str(row["agent_id"])
    if agent_id in _sessions:
        session_id = _sessions[agent_id]
    else:
        agent = await store.get_agent(agent_id)
        session_id = str(agent["session_id"]) if agent else None
        if agent is not None:  # a missing agent is not remembered: it may be made later
            if len(_sessions) >= SESSIONS_KEPT:
                del _sessions[next(iter(_sessions))]
            _sessions[agent_id] = session_id
    fields = {
        "action": "execution_" + str(row["state"]),
        "execution_id": row["id"],
        "session_id": session_id,
        "agent_id": row["agent_id"],
        "runner_id": row["runner_id"],
        "workspace_id": row["workspace_id"],
        "exit_code": row["exit_code"],
    }
    log.info("execution %s %s", row["id"], row["state"], extra=fields)
