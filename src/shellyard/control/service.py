"""The ControlPlane: one object that owns the store, the runners and the services on them.
Interfaces (REST, MCP, CLI, SDK) call it; it never does I/O details itself."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from shellyard.config import Settings
from shellyard.control.executions import ExecutionService
from shellyard.control.runners import RunnerRegistry
from shellyard.runner.local import LocalRunner
from shellyard.store import Store


class ControlPlane:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.store: Store | None = None
        self._runners: RunnerRegistry | None = None
        self._executions: ExecutionService | None = None

    @property
    def executions(self) -> ExecutionService:
        assert self._executions is not None, "ControlPlane.start() was not called"
        return self._executions

    @property
    def runners(self) -> RunnerRegistry:
        assert self._runners is not None, "ControlPlane.start() was not called"
        return self._runners

    async def start(self) -> None:
        settings = self.settings
        settings.home.mkdir(parents=True, exist_ok=True)
        self.store = await Store.open(
            settings.effective_database_url, schema_name=settings.database_schema
        )
        self._runners = RunnerRegistry(self.store)
        local = LocalRunner(
            settings.local_runner_root, settings.local_policy, hidden=[settings.home]
        )
        await local.startup()
        await self._runners.add_local(local)
        await self._runners.load_registered()
        await self.store.default_owner()
        self._executions = ExecutionService(self.store, self._runners)
        await self._executions.startup()

    async def aclose(self) -> None:
        if self._executions is not None:
            await self._executions.aclose()
        if self._runners is not None:
            await self._runners.aclose()
        if self.store is not None:
            await self.store.close()

    @classmethod
    @asynccontextmanager
    async def running(cls, settings: Settings) -> AsyncIterator[ControlPlane]:
        plane = cls(settings)
        await plane.start()
        try:
            yield plane
        finally:
            await plane.aclose()
