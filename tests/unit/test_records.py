"""The one ``from_row`` (store/records.py): each annotation's conversion, NULLs and defaults,
and the records read back from both databases with the types their fields declare."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import pytest
import sqlalchemy as sa

from shellyard.store import Store
from shellyard.store.records import field_names, from_row, maybe
from shellyard.store.schema import transfers


@dataclass(frozen=True, slots=True, kw_only=True)
class _Sample:
    name: str
    count: int
    at: float
    flag: bool
    kind: Literal["a", "b"]
    note: str | None
    options: dict[str, Any]
    paths: list[str]
    maybe_options: dict[str, Any] | None
    extra: Any
    added: int = 7


_ROW: dict[str, Any] = {
    "name": "n",
    "count": 3,
    "at": 2,
    "flag": 1,  # SQLite's 0/1 from a text statement
    "kind": "a",
    "note": None,
    "options": '{"k": 1}',  # a Text column holding JSON
    "paths": ["x"],  # a JSON column, decoded by SQLAlchemy
    "maybe_options": None,
    "extra": (1, 2),
}


def test_each_annotation_converts() -> None:
    sample = from_row(_Sample, _ROW)
    assert sample == _Sample(
        name="n",
        count=3,
        at=2.0,
        flag=True,
        kind="a",
        note=None,
        options={"k": 1},
        paths=["x"],
        maybe_options=None,
        extra=(1, 2),
    )
    assert type(sample.at) is float and type(sample.flag) is bool


def test_null_json_is_empty_and_absent_takes_the_default() -> None:
    sample = from_row(_Sample, {**_ROW, "options": None, "paths": None, "added": None})
    assert sample.options == {} and sample.paths == [] and sample.added == 7
    assert from_row(_Sample, {**_ROW, "added": 9}).added == 9


def test_null_in_a_field_that_is_not_optional_is_refused() -> None:
    with pytest.raises(TypeError, match=r"_Sample\.count"):
        from_row(_Sample, {**_ROW, "count": None})


@dataclass(frozen=True)
class _Plain:
    """No slots: built by calling the class (its ``__init__``), not through slots."""

    name: str
    count: int = 1


def test_records_stay_frozen_and_a_class_without_slots_is_called() -> None:
    sample = from_row(_Sample, _ROW)
    with pytest.raises(dataclasses.FrozenInstanceError):
        sample.name = "other"  # type: ignore[misc]
    assert from_row(_Plain, {"name": 5}) == _Plain(name="5")
    assert from_row(_Plain, {"name": "n", "count": "2"}).count == 2


def test_maybe_and_field_names() -> None:
    assert maybe(_Sample, None) is None
    assert field_names(_Sample)[:2] == ("name", "count")


async def test_transfer_record_types_on_both_databases(store: Store) -> None:
    """What each database returns (JSON decoded, Boolean as bool, Float as float) reaches
    the record's fields with their declared types."""
    from shellyard.store.files import Transfer

    _session, agent = await store.default_owner()
    await store.upsert_runner("local", "local", None, None)
    workspace, _ = await store.workspace_for(str(agent.id), "local")
    created = await store.create_transfer(
        {
            "id": "tr_1",
            "agent_id": agent.id,
            "source_workspace_id": workspace.id,
            "target_workspace_id": workspace.id,
            "target_folder": "in",
            "paths": ["a", "b"],
            "options": {"queue": True},
            "files_total": 0,
            "bytes_total": 0,
            "state": "queued",
            "created_at": 1.5,
        },
        [],
    )
    row = await store.one(sa.select(transfers).where(transfers.c.id == "tr_1"))
    assert row is not None
    read = from_row(Transfer, row)
    assert read == created
    assert read.paths == ["a", "b"] and read.options == {"queue": True}
    assert read.cancel_requested is False and type(read.created_at) is float


async def test_timer_and_runner_records_on_both_databases(store: Store) -> None:
    """A JSON column (``spec``) and a Boolean (``late``) of a timer, read by the store and the
    panel's page alike; a runner's row as the registry reads it."""
    from shellyard.store.timers import Timer

    runner = await store.upsert_runner("local", "local", None, None)
    assert (runner.id, runner.kind, runner.address, runner.state) == (
        "local",
        "local",
        None,
        "active",
    )
    assert [r.id for r in await store.list_runners()] == ["local"]
    _session, agent = await store.default_owner()
    created = await store.create_timer(
        {
            "id": "tmr_1",
            "agent_id": agent.id,
            "session_id": agent.session_id,
            "text": "t",
            "spec": {"after_ms": 5},
            "fire_at": 10.0,
            "state": "pending",
            "late": False,
            "created_at": 1.0,
        }
    )
    assert isinstance(created, Timer) and created.spec == {"after_ms": 5}
    assert created.late is False and created.execution_id is None
    (paged,) = await store.timers_page([str(agent.id)], 10)
    assert paged == created == await store.get_timer("tmr_1")


async def test_a_webhook_record_and_its_view_keep_the_secret_out(store: Store) -> None:
    """D3 over a shared field list must not carry a field the view shows only once: the
    webhook's secret is in its record, never in a listed view."""
    from shellyard.control.notify.wakes import _webhook_view

    added = await store.add_webhook(
        {"id": "whk_1", "session_id": None, "url": "https://example.org/h", "secret": "s" * 32,
         "active": True, "created_at": 2.0}
    )  # fmt: skip
    (listed,) = await store.list_webhooks()
    assert listed == added and listed.active is True and listed.secret == "s" * 32
    view = _webhook_view(listed)
    assert view.webhook_id == "whk_1" and view.url == "https://example.org/h"
    assert view.secret is None and view.session_id is None
    removed = await store.deactivate_webhook("whk_1")
    assert removed is not None and removed.active is False
    assert await store.list_webhooks() == []
