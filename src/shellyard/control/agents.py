"""The one agent resolver of the control plane: an explicit agent id, or the default session's
main agent when a door passes none (the single-user CLI, an unauthenticated local host).

Every service that acts on behalf of an agent asks this object, so "which agent is None" and
"what a missing agent looks like" are decided in one place. The default agent's id is cached
for the life of the process: the default session and its main agent are created once and
never replaced. So are the ids of agents seen to exist (bounded): an agent is never deleted
(retention removes its executions, notices and timers, never the agent), so ``id`` asks the store
once per agent instead of at every call (docs/benchmarks.md, section 20: a read per execution).
"""

from __future__ import annotations

from shellyard.errors import NotFound
from shellyard.store import Store
from shellyard.store.owners import Agent

#: Agent ids remembered as existing (and their sessions); the oldest is forgotten beyond this.
AGENTS_KEPT = 4096

#: agent id → its session id. An agent never moves to another session (store/sessions.py
#: changes only its state and gate) and ids are never reused, so an entry cannot go stale.
_sessions: dict[str, str] = {}


async def session_of(store: Store, agent_id: str) -> str | None:
    """The session of an existing agent (None: no such agent), read from the store once per
    agent: the token checks and the state log ask at every request and state change
    (docs/benchmarks.md, section 20)."""
    known = _sessions.get(agent_id)
    if known is not None:
        return known
    agent = await store.get_agent(agent_id)
    if agent is None:  # not remembered: it may be made later
        return None
    if len(_sessions) >= AGENTS_KEPT:
        del _sessions[next(iter(_sessions))]
    _sessions[agent_id] = session = agent.session_id
    return session


class AgentResolver:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._default: str | None = None
        self._existing: dict[str, None] = {}  # insertion-ordered: the oldest goes first

    async def default_id(self) -> str:
        """The default session's main agent (created with its session on first use)."""
        if self._default is None:
            self._default = (await self.store.default_owner())[1].id
        return self._default

    async def record(self, agent_id: str | None) -> Agent:
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
        if agent_id in self._existing:
            return agent_id
        found = (await self.record(agent_id)).id
        if len(self._existing) >= AGENTS_KEPT:
            del self._existing[next(iter(self._existing))]
        self._existing[found] = None
        return found
