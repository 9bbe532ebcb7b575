"""An owner's reads of its executions (E4, E6, E13): the owner check every read starts with,
the log pages, the list, and an interactive execution's input and screen. A mixin of the
execution service (service.py), which holds the store, the runners and the agents."""

from __future__ import annotations

from shellyard.contract.executions import (
    ExecutionList,
    ExecutionLogsQuery,
    ExecutionView,
    LogsResult,
)
from shellyard.contract.interactive import InputResult, ScreenView
from shellyard.control.agents import AgentResolver
from shellyard.control.executions import interactive
from shellyard.control.executions.logs import check_stream, read_page
from shellyard.control.executions.view import execution_view
from shellyard.control.runners import RunnerRegistry
from shellyard.errors import NotFound
from shellyard.runner.protocol import Runner
from shellyard.store import Store
from shellyard.store.executions import Execution


class OwnedReads:
    store: Store
    runners: RunnerRegistry
    agents: AgentResolver

    def _runner(self, row: Execution) -> Runner:
        return self.runners.get(row.runner_id)

    async def logs(
        self, execution_id: str, request: ExecutionLogsQuery, agent_id: str | None = None
    ) -> LogsResult:
        """A page of a log; ``tail``: bytes, ``tail_lines``: lines (docs/cli.md "Output")."""
        check_stream(request.stream)
        row = await self._owned(execution_id, agent_id)
        return await read_page(self.store, self._runner(row), row, request)

    # E13: input, screen and size of an interactive execution (control/executions/interactive.py)
    async def send_input(
        self, execution_id: str, body: interactive.InputBody, agent_id: str | None
    ) -> InputResult:
        """``body`` is read after the owner check (E4: another's execution is just missing)."""
        row = await self._owned(execution_id, agent_id)
        return await interactive.send_input(self._runner(row), row, body)

    async def screen(
        self, execution_id: str, agent_id: str | None, size: interactive.SizeBody | None = None
    ) -> ScreenView:
        """The terminal's screen now; with ``size``, resized first."""
        row = await self._owned(execution_id, agent_id)
        return await interactive.screen(self._runner(row), row, size)

    async def list(
        self, request: ExecutionList, agent_id: str | None = None
    ) -> list[ExecutionView]:
        owner = await self.agents.id(agent_id)
        rows = await self.store.list_executions(owner, request.limit)
        return [execution_view(r) for r in rows]

    async def _owned(self, execution_id: str, agent_id: str | None) -> Execution:
        row = await self.store.get_execution(execution_id)
        owner = await self.agents.id(agent_id)
        # Another agent's execution is reported exactly like a missing one: no data leaks.
        if row is None or row.agent_id != owner:
            raise NotFound(
                f"no execution {execution_id!r}; list yours with 'shellyard status' or check the id"
            )
        return row
