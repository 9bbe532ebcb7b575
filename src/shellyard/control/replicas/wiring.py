"""Wiring of several replicas on one database (docs/operations.md): what the services publish
(``Publish``, given to each when built by ``control/plane.py``; no-ops on SQLite, one replica)
and what they do with the other replicas' messages (``wire``: the fan-out's handlers). The
services know neither the fan-out nor the keeper's class: their hooks are plain callables."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shellyard.contract.sessions import WakeView
from shellyard.control.executions.service import ExecutionService
from shellyard.control.files.transfers import TransferService
from shellyard.control.notify.timers import TimerService
from shellyard.control.notify.wakes import WakeService
from shellyard.control.replicas.fanout import Fanout, Kind


def _nothing(*_args: object) -> None:
    """A publish hook with no other replica to tell (the fan-out is disabled: SQLite)."""


@dataclass(frozen=True)
class Publish:
    """What this replica tells the others (docs/operations.md): one callable per message a
    service sends, given to the service when built. With the fan-out disabled (SQLite is one
    replica) every one does nothing, so no service asks whether there are replicas."""

    #: ``ExecutionService``: an execution's waiters were woken here (E3, E6 across replicas).
    execution_ended: Callable[[str], None] = _nothing
    #: ``TransferService``: a transfer ended, or its cancel was asked here (T1–T5).
    transfer_changed: Callable[[str], None] = _nothing
    #: ``RunnerRegistry``: a runner was added or removed here.
    runners_changed: Callable[[], None] = _nothing
    #: ``WakeService``: an agent this replica was asked to wake (N2), a wake it emitted, a
    #: webhook added or removed.
    agent_may_wake: Callable[[str, str], None] = _nothing
    wake_emitted: Callable[[WakeView], None] = _nothing
    webhooks_changed: Callable[[], None] = _nothing
    #: ``TimerService`` (N5–N7): the (channel, payload) a timer's insert transaction sends
    #: (None: nothing to send), and the message after a cancellation.
    timer_created: Callable[[], tuple[str, str] | None] = lambda: None
    timers_changed: Callable[[], None] = _nothing


def publishers(fanout: Fanout) -> Publish:
    """The publish hooks of the services, built before them (control/plane.py)."""
    if not fanout.enabled:
        return Publish()
    return Publish(
        execution_ended=lambda execution_id: fanout.publish(
            Kind.EXECUTION_ENDED, execution_id=execution_id
        ),
        transfer_changed=lambda transfer_id: fanout.publish(
            Kind.TRANSFER_CHANGED, transfer_id=transfer_id
        ),
        runners_changed=lambda: fanout.publish(Kind.RUNNERS_CHANGED),
        agent_may_wake=lambda agent_id, reason: fanout.publish(
            Kind.AGENT_MAY_WAKE, agent_id=agent_id, reason=reason
        ),
        wake_emitted=lambda wake: fanout.publish(
            Kind.WAKE_EMITTED, session_id=wake.session_id, seq=wake.seq
        ),
        webhooks_changed=lambda: fanout.publish(Kind.WEBHOOKS_CHANGED),
        timer_created=lambda: fanout.message(Kind.TIMERS_CHANGED),
        timers_changed=lambda: fanout.publish(Kind.TIMERS_CHANGED),
    )


def wire(
    executions: ExecutionService,
    wakes: WakeService,
    transfers: TransferService,
    fanout: Fanout,
    timers: TimerService,
) -> None:
    """The fan-out's handlers: each message of another replica handed to the service it
    concerns (the only hooks still set after the services are built: they need them)."""
    if not fanout.enabled:
        return

    async def ended(message: dict[str, Any]) -> None:
        executions.signal(str(message["execution_id"]))

    async def notify(message: dict[str, Any]) -> None:
        reason = str(message.get("reason") or "notice")
        await wakes.notify(str(message["agent_id"]), reason, relayed=True)

    async def emitted(message: dict[str, Any]) -> None:
        await wakes.relay(str(message["session_id"]), int(message["seq"]))

    async def webhooks(_message: dict[str, Any]) -> None:
        await wakes.refresh_webhooks()

    async def runners(_message: dict[str, Any]) -> None:
        await executions.runners.reload()

    async def transfer(message: dict[str, Any]) -> None:
        transfers.signal(str(message["transfer_id"]))

    async def resync() -> None:
        # Messages may have been lost while the listener was away: every waiter reads its
        # record again, and every agent a channel of this replica can hear is tried.
        for execution_id in list(executions.waited()):
            executions.signal(execution_id)
        for transfer_id in transfers.watched():
            transfers.signal(transfer_id)
        await wakes.refresh_webhooks()
        await wakes.kick_all("channel")
        await executions.runners.reload()

    fanout.handlers.update(
        {
            Kind.EXECUTION_ENDED: ended,
            Kind.AGENT_MAY_WAKE: notify,
            Kind.WAKE_EMITTED: emitted,
            Kind.WEBHOOKS_CHANGED: webhooks,
            Kind.RUNNERS_CHANGED: runners,
            Kind.TRANSFER_CHANGED: transfer,
        }
    )
    fanout.on_resync.append(resync)
    _wire_timers(timers, fanout)


def _wire_timers(timers: TimerService, fanout: Fanout) -> None:
    # N5–N7 across replicas: every scheduler hears of a timer created or cancelled anywhere
    # (it announces them through ``Publish``, given when built).
    async def timer_changed(_message: dict[str, Any]) -> None:
        timers.changed()

    async def timers_resync() -> None:
        timers.changed()

    fanout.handlers[Kind.TIMERS_CHANGED] = timer_changed
    fanout.on_resync.append(timers_resync)
