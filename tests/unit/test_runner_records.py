"""The runner registry's reads of the runner records (control/runners.py), on SQLite and
PostgreSQL: ``removed`` reads the one row it asks about (``Store.get_runner``), not every
runner's; an environment change's start (control/environments.py ``_on_runner``) learns whether
its runner was removed and reconnects the runners another replica added from one read
(``registered``), where it read them twice."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

from shellyard.control.runners import RunnerRegistry
from shellyard.store import Store


@contextmanager
def runner_reads() -> Iterator[list[str]]:
    """The SELECTs of the runners table sent by any engine of this process meanwhile."""
    reads: list[str] = []

    def statement(_conn: Any, _cursor: Any, sql: str, *_rest: Any) -> None:
        flat = " ".join(sql.split())
        if flat.upper().startswith("SELECT") and "runners" in flat:
            reads.append(flat)

    event.listen(Engine, "before_cursor_execute", statement)
    try:
        yield reads
    finally:
        event.remove(Engine, "before_cursor_execute", statement)


async def _records(store: Store) -> RunnerRegistry:
    await store.upsert_runner("local", "local", None, None)
    await store.upsert_runner("gone", "direct", "https://gone:7070", "key")
    await store.upsert_runner("gone", "removed", None, None)
    # added on another replica: recorded, not yet connected here
    await store.upsert_runner("far", "direct", "https://far:7070", "key")
    return RunnerRegistry(store, on_change=lambda: None)


async def test_removed_reads_one_runner_row(store: Store) -> None:
    registry = await _records(store)
    try:
        for runner_id, removed in (("gone", True), ("never", True), ("far", False)):
            with runner_reads() as reads:
                assert await registry.removed(runner_id) is removed, runner_id
            assert len(reads) == 1 and " WHERE " in reads[0], reads
        with runner_reads() as reads:
            assert not await registry.removed("local")  # never removed: nothing read
        assert reads == []
    finally:
        await registry.aclose()


async def test_a_change_start_reads_the_records_once(store: Store) -> None:
    registry = await _records(store)
    try:
        with runner_reads() as reads:
            assert not await registry.registered("gone")
        assert len(reads) == 1, reads
        assert registry.ids() == []  # a removed runner's change connects nothing
        with runner_reads() as reads:
            assert await registry.registered("far")
        assert len(reads) == 1, reads
        assert registry.ids() == ["far"]  # reached here too, from the same read
        with runner_reads() as reads:
            assert await registry.registered("local")
        assert len(reads) == 1, reads
    finally:
        await registry.aclose()
