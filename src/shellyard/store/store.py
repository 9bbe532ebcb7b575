"""The Store: every read and write of the control plane's records, one class made of the
records of each concept (each a mixin in its own module, over ``db.Database``;
docs/architecture.md "Records at the store boundary")."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from shellyard.store.environments import EnvironmentRecords
from shellyard.store.executions import ExecutionRecords
from shellyard.store.files import FileRecords
from shellyard.store.leases import LeaseRecords
from shellyard.store.notices import NoticeRecords
from shellyard.store.ops import OpsRecords
from shellyard.store.owners import OwnerRecords
from shellyard.store.panel import PanelRecords
from shellyard.store.retention import RetentionRecords
from shellyard.store.sessions import SessionRecords
from shellyard.store.timers import TimerRecords
from shellyard.store.tokens import TokenRecords
from shellyard.store.wakes import WakeRecords


class Store(
    OwnerRecords,
    FileRecords,  # over WorkspaceRecords: a file operation reads its workspace's writer
    ExecutionRecords,
    NoticeRecords,
    SessionRecords,
    WakeRecords,
    TimerRecords,
    LeaseRecords,
    OpsRecords,
    EnvironmentRecords,
    TokenRecords,
    RetentionRecords,
    PanelRecords,
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
        self.revocations = 0
