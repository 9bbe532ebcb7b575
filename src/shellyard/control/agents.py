"""The one agent resolver of the control plane: an explicit agent id, or the default session's
main agent when a door passes none (the single-user CLI, an unauthenticated local host).

Every service that acts on behalf of an agent asks this object, so "which agent is None" and
"what a missing agent looks like" are decided in one place. The default agent's id is cached
for the life of the process: the default session and its main agent are created once and
never replaced.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shellyard.errors import NotFound
from shellyard.store import Store

Row = Mapping[str, Any]


class AgentResolver:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._default: str | None = None

    async def default_id(self) -> str:
        """The default session's main agent (created with its session on first use)."""
        if self._default is None:
            self._default = str((await self.store.default_owner())[1]["id"])
        return self._default

    async def row(self, agent_id: str | None) -> Row:
        """The agent's record (the default agent's when ``agent_id`` is None), or NotFound."""
        resolved = agent_id if agent_id is not None else await self.default_id()
        row = await self.store.get_agent(resolved)
        if row is None:
            raise NotFound(
                f"no agent {resolved!r}; 'shellyard session show ID' lists a session's agents"
            )
        return row

    async def id(self, agent_id: str | None) -> str:
        """The agent's id after checking it exists (the default agent's when None)."""
        if agent_id is None:
            return await self.default_id()
        return str((await self.row(agent_id))["id"])
