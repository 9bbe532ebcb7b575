"""Wiring of several replicas on one database (issue 16): the lease keeper and the fan-out
plugged into the execution and wake services, which know neither (their hooks are plain
callables). Built by ``service.py``; on SQLite the keeper only records leases and the fan-out
publishes nothing, so one replica behaves as before."""

from __future__ import annotations

from typing import Any

from shellyard.control.executions import LEASE_KIND, ExecutionService
from shellyard.control.fanout import Fanout
from shellyard.control.leases import LeaseKeeper
from shellyard.control.metrics import Metrics
from shellyard.control.timers import TimerService
from shellyard.control.wakes import DELIVERY_LEASE, WakeService


def wire(
    executions: ExecutionService,
    wakes: WakeService,
    keeper: LeaseKeeper,
    fanout: Fanout,
    metrics: Metrics,
    timers: TimerService | None = None,
) -> None:
    executions.leases = keeper
    executions.waiter_ttl_s = keeper.ttl_s  # a killed waiter stops counting as a lease would
    keeper.adopters[LEASE_KIND] = executions.adopt
    keeper.on_lost[LEASE_KIND] = executions.forget
    keeper.dispatch = executions.dispatch
    executions.on_timing = metrics.observe
    wakes.leases = keeper
    keeper.adopters[DELIVERY_LEASE] = wakes.adopt_delivery
    keeper.on_lost[DELIVERY_LEASE] = wakes.forget_delivery

    async def sweep() -> None:
        # Notices a dead replica recorded but did not get to wake for (N2), and deliveries it
        # recorded but did not get to lease: a restart would have resumed them
        # (``WakeService.start``); with replicas the survivors do. Deliveries this replica
        # holds with no task running (adopted while it was starting) are resumed too.
        await wakes.kick_all("channel")
        for delivery_id in keeper.subjects(DELIVERY_LEASE):
            await wakes.adopt_delivery(delivery_id)
        for delivery_id in await keeper.store.unleased_deliveries(keeper.ttl_s):
            await wakes.adopt_delivery(delivery_id)

    keeper.sweep = sweep
    if not fanout.enabled:
        return

    executions.on_signal = lambda execution_id: fanout.publish("x", e=execution_id)
    executions.runners.on_change = lambda: fanout.publish("r")
    wakes.on_notify = lambda agent_id, reason: fanout.publish("n", a=agent_id, why=reason)
    wakes.on_emitted = lambda wake: fanout.publish("w", s=wake.session_id, q=wake.seq)
    wakes.on_webhooks = lambda: fanout.publish("h")

    async def ended(message: dict[str, Any]) -> None:
        executions.signal(str(message["e"]))

    async def notify(message: dict[str, Any]) -> None:
        await wakes.notify(str(message["a"]), str(message.get("why") or "notice"), relayed=True)

    async def emitted(message: dict[str, Any]) -> None:
        await wakes.relay(str(message["s"]), int(message["q"]))

    async def webhooks(_message: dict[str, Any]) -> None:
        await wakes.refresh_webhooks()

    async def runners(_message: dict[str, Any]) -> None:
        await executions.runners.reload()

    async def resync() -> None:
        # Messages may have been lost while the listener was away: every waiter reads its
        # record again, and every agent a channel of this replica can hear is tried.
        for execution_id in list(executions.waited()):
            executions.signal(execution_id)
        await wakes.refresh_webhooks()
        await wakes.kick_all("channel")
        await executions.runners.reload()

    fanout.handlers.update(x=ended, n=notify, w=emitted, h=webhooks, r=runners)
    fanout.on_resync.append(resync)
    _wire_timers(timers or _timer_service(executions), fanout)


def _timer_service(executions: ExecutionService) -> TimerService | None:
    """The timer service, found among the execution observers service.py plugged in (its N6
    hook) when it was not handed over."""
    for observer in executions.on_finished:
        owner = getattr(observer, "__self__", None)
        if isinstance(owner, TimerService):
            return owner
    return None


def _wire_timers(timers: TimerService | None, fanout: Fanout) -> None:
    # N5–N7 across replicas: every scheduler hears of a timer created or cancelled anywhere.
    if timers is None:
        return
    timers.announce = lambda: fanout.message("t")
    timers.on_change = lambda: fanout.publish("t")

    async def timer_changed(_message: dict[str, Any]) -> None:
        timers.changed()

    async def timers_resync() -> None:
        timers.changed()

    fanout.handlers["t"] = timer_changed
    fanout.on_resync.append(timers_resync)
