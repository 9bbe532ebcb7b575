"""Ports for the host (R5): the control plane checks who asks, then asks the
workspace's runner to forward a loopback port of its host into the workspace's network.

Only the workspace's own agent opens, lists and closes its forwards (``use='write'``, as
for editing its files): a parent or child may read a workspace's files, but a forward
exposes a live server, so it is not theirs to open. The runner keeps the forwards (it
knows when the workspace's last execution ends, and they outlive a control-plane restart),
so no record is kept here.
"""

from __future__ import annotations

from shellyard.contract.ports import PortListQuery, PortView
from shellyard.control.files.access import WorkspaceAccess
from shellyard.errors import InvalidInput
from shellyard.runner.protocol import Runner
from shellyard.store.workspaces import Workspace


class PortService:
    def __init__(self, access: WorkspaceAccess) -> None:
        self.access = access

    async def _own(
        self, workspace_id: str | None, runner_id: str | None, agent_id: str | None
    ) -> tuple[Workspace, Runner]:
        agent = await self.access.agent(agent_id)
        row, relation, runner = await self.access.workspace(agent, workspace_id, runner_id)
        if relation != "own":
            raise InvalidInput(
                f"workspace {row.id} belongs to your {relation} agent: only its own agent "
                f"forwards its ports",
                workspace_id=row.id,
            )
        return row, runner

    async def open(
        self,
        port: int,
        host_port: int = 0,
        *,
        workspace_id: str | None = None,
        runner_id: str | None = None,
        agent_id: str | None = None,
    ) -> PortView:
        row, runner = await self._own(workspace_id, runner_id, agent_id)
        view = await runner.open_port(row.id, port, host_port)
        return view.model_copy(update={"runner_id": row.runner_id})

    async def list(self, request: PortListQuery, agent_id: str | None = None) -> list[PortView]:
        row, runner = await self._own(request.workspace_id, request.runner_id, agent_id)
        views = await runner.list_ports(row.id)
        return [v.model_copy(update={"runner_id": row.runner_id}) for v in views]

    async def close(
        self,
        port: int,
        *,
        workspace_id: str | None = None,
        runner_id: str | None = None,
        agent_id: str | None = None,
    ) -> PortView:
        row, runner = await self._own(workspace_id, runner_id, agent_id)
        view = await runner.close_port(row.id, port)
        return view.model_copy(update={"runner_id": row.runner_id})


__all__ = ["PortService"]
