"""Sessions and agents (N8–N11): create a session with its main agent and child agents under
any agent; the host's turn protocol (``turn_begin`` / ``turn_end``); stop, resume, archive and
restore, each a recorded event.

Two gates decide whether a notice may wake an agent (N2): the agent's own (closed while the
agent is stopped) and its session's (closed while the session is stopped or archived). They are
separate so that a child stopped on its own stays stopped when its session resumes (N10).
"""

from __future__ import annotations

from shellyard.contract.sessions import (
    AgentView,
    ResumeResult,
    SessionEventView,
    SessionState,
    SessionView,
)
from shellyard.control.agents import AgentResolver
from shellyard.control.notify.inbox import summarize, unread_summary
from shellyard.control.notify.wakes import WakeService, wake_payload
from shellyard.errors import Conflict, NotFound
from shellyard.store import Store
from shellyard.store.owners import Agent, Session
from shellyard.store.records import field_names, values_of
from shellyard.store.sessions import SessionEvent


class SessionService:
    def __init__(self, store: Store, wakes: WakeService, agents: AgentResolver) -> None:
        self.store = store
        self.wakes = wakes
        self.agents = agents

    # ------------------------------------------------------------------ lookups

    async def agent_record(self, agent_id: str | None) -> Agent:
        """The agent (the default session's main agent when None), or NotFound."""
        return await self.agents.record(agent_id)

    async def session_record(self, session_id: str) -> Session:
        row = await self.store.get_session(session_id)
        if row is None:
            raise NotFound(f"no session {session_id!r}; list them with 'shellyard session list'")
        return row

    async def get(self, session_id: str) -> SessionView:
        row = await self.session_record(session_id)
        agents = await self.store.list_agents(session_id)
        return session_view(row, agents)

    async def list_sessions(self) -> list[SessionView]:
        return [session_view(row, []) for row in await self.store.list_sessions()]

    async def get_agent(self, agent_id: str | None) -> AgentView:
        row = await self.agent_record(agent_id)
        return agent_view(row, await self.session_record(row.session_id))

    async def events(self, session_id: str) -> list[SessionEventView]:
        await self.session_record(session_id)
        return [
            SessionEventView.model_validate(values_of(e, _EVENT_VIEW_FIELDS))
            for e in await self.store.session_events(session_id)
        ]

    # ------------------------------------------------------------------ creating

    async def create(self) -> SessionView:
        """A new session with its main agent (idle, gate open)."""
        session, agent = await self.store.create_session()
        return session_view(session, [agent])

    async def create_child(self, parent_id: str) -> AgentView:
        """A child agent under ``parent_id``; it gets its own workspace root on first use."""
        parent = await self.agent_record(parent_id)
        session = await self.session_record(parent.session_id)
        if session.state == SessionState.archived:
            raise Conflict(f"session {session.id} is archived; restore it before adding agents")
        return agent_view(await self.store.create_child(parent), session)

    # ------------------------------------------------------------------ turns

    async def turn_begin(self, agent_id: str) -> AgentView:
        """The host starts a turn of this agent: it is busy and no wake interrupts it."""
        agent = await self.agent_record(agent_id)
        session = await self.session_record(agent.session_id)
        if session.state != SessionState.active:
            raise Conflict(
                f"session {session.id} is {session.state}; a user request resumes a "
                f"stopped session (POST /v1/sessions/{session.id}/requests or 'shellyard "
                "session request'), an archived one must be restored first"
            )
        if agent.gate != "open":
            raise Conflict(f"agent {agent_id} is stopped; resume it first (shellyard agent resume)")
        row = await self.store.change_agent(agent_id, {"state": "busy"})
        return agent_view(row, session)

    async def turn_end(self, agent_id: str) -> AgentView:
        """The turn is over: the agent is idle, and unread notices that arrived meanwhile (and
        no wake delivered) wake it now (N2)."""
        await self.agent_record(agent_id)
        row = await self.store.change_agent(agent_id, {"state": "idle"})
        await self.wakes.notify(agent_id, "turn_end")
        return await self._agent_after(row)

    # ------------------------------------------------------------------ agents

    async def stop_agent(self, agent_id: str) -> AgentView:
        """N8: close the agent's wake gate; its results and notices stay recorded."""
        agent = await self.agent_record(agent_id)
        session = await self.session_record(agent.session_id)
        if agent.gate == "closed":
            return agent_view(agent, session)
        row = await self.store.change_agent(
            agent_id, {"gate": "closed", "state": "idle"}, "agent_stopped"
        )
        return agent_view(row, session)

    async def resume_agent(self, agent_id: str) -> AgentView:
        """N10: reopen a stopped agent's gate, allowed only while its session is active; its
        waiting notices wake it now."""
        agent = await self.agent_record(agent_id)
        session = await self.session_record(agent.session_id)
        if session.state != SessionState.active:
            raise Conflict(
                f"agent {agent_id}'s session {session.id} is {session.state}; resume the "
                "session first (a user request, or 'shellyard session resume'), then the agent"
            )
        if agent.gate == "open":
            return agent_view(agent, session)
        row = await self.store.change_agent(agent_id, {"gate": "open"}, "agent_resumed")
        await self.wakes.notify(agent_id, "resume")
        return await self._agent_after(row)

    # ------------------------------------------------------------------ sessions

    async def stop(self, session_id: str) -> SessionView:
        """N8: close the session gate and cancel its pending timers."""
        session = await self.session_record(session_id)
        if session.state == SessionState.archived:
            raise Conflict(f"session {session_id} is archived; there is nothing to stop")
        if session.state == SessionState.active:
            await self.store.change_session(
                session_id, SessionState.stopped, "session_stopped", "the session was stopped"
            )
        return await self.get(session_id)

    async def archive(self, session_id: str) -> SessionView:
        """N8: like stop, and the session must be restored before it can resume."""
        session = await self.session_record(session_id)
        if session.state != SessionState.archived:
            await self.store.change_session(
                session_id, SessionState.archived, "session_archived", "the session was archived"
            )
        return await self.get(session_id)

    async def restore(self, session_id: str) -> SessionView:
        """N11: archived → stopped. Resumes nothing; cancelled timers stay cancelled."""
        session = await self.session_record(session_id)
        if session.state != SessionState.archived:
            raise Conflict(f"session {session_id} is {session.state}, not archived")
        await self.store.change_session(session_id, SessionState.stopped, "session_restored", None)
        return await self.get(session_id)

    async def resume(self, session_id: str) -> ResumeResult:
        """Reopen a stopped session's gate. Its agents' waiting notices wake them (children
        stopped on their own stay stopped, N10); the result summarizes the main agent's
        unread notices."""
        session = await self.session_record(session_id)
        if session.state == SessionState.archived:
            raise Conflict(
                f"session {session_id} is archived; restore it first ('shellyard session "
                f"restore {session_id}')"
            )
        resumed = session.state == SessionState.stopped
        if resumed:
            await self.store.change_session(
                session_id, SessionState.active, "session_resumed", None
            )
            await self.wakes.kick_session(session_id, "resume")
        summary = await unread_summary(self.store, session.main_agent_id)
        return ResumeResult(session=await self.get(session_id), resumed=resumed, summary=summary)

    async def user_request(self, session_id: str) -> ResumeResult:
        """N9: a new user request. A stopped session resumes; the main agent's turn begins
        (its gate reopens); the result carries the summary of its unread notices, which then
        wake nobody. Nothing is replayed. Children's waiting notices wake the children."""
        await self.session_record(session_id)
        session, resumed, unread = await self.store.user_request(session_id, wake_payload)
        if resumed:
            await self.wakes.kick_session(session_id, "resume")
        return ResumeResult(
            session=await self.get(session_id),
            resumed=resumed,
            summary=summarize(session.main_agent_id, unread),
        )

    async def _agent_after(self, row: Agent) -> AgentView:
        """The agent as it is now (a wake may just have made it busy)."""
        fresh = await self.store.get_agent(row.id)
        assert fresh is not None
        return agent_view(fresh, await self.session_record(fresh.session_id))


#: D3: the fields a session event's record and its view share (all of them), listed once.
_EVENT_VIEW_FIELDS = field_names(SessionEvent, SessionEventView.model_fields)


def agent_view(row: Agent, session: Session) -> AgentView:
    return AgentView(
        agent_id=row.id,
        session_id=row.session_id,
        parent_id=row.parent_id,
        is_main=row.id == session.main_agent_id,
        state=row.state,
        gate=row.gate,
        created_at=row.created_at,
    )


def session_view(row: Session, agents: list[Agent]) -> SessionView:
    return SessionView(
        session_id=row.id,
        state=SessionState(row.state),
        main_agent_id=row.main_agent_id,
        is_default=row.is_default,
        created_at=row.created_at,
        agents=[agent_view(a, row) for a in agents],
    )
