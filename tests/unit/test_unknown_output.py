"""Which ``unknown`` answers carry the command's output (E9), and how a sandbox whose bwrap
monitor was killed by a signal ends (E7, E9): the rules of ``unstarted.answered`` and
``spawn.bwrap_error``. End to end, through a real ``serve``:
``tests/doors/api/test_lost_sandbox.py`` (its runner answered: output) and
``tests/integration/test_env_hold_outage.py`` (a start whose answer never came: no log
asked of the runner)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from shellyard.control.executions import unstarted
from shellyard.runner.sandbox.spawn import bwrap_error
from shellyard.store.executions import Execution

#: What a sandbox lost while it ran leaves: the runner answered ``lost`` (options.outcome).
LOST = Execution(
    id="ex_1",
    seq=1,
    agent_id="ag_1",
    workspace_id="ws_1",
    runner_id="local",
    environment_id=None,
    environment_revision=None,
    waiting_for=None,
    command="echo hi; sleep 60",
    script_path=None,
    background=False,
    idempotency_key=None,
    state="unknown",
    exit_code=None,
    error="the sandbox ended without recording an exit code",
    snapshot_seq=None,
    created_at=1.0,
    started_at=2.0,
    finished_at=3.0,
    sandbox_policy=None,
    logs_pruned_at=None,
    ended_by_limit=None,
    peak_memory_bytes=None,
    cpu_seconds=None,
    run_options=None,
)


def test_only_an_unknown_its_runner_answered_reads_its_output() -> None:
    """E9: a final ``unknown`` that started and whose queries never failed is the runner's
    answer (its log is there); one still asked about, one whose start was never confirmed,
    one whose queries failed (its runner removed meanwhile) are not."""
    assert unstarted.answered(LOST)
    assert unstarted.answered(dataclasses.replace(LOST, was_unknown=True))  # came back, then lost
    asked = dataclasses.replace(LOST, finished_at=None)  # a start's answer never came
    unconfirmed = dataclasses.replace(LOST, started_at=None)  # a state replaced, a start cut
    failing = dataclasses.replace(LOST, query_failures=5, was_unknown=True)  # removed so
    completed = dataclasses.replace(LOST, state="completed", exit_code=0)
    assert not any(map(unstarted.answered, (asked, unconfirmed, failing, completed)))


def test_a_monitor_killed_once_the_sandbox_was_made_is_lost_not_could_not_start(
    tmp_path: Path,
) -> None:
    """E9: bwrap's own failures exit 1 with its message; a monitor killed by a signal once
    its status named the namespace's init leaves no outcome (None: the runner reports the
    sandbox lost). Killed before that, nothing of the command ran: it could not start."""
    (tmp_path / "stderr").write_bytes(b"bwrap: Can't mount proc: Operation not permitted\n")
    assert bwrap_error(tmp_path, -9, started=True) is None
    failed = bwrap_error(tmp_path, 1, started=True)
    assert failed is not None and "could not start" in failed and "mount proc" in failed
    early = bwrap_error(tmp_path, -9, started=False)
    assert early is not None and "could not start (bwrap exit -9)" in early
