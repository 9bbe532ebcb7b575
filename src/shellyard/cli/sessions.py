"""CLI verbs of sessions, agents, timers, webhooks and the inbox: ``shellyard session …``,
``shellyard agent …``, ``shellyard timer …``, ``shellyard webhook …``, ``shellyard inbox``. Each
takes ``--json``. ``cli/app.py`` calls ``register``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from shellyard.cli.common import HomeOption, JsonOption, err, out, run_as
from shellyard.cli.common import show as _show

session_app = typer.Typer(
    help="Sessions: create, stop, archive, restore, resume, user requests.", no_args_is_help=True
)
agent_app = typer.Typer(
    help="Agents: child agents, the host's turn protocol, stop and resume.", no_args_is_help=True
)

if TYPE_CHECKING:
    from shellyard.contract.sessions import ResumeResult
timer_app = typer.Typer(help="One-time reminders.", no_args_is_help=True)
webhook_app = typer.Typer(help="Webhooks that receive wakes.", no_args_is_help=True)

AgentOption = Annotated[
    str | None,
    typer.Option(
        "--agent",
        envvar="SHELLYARD_AGENT",
        help="Act for this agent (default: the default session's main agent).",
    ),
]


def register(app: typer.Typer) -> None:
    app.add_typer(session_app, name="session")
    app.add_typer(agent_app, name="agent")
    app.add_typer(timer_app, name="timer")
    app.add_typer(webhook_app, name="webhook")
    app.command("inbox")(inbox)


SESSION_COLUMNS = ("session_id", "state", "main_agent_id", "is_default")
AGENT_COLUMNS = ("agent_id", "session_id", "parent_id", "is_main", "state", "gate")
TIMER_COLUMNS = ("timer_id", "state", "fire_at_utc", "late", "text", "execution_id")
NOTICE_COLUMNS = ("notice_id", "kind", "summary", "read_at", "wake_id")


def _show_resume(result: ResumeResult, as_json: bool) -> None:
    if as_json:
        out.print_json(result.model_dump_json())
        return
    verb = "resumed" if result.resumed else "is active"
    out.print(f"session {result.session.session_id} {verb}", highlight=False)
    out.print(result.summary.text, highlight=False)


# ---------------------------------------------------------------------- session


@session_app.command("create")
def session_create(home: HomeOption = None, as_json: JsonOption = False) -> None:
    """Create a session with its main agent."""
    _show(run_as(home, None, lambda c: c.create_session()), as_json, SESSION_COLUMNS)


@session_app.command("list")
def session_list(home: HomeOption = None, as_json: JsonOption = False) -> None:
    """List the sessions."""
    _show(run_as(home, None, lambda c: c.sessions()), as_json, SESSION_COLUMNS)


@session_app.command("show")
def session_show(session_id: str, home: HomeOption = None, as_json: JsonOption = False) -> None:
    """A session and its agents."""
    session = run_as(home, None, lambda c: c.session(session_id))
    if as_json:
        out.print_json(session.model_dump_json())
        return
    _show(session, False, SESSION_COLUMNS)
    _show(session.agents, False, AGENT_COLUMNS)


@session_app.command("stop")
def session_stop(session_id: str, home: HomeOption = None, as_json: JsonOption = False) -> None:
    """Stop: close the session's wake gate and cancel its pending timers."""
    _show(run_as(home, None, lambda c: c.stop_session(session_id)), as_json, SESSION_COLUMNS)


@session_app.command("archive")
def session_archive(session_id: str, home: HomeOption = None, as_json: JsonOption = False) -> None:
    """Archive: like stop; it must be restored before it can resume."""
    _show(run_as(home, None, lambda c: c.archive_session(session_id)), as_json, SESSION_COLUMNS)


@session_app.command("restore")
def session_restore(session_id: str, home: HomeOption = None, as_json: JsonOption = False) -> None:
    """Restore an archived session (it stays stopped; cancelled timers stay cancelled)."""
    _show(run_as(home, None, lambda c: c.restore_session(session_id)), as_json, SESSION_COLUMNS)


@session_app.command("resume")
def session_resume(session_id: str, home: HomeOption = None, as_json: JsonOption = False) -> None:
    """Resume a stopped session; prints the main agent's unread notices."""
    _show_resume(run_as(home, None, lambda c: c.resume_session(session_id)), as_json)


