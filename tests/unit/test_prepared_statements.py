"""The hot path's statements sent through the DBAPI cursor on SQLite (store/db.py's
``execute_prepared``) do what ``Connection.execute`` of the same Core statement does: the
same rows (types converted by their result processors), the same values stored (omitted
columns' defaults, the statement's literals, JSON encoded), the engine's cursor events,
SQLAlchemy's errors (a full volume is known by them, store/db.py), and a refusal of a
statement missing a parameter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from shellyard.store import executions as ex
from shellyard.store import notices
from shellyard.store.db import Database, execute_prepared
from shellyard.store.schema import agents, executions, runners, sessions, workspaces


def _seed(conn: Connection) -> None:
    conn.execute(sessions.insert().values(id="ses_1", state="active", created_at=1.0))
    conn.execute(
        agents.insert().values(
            id="agt_1", session_id="ses_1", state="active", gate="open", created_at=1.0
        )
    )
    conn.execute(runners.insert().values(id="local", kind="local", state="up", created_at=1.0))
    conn.execute(
        workspaces.insert().values(id="ws_1", agent_id="agt_1", runner_id="local", created_at=1.0)
    )


def _values(execution_id: str) -> dict[str, Any]:
    return {
        "id": execution_id, "agent_id": "agt_1", "workspace_id": "ws_1", "runner_id": "local",
        "command": "true", "background": False, "state": "queued", "created_at": 1.5,
    }  # fmt: skip


async def test_prepared_statements_give_what_core_gives(tmp_path: Path) -> None:
    store = await Database.open(f"sqlite:///{tmp_path / 'store.db'}")
    sent: list[str] = []

    def seen(_conn: Any, _cursor: Any, sql: str, *_rest: Any) -> None:
        sent.append(sql.split()[0])

    try:
        await store.run(_seed)
        event.listen(Engine, "before_cursor_execute", seen)

        def both(conn: Connection) -> tuple[Any, Any, Any, Any]:
            fast = execute_prepared(conn, ex._INSERT, _values("ex_fast")).first()
            slow = dict(conn.execute(ex._INSERT, _values("ex_slow")).mappings().one())
            read_fast = execute_prepared(conn, ex._BY_ID, {"b_id": "ex_slow"}).first()
            read_slow = dict(conn.execute(ex._BY_ID, {"b_id": "ex_fast"}).mappings().one())
            return fast, slow, read_fast, read_slow

        fast, slow, read_fast, read_slow = await store.run(both)
        assert sent == ["INSERT", "INSERT", "SELECT", "SELECT"]
        # the rows alike but for id and seq, the defaults sent, Booleans read as bool
        differ = {"id", "seq"}
        assert {k: v for k, v in fast.items() if k not in differ} == {
            k: v for k, v in slow.items() if k not in differ
        }
        assert fast["cancel_requested"] is False and fast["query_failures"] == 0
        assert (fast["seq"], slow["seq"]) == (1, 2)
        assert read_fast == slow and read_slow == fast

        def update(conn: Connection) -> Any:
            states = {"b_from_0": "queued", "b_from_1": "running"}
            params = {"state": "running", "was_unknown": True, "b_id": "ex_fast", **states}
            return execute_prepared(conn, ex._update_of(2), params)

        updated = await store.run(update)
        assert updated.rowcount == 1 and updated.first() is not None
        assert updated.rows[0]["state"] == "running" and updated.rows[0]["was_unknown"] is True

        def notice(conn: Connection) -> Any:
            notices.add_notice(conn, "agt_1", "execution", "ex_fast", "done", {"a": [1]}, None)
            notices.add_notice(conn, "agt_1", "execution", "ex_fast", "again", None, None)
            return conn.execute(sa.select(notices.notices)).mappings().all()

        (posted,) = await store.run(notice)  # N1: the second is a no-op, the JSON decoded
        assert posted["payload"] == {"a": [1]} and posted["summary"] == "done"

        with pytest.raises(sa.exc.IntegrityError) as refused:
            await store.run(lambda conn: execute_prepared(conn, ex._INSERT, _values("ex_fast")))
        assert type(refused.value.orig).__name__ == "IntegrityError"
        with pytest.raises(sa.exc.InvalidRequestError, match="b_id"):
            await store.run(lambda conn: execute_prepared(conn, ex._BY_ID, {}))
        rows = await store.run(lambda conn: conn.execute(sa.select(executions.c.id)).all())
        assert sorted(r[0] for r in rows) == ["ex_fast", "ex_slow"]  # nothing half-written
    finally:
        event.remove(Engine, "before_cursor_execute", seen)
        await store.close()
