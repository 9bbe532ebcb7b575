"""Which workspaces an agent may use (T1) and the workspace writer for file operations (W1).

An agent may read and copy between its own workspaces on every runner, its parent's and its
children's (T1); it edits files only in its own. Any other workspace is reported exactly like
a missing one, so nothing about another session leaks.

File operations and transfers take the same writer as executions (``Store.take_writer``): a
second writer is refused at once with the holder named, or waits when the caller asks to queue.
When one of them releases the writer, executions queued meanwhile are dispatched.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Literal

from shellyard.contract.files import Relation, WorkspaceView
from shellyard.control.executions.service import ExecutionService
from shellyard.control.runners import LOCAL_RUNNER_ID, RunnerRegistry
from shellyard.errors import InvalidInput, NotFound, WorkspaceBusy
from shellyard.runner.protocol import Runner
from shellyard.store import Store
from shellyard.store.owners import Agent
from shellyard.store.workspaces import Workspace

Use = Literal["read", "write", "transfer"]
#: How often a queued file operation looks at the writer again (besides being woken).
_POLL_S = 0.1


class WorkspaceAccess:
    def __init__(
        self,
        store: Store,
        runners: RunnerRegistry,
        executions: ExecutionService,
    ) -> None:
        self.store = store
        self.runners = runners
        self.executions = executions
        self._ensured: set[str] = set()
        self._released = asyncio.Condition()

    # ------------------------------------------------------------------ agents

    async def agent(self, agent_id: str | None) -> Agent:
        return await self.executions.agents.record(agent_id)

    # ------------------------------------------------------------------ workspaces

    async def relation(self, agent: Agent, workspace: Workspace) -> Relation | None:
        owner = workspace.agent_id
        if owner == agent.id:
            return "own"
        if agent.parent_id is not None and owner == agent.parent_id:
            return "parent"
        owner_row = await self.store.get_agent(owner)
        if owner_row is not None and owner_row.parent_id == agent.id:
            return "child"
        return None

    async def own(self, agent: Agent, runner_id: str | None) -> Workspace:
        """The agent's workspace on ``runner_id`` (local by default), created on first use."""
        runner_id = runner_id or LOCAL_RUNNER_ID
        self.runners.get(runner_id)  # an unknown runner is a clear error
        row, _created = await self.store.workspace_for(agent.id, runner_id)
        await self.ensure(row)
        return row

    async def ensure(self, workspace: Workspace) -> None:
        """Make sure the runner has the workspace (once per process; idempotent)."""
        workspace_id = workspace.id
        if workspace_id not in self._ensured:
            await self.runners.get(workspace.runner_id).ensure_workspace(workspace_id)
            self._ensured.add(workspace_id)

    async def workspace(
        self,
        agent: Agent,
        workspace_id: str | None,
        runner_id: str | None = None,
        use: Use = "read",
    ) -> tuple[Workspace, Relation, Runner]:
        """Resolve the workspace a caller names (its own on ``runner_id`` when it names
        none), check the agent may ``use`` it, and return it with its runner."""
        if workspace_id is None:
            row = await self.own(agent, runner_id)
            return row, "own", self.runners.get(row.runner_id)
        if not isinstance(workspace_id, str) or not workspace_id:
            raise InvalidInput("workspace_id must be a workspace id such as 'ws_0123abcd…'")
        found = await self.store.get_workspace(workspace_id)
        relation = None if found is None else await self.relation(agent, found)
        if found is None or relation is None:
            raise NotFound(
                f"no workspace {workspace_id!r} that you can use; list yours (and your "
                f"parent's and children's) with workspace_transfer action 'discover'",
                workspace_id=workspace_id,
            )
        row = found
        if runner_id is not None and runner_id != row.runner_id:
            raise InvalidInput(
                f"workspace {workspace_id} is on runner {row.runner_id!r}, not {runner_id!r}; "
                f"give one of workspace_id or runner_id"
            )
        if use == "write" and relation != "own":
            raise InvalidInput(
                f"workspace {workspace_id} belongs to your {relation} agent: you edit files only "
                f"in your own workspaces; copy into it with a transfer instead",
                workspace_id=workspace_id,
            )
        await self.ensure(row)
        return row, relation, self.runners.get(row.runner_id)

    async def discover(self, agent: Agent) -> list[WorkspaceView]:
        """T1: the agent's own workspaces on every registered runner (made on first use),
        its parent's and its children's existing workspaces."""
        views: list[WorkspaceView] = []
        for runner_id in self.runners.ids():
            row, _created = await self.store.workspace_for(agent.id, runner_id)
            views.append(_view(row, "own"))
        if agent.parent_id is not None:
            for row in await self.store.workspaces_of([agent.parent_id]):
                views.append(_view(row, "parent"))
        children = [c.id for c in await self.store.child_agents(agent.id)]
        if children:
            for row in await self.store.workspaces_of(children):
                views.append(_view(row, "child"))
        return views

    # ------------------------------------------------------------------ the writer (W1)

    async def take_writer(
        self,
        workspace_id: str,
        kind: str,
        holder_id: str,
        *,
        queue: bool,
        timeout_s: float | None = None,
        cancelled: asyncio.Event | None = None,
    ) -> bool:
        """Take the workspace's writer for ``holder_id``. Refused at once (``WorkspaceBusy``,
        naming the holder) unless ``queue``; then wait until it is free, ``timeout_s`` runs out
        (refused) or ``cancelled`` is set (returns False)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            if await self.store.take_writer(workspace_id, kind, holder_id):
                return True
            if cancelled is not None and cancelled.is_set():
                return False
            holder_kind, holder = await self.store.writer_of(workspace_id)
            if holder is None:
                continue  # released in between
            if holder == holder_id:
                return True  # ours already (a resumed transfer)
            who = f"{holder_kind} {holder}" if holder_kind else holder
            if not queue:
                raise WorkspaceBusy(
                    f"workspace {workspace_id} is busy: {who} holds its writer. Wait for it to "
                    f"end, pass queue: true to wait in line, or use another workspace",
                    holder=holder,
                )
            if deadline is not None and time.monotonic() >= deadline:
                raise WorkspaceBusy(
                    f"workspace {workspace_id} is still busy after waiting {timeout_s:g} s: "
                    f"{who} holds its writer; try again later",
                    holder=holder,
                )
            wait = _POLL_S if deadline is None else min(_POLL_S, deadline - time.monotonic())
            async with self._released:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._released.wait(), max(0.0, wait))

    async def release_writer(self, workspace_id: str, holder_id: str) -> None:
        await self.store.release_writer(workspace_id, holder_id)
        await self.writer_released(workspace_id)

    async def writer_released(self, workspace_id: str) -> None:
        """Wake queued file operations, and dispatch executions queued on the workspace."""
        async with self._released:
            self._released.notify_all()
        await self.executions.writer_released(workspace_id)


def _view(row: Workspace, relation: Relation) -> WorkspaceView:
    writer = None
    if row.writer_id is not None:
        writer = f"{row.writer_kind} {row.writer_id}" if row.writer_kind else None
    return WorkspaceView(
        workspace_id=row.id,
        runner_id=row.runner_id,
        agent_id=row.agent_id,
        relation=relation,
        head_seq=row.head_seq,
        writer=writer,
    )


__all__ = ["WorkspaceAccess"]