@session_app.command("request")
def session_request(session_id: str, home: HomeOption = None, as_json: JsonOption = False) -> None:
    """A new user request: resumes a stopped session, begins the main agent's turn and prints
    the summary of its unread notices (they wake nobody afterwards)."""
    _show_resume(run_as(home, None, lambda c: c.user_request(session_id)), as_json)


@session_app.command("events")
def session_events(session_id: str, home: HomeOption = None, as_json: JsonOption = False) -> None:
    """The session's recorded lifecycle events."""
    events = run_as(home, None, lambda c: c.session_events(session_id))
    _show(events, as_json, ("seq", "kind", "agent_id", "detail"))


@session_app.command("wakes")
def session_wakes(
    session_id: str,
    home: HomeOption = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Stream new wakes.")] = False,
    after: Annotated[int, typer.Option(help="Only wakes after this seq.")] = 0,
    as_json: Annotated[
        bool, typer.Option("--json", help="Accepted for consistency: wakes are JSON lines.")
    ] = True,
) -> None:
    """The session's wakes as JSON lines; --follow keeps streaming them (server-sent events)."""

    def show(client: Any) -> None:
        wakes = client.wake_stream(session_id, after) if follow else client.wakes(session_id, after)
        for wake in wakes:
            print(wake.model_dump_json(), flush=True)

    run_as(home, None, show)


# ---------------------------------------------------------------------- agent


@agent_app.command("show")
def agent_show(agent_id: str, home: HomeOption = None, as_json: JsonOption = False) -> None:
    """An agent: session, parent, state (idle/busy) and wake gate."""
    _show(run_as(home, None, lambda c: c.agent(agent_id)), as_json, AGENT_COLUMNS)


@agent_app.command("create-child")
def agent_create_child(
    parent_id: str, home: HomeOption = None, as_json: JsonOption = False
) -> None:
    """Create a child agent under PARENT_ID (its own workspace root, its own wakes)."""
    _show(run_as(home, None, lambda c: c.create_child(parent_id)), as_json, AGENT_COLUMNS)


@agent_app.command("turn-begin")
def agent_turn_begin(agent_id: str, home: HomeOption = None, as_json: JsonOption = False) -> None:
    """The host starts a turn: the agent is busy; notices wait for the turn's end."""
    _show(run_as(home, None, lambda c: c.turn_begin(agent_id)), as_json, AGENT_COLUMNS)


@agent_app.command("turn-end")
def agent_turn_end(agent_id: str, home: HomeOption = None, as_json: JsonOption = False) -> None:
    """The turn is over: the agent is idle; waiting notices wake it now."""
    _show(run_as(home, None, lambda c: c.turn_end(agent_id)), as_json, AGENT_COLUMNS)


@agent_app.command("stop")
def agent_stop(agent_id: str, home: HomeOption = None, as_json: JsonOption = False) -> None:
    """Stop an agent: close its wake gate (its notices are kept)."""
    _show(run_as(home, None, lambda c: c.stop_agent(agent_id)), as_json, AGENT_COLUMNS)


@agent_app.command("resume")
def agent_resume(agent_id: str, home: HomeOption = None, as_json: JsonOption = False) -> None:
    """Resume a stopped agent (its session must be active)."""
    _show(run_as(home, None, lambda c: c.resume_agent(agent_id)), as_json, AGENT_COLUMNS)


# ---------------------------------------------------------------------- timer


