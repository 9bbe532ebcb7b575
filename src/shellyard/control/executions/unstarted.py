"""A start whose answer never came: the runner daemon went away (killed, its host or network
down) while the control plane's ``start`` call was on it (E9–E11, R3).

Whether the command runs is then not known, so the record is ``unknown`` at once and says
why. Its watcher asks the runner about the same execution id (``wait``, never ``start``
again: a command is never resubmitted, E9/E10) until the runner answers, then records what
the runner says: running (or its end) when the start happened, ``failed`` "never started"
when the runner holds no trace of it, but ``unknown`` when the runner that holds no trace is
not the state the start was sent to (its state folder was wiped or replaced since: the start
may have run on the old one, runner/state_id.py). The questions are spaced at most :data:`ASK_CAP_S`
apart, not the 30 s of a running execution's backoff: until the answer, the writer of the
workspace is held by a command that may not exist, and a foreground caller is waiting.
A runner removed before it answered can never be asked again: :func:`runner_removed` ends
those records ``unknown`` with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Protocol

from shellyard.contract.executions import ExecutionState
from shellyard.errors import RunnerUnavailable
from shellyard.runner.protocol import NO_TRACE, RunnerExecState, RunnerExecution
from shellyard.store import Store
from shellyard.store.executions import Execution

#: Most seconds between two questions about a start whose answer never came.
ASK_CAP_S = 2.0

#: The record's error when the runner, back, has no trace of the execution.
NEVER_STARTED = (
    "never started: the runner went away before it took the start (it holds no trace of "
    "this execution); nothing ran, run it again"
)


#: The record's final error when the runner, back, has no trace of the execution but answers
#: from another state than the one the start was sent to (E9: never "run it again", E10).
STATE_REPLACED = (
    "the runner's state was replaced since the start was sent (its state folder was wiped or "
    "swapped: a new host, another --root, a restore), so it holds no trace of this execution; "
    "whether the command ran (or still runs where the old state was) cannot be known. Look "
    "at what it would have changed before running it again"
)


def replaced(sent_to: str | None, result: RunnerExecution) -> bool:
    """Whether a ``never_took`` answer comes from another state than the one the start went
    to (``sent_to``, the record's ``runner_state``). A record without one (made before
    session 52, or while the plane had no ``info`` of the runner yet) keeps the reading of
    before: "never started". An answer without a state id from a runner that had one at the
    start is a runner of an older release on that host now: not the same state, as far as
    anyone can tell."""
    return sent_to is not None and result.state_id != sent_to


async def record_asking(
    store: Store, execution_id: str, exc: RunnerUnavailable, sent_to: str | None
) -> None:
    """The record ``unknown`` at once, with the state the start was sent to (``replaced``)."""
    await store.update_execution(
        execution_id,
        state="unknown",
        error=asking(exc),
        was_unknown=True,
        runner_state=sent_to,
    )


def untraced_end(sent_to: str | None, result: RunnerExecution) -> tuple[ExecutionState, str]:
    """How a record ends when its runner holds no trace of it (``never_took``): ``failed``
    "never started", but ``unknown`` when the answer comes from another state than the one the
    start was sent to (E9, E10: the start may have run on the state that went)."""
    if replaced(sent_to, result):
        return ExecutionState.unknown, STATE_REPLACED
    return ExecutionState.failed, NEVER_STARTED


def asking(exc: RunnerUnavailable) -> str:
    """The record's error while the runner cannot be asked whether the start happened."""
    return (
        f"the start's answer never came, so whether it runs is not known ({exc.message}); "
        "the runner is asked about this execution until it answers (it is never started twice)"
    )


def removed(runner_id: str, started: bool) -> str:
    """The final error of an execution still unknown when its runner was removed: nothing can
    ask about it any more (control/runners.py ``remove``)."""
    what = "how the command ended" if started else "whether its start happened"
    return (
        f"runner {runner_id!r} was removed while {what} was not known; it can no longer be "
        "asked, so the outcome stays unknown (a command that did start may still run on that "
        "host)"
    )


class Ending(Protocol):
    """The service's end of an execution: the record terminal, its writer released."""

    async def __call__(
        self,
        row: Execution,
        state: ExecutionState,
        *,
        error: str,
        from_states: tuple[str, ...],
    ) -> None: ...


async def runner_removed(
    store: Store, watchers: dict[str, asyncio.Task[None]], end: Ending, runner_id: str
) -> None:
    """The runner is being removed (control/runners.py): its executions whose outcome is
    unknown and still asked about (a start's answer that never came, a runner that could
    not be asked) can never be asked again. Each ends ``unknown`` (E9: never a false
    outcome) with the reason, which lets go of what it held: the workspace's writer and
    its environment (V5 counts only unfinished ones). Their watchers (the service's, by
    execution id) stop first, so none records a late answer over the end; one answered just
    before (running now) is left as it is, and the lease keeper's next round watches it on."""
    for row in await store.unsettled_on_runner(runner_id):
        task = watchers.pop(row.id, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await end(
            row,
            ExecutionState.unknown,
            error=removed(runner_id, row.started_at is not None),
            from_states=("unknown",),
        )


def answered(row: Execution) -> bool:
    """Whether a final ``unknown`` is the runner's own answer, so its log can be read at once:
    the sandbox it started was lost (it ended without recording an exit code: E9's "the runner
    lost the execution's state"). Not so for one the runner did not answer about (a start's
    answer that never came, queries that kept failing: ``query_failures``, its runner removed
    meanwhile): asking that runner for a log would wait out a request's whole timeout (30 s)
    for a log that may not exist. ``started_at`` excludes a start never confirmed (a state
    replaced, a start cut in its bookkeeping: no log to speak of)."""
    return (
        row.state == ExecutionState.unknown
        and row.finished_at is not None
        and row.started_at is not None
        and row.query_failures == 0
    )


def never_took(result: RunnerExecution) -> bool:
    """The runner's answer for an id it holds no folder of, so the start never reached it (a
    lost sandbox it did start keeps its workspace; a start it was cut in says ``START_CUT``,
    which stays unknown)."""
    return (
        result.state == RunnerExecState.lost
        and not result.workspace_id
        and result.error == NO_TRACE
    )


async def confirmed(store: Store, execution_id: str, result: RunnerExecution) -> None:
    """The runner answered for a start it did take: the record runs from when it started
    (``was_unknown`` stays, the trace E9 asks for); its end, if any, is the caller's next
    step."""
    await store.update_execution(
        execution_id,
        from_states=("unknown",),
        state="running",
        started_at=result.started_at or time.time(),
        error=None,
        query_failures=0,
    )


__all__ = [
    "ASK_CAP_S",
    "NEVER_STARTED",
    "STATE_REPLACED",
    "Ending",
    "answered",
    "asking",
    "confirmed",
    "never_took",
    "record_asking",
    "removed",
    "replaced",
    "runner_removed",
    "untraced_end",
]
