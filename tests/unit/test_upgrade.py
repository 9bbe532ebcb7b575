"""Upgrades (issue 18): a database made by an older release opens with this one, data kept.

The fixture is built in the test, honestly: Alembic runs only up to an older head (the first
schema, or every head this release found on main before its own revision), with a plain
engine as that release had it (no incremental vacuum), records are written with that schema's
columns, then the current code opens it (migrations to every head) and reads them. On SQLite
the file is converted to incremental vacuum once, at start-up, with the data kept."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from conftest import POSTGRES_URL
from shellyard.store import Store, schema

#: This release's own revision: everything else was a head of an older release.
NEW_REVISIONS = {"0015_runner_state"}


def _config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(Path(schema.__file__).parent / "migrations"))
    return config


def _older_heads() -> dict[str, list[str]]:
    script = ScriptDirectory.from_config(_config())
    previous = sorted(h for h in script.get_heads() if h not in NEW_REVISIONS)
    return {"first": ["0001"], "previous": previous}


OLDER = _older_heads()


def _build(url: str, heads: list[str], schema_name: str | None) -> None:
    options = {}
    if schema_name:
        options["connect_args"] = {"options": f"-csearch_path={schema_name}"}
    engine = sa.create_engine(url, **options)
    with engine.begin() as conn:
        if schema_name:
            conn.execute(sa.text(f'CREATE SCHEMA "{schema_name}"'))
        config = _config()
        config.attributes["connection"] = conn
        for head in heads:
            command.upgrade(config, head)
        now = time.time()
        rows = {
            "runners": [{"id": "local", "kind": "local", "state": "ready", "created_at": now}],
            "sessions": [
                {
                    "id": "ses_old",
                    "state": "active",
                    "main_agent_id": "agt_old",
                    "is_default": True,
                    "created_at": now,
                }
            ],
            "agents": [
                {
                    "id": "agt_old",
                    "session_id": "ses_old",
                    "state": "idle",
                    "gate": "open",
                    "created_at": now,
                }
            ],
            "workspaces": [
                {
                    "id": "ws_old",
                    "agent_id": "agt_old",
                    "runner_id": "local",
                    "head_seq": 1,
                    "created_at": now,
                }
            ],
            "executions": [
                {
                    "id": f"ex_old{i}",
                    "seq": i,
                    "agent_id": "agt_old",
                    "workspace_id": "ws_old",
                    "runner_id": "local",
                    "command": f"echo {i}",
                    "background": False,
                    "state": "completed",
                    "exit_code": 0,
                    "cancel_requested": False,
                    "query_failures": 0,
                    "was_unknown": False,
                    "snapshot_seq": 1,
                    "created_at": now,
                    "started_at": now,
                    "finished_at": now,
                }
                for i in range(3)
            ],
            "notices": [
                {
                    "id": "ntc_old",
                    "agent_id": "agt_old",
                    "kind": "execution",
                    "subject_id": "ex_old0",
                    "summary": "execution ex_old0 completed",
                    "created_at": now,
                }
            ],
        }
        metadata = sa.MetaData()
        metadata.reflect(conn)
        for table, values in rows.items():
            conn.execute(metadata.tables[table].insert(), values)
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, home: Path) -> Iterator[tuple[str, str | None]]:
    if request.param == "sqlite":
        yield f"sqlite:///{home / 'old.db'}", None
    else:
        yield (
            POSTGRES_URL.replace("postgresql://", "postgresql+psycopg://"),
            request.getfixturevalue("pg_schema"),
        )


@pytest.mark.parametrize("older", sorted(OLDER))
async def test_a_database_of_an_older_release_opens_with_its_data(
    older: str, backend: tuple[str, str | None]
) -> None:
    url, schema_name = backend
    _build(url, OLDER[older], schema_name)
    if schema_name is None:
        with sqlite3.connect(url.removeprefix("sqlite:///")) as old:
            assert old.execute("PRAGMA auto_vacuum").fetchone() == (0,)  # as it was made
    store = await Store.open(url, schema_name=schema_name)
    try:
        converted = await store.prepare_incremental_vacuum()
        assert converted == (schema_name is None)
        assert not await store.prepare_incremental_vacuum()  # once only
        rows = await store.list_executions("agt_old", 100)
        assert sorted(r.id for r in rows) == ["ex_old0", "ex_old1", "ex_old2"]
        row = await store.get_execution("ex_old1")
        assert row is not None and row.command == "echo 1" and row.logs_pruned_at is None
        session, agent = await store.default_owner()
        assert (session.id, agent.id) == ("ses_old", "agt_old")  # kept, not made anew
        notices = await store.list_notices("agt_old")
        assert [n.subject_id for n in notices] == ["ex_old0"]
        # the upgraded schema takes this release's writes
        await store.mark_logs_pruned(["ex_old2"])
        again = await store.get_execution("ex_old2")
        assert again is not None and again.logs_pruned_at is not None
        # E9: an old record has no runner state id (it keeps the old reading of NO_TRACE);
        # the new column takes one
        assert row.runner_state is None
        # (written as a statement: the store itself never changes a finished record, E9)
        update = (
            sa.update(schema.executions)
            .where(schema.executions.c.id == "ex_old2")
            .values(runner_state="0123456789abcdef")
        )
        await store.run(lambda conn: conn.execute(update))
        again = await store.get_execution("ex_old2")
        assert again is not None and again.runner_state == "0123456789abcdef"
        versions = await store.all(
            sa.select(sa.column("version_num")).select_from(sa.table("alembic_version"))
        )
        script = ScriptDirectory.from_config(_config())
        assert {v["version_num"] for v in versions} == set(script.get_heads())
    finally:
        await store.close()
    if schema_name is None:
        with sqlite3.connect(url.removeprefix("sqlite:///")) as new:
            assert new.execute("PRAGMA auto_vacuum").fetchone() == (2,)
