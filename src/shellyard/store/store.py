"""The Store: every read and write of the control plane's records, one class made of the
records of each concept (each in its own module, over ``db.Database``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from shellyard.store.executions import ExecutionRecords
from shellyard.store.leases import LeaseRecords
from shellyard.store.notices import NoticeRecords
from shellyard.store.ops import OpsRecords
from shellyard.store.owners import OwnerRecords
from shellyard.store.sessions import SessionRecords
from shellyard.store.timers import TimerRecords
from shellyard.store.wakes import WakeRecords
from shellyard.store.workspaces import WorkspaceRecords


class Store(
    OwnerRecords,
    WorkspaceRecords,
    ExecutionRecords,
    NoticeRecords,
    SessionRecords,
    WakeRecords,
    TimerRecords,
    LeaseRecords,
    OpsRecords,
):
    """The control plane's records; ``Store.open(url)`` connects and migrates."""

    def __init__(
        self,
        *,
        sync_engine: Engine | None = None,
        async_engine: AsyncEngine | None = None,
        schema_name: str | None = None,
    ) -> None:
        super().__init__(
            sync_engine=sync_engine, async_engine=async_engine, schema_name=schema_name
        )
        self.notice_listeners: list[Callable[[str], Awaitable[Any]]] = []