@timer_app.command("create")
def timer_create(
    text: str,
    home: HomeOption = None,
    agent: AgentOption = None,
    after_ms: Annotated[int | None, typer.Option(help="Milliseconds from now.")] = None,
    at: Annotated[
        str | None,
        typer.Option(help="2030-06-01T09:00:00+02:00, or 2030-06-01T09:00:00[Europe/Paris]."),
    ] = None,
    execution_id: Annotated[
        str | None, typer.Option("--execution", help="Cancelled if it finishes first.")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Set a one-time reminder (exactly one of --after-ms or --at)."""
    timer = run_as(home, agent, lambda c: c.timer_create(text, after_ms, at, execution_id))
    _show(timer, as_json, TIMER_COLUMNS)


AfterOption = Annotated[
    str | None, typer.Option("--after", help="Start after this id (the next page).")
]


def _say_more(ids: list[str]) -> None:
    """A full page: say how to see the next one (on stderr, so --json stays parsable)."""
    from shellyard.contract.sessions import DEFAULT_LIST_PAGE

    if len(ids) >= DEFAULT_LIST_PAGE:
        err.print(f"this is one page of {len(ids)}; more may follow: add --after {ids[-1]}")


@timer_app.command("list")
def timer_list(
    home: HomeOption = None,
    agent: AgentOption = None,
    state: Annotated[str | None, typer.Option(help="pending, fired or cancelled")] = None,
    after: AfterOption = None,
    as_json: JsonOption = False,
) -> None:
    """The agent's timers (one page)."""
    timers = run_as(home, agent, lambda c: c.timer_list(state, after))
    _show(timers, as_json, TIMER_COLUMNS)
    _say_more([t.timer_id for t in timers])


@timer_app.command("cancel")
def timer_cancel(
    timer_id: str, home: HomeOption = None, agent: AgentOption = None, as_json: JsonOption = False
) -> None:
    """Cancel a pending timer (a fired or cancelled one is shown unchanged)."""
    _show(run_as(home, agent, lambda c: c.timer_cancel(timer_id)), as_json, TIMER_COLUMNS)


# ---------------------------------------------------------------------- webhook


@webhook_app.command("add")
def webhook_add(
    url: str,
    home: HomeOption = None,
    secret: Annotated[str | None, typer.Option(help="HMAC key (generated if not given).")] = None,
    session_id: Annotated[
        str | None, typer.Option("--session", help="Only this session's wakes.")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Register a webhook; prints its secret once (signatures: X-Shellyard-Signature)."""
    hook = run_as(home, None, lambda c: c.add_webhook(url, secret, session_id))
    _show(hook, as_json, ("webhook_id", "url", "session_id", "secret"))


@webhook_app.command("list")
def webhook_list(home: HomeOption = None, as_json: JsonOption = False) -> None:
    """The active webhooks."""
    _show(run_as(home, None, lambda c: c.webhooks()), as_json, ("webhook_id", "url", "session_id"))


@webhook_app.command("remove")
def webhook_remove(webhook_id: str, home: HomeOption = None, as_json: JsonOption = False) -> None:
    """Stop sending wakes to a webhook (its delivery records stay)."""
    hook = run_as(home, None, lambda c: c.remove_webhook(webhook_id))
    _show(hook, as_json, ("webhook_id", "url", "active"))


@webhook_app.command("deliveries")
def webhook_deliveries(wake_id: str, home: HomeOption = None, as_json: JsonOption = False) -> None:
    """A wake's webhook deliveries and their attempts."""
    found = run_as(home, None, lambda c: c.wake_deliveries(wake_id))
    _show(found, as_json, ("delivery_id", "webhook_id", "state", "attempts", "last_error"))


# ---------------------------------------------------------------------- inbox


def inbox(
    home: HomeOption = None,
    agent: AgentOption = None,
    unread: Annotated[bool, typer.Option("--unread", help="Only unread notices.")] = False,
    summary: Annotated[bool, typer.Option("--summary", help="The unread summary.")] = False,
    mark_read: Annotated[
        bool, typer.Option("--mark-read", help="Mark the listed notices read.")
    ] = False,
    after: AfterOption = None,
    as_json: JsonOption = False,
) -> None:
    """An agent's durable inbox: notices of finished executions, transfers and reminders
    (one page)."""
    if summary and mark_read:
        err.print("give --summary or --mark-read, not both")
        raise typer.Exit(2)
    if summary:
        result = run_as(home, agent, lambda c: c.inbox_summary())
        if as_json:
            out.print_json(result.model_dump_json())
        else:
            out.print(result.text, highlight=False)
        return
    notices = run_as(home, agent, lambda c: c.inbox(unread, after))
    _show(notices, as_json, NOTICE_COLUMNS)
    _say_more([n.notice_id for n in notices])
    if mark_read and notices:
        ids = [n.notice_id for n in notices]
        marked = run_as(home, agent, lambda c: c.mark_read(ids))
        if not as_json:
            out.print(f"{marked} marked read")
