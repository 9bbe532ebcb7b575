"""Attack pass of session 52 (second engineer) on the fixes of session 51: a foreground run
whose start's answer never came answers ``unknown`` at once, a copier of a transfer ended
elsewhere stops before its next batch, a change or an unknown execution on a removed runner
ends with the reason, and the SDK's ``AnswerLost`` (docs/security.md "Attack pass (session
52)").

Real ``shellyard serve`` replicas on a PostgreSQL database made for the test and a real
runner daemon process, killed -9 and restarted where the attack needs it. Each test says
whether it is a finding (fixed here) or a property that held."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from replicas_fixture import Replica, fresh_database, replica_env, start_replicas, stop_all
from runner_daemon_fixture import start_daemon

from shellyard.runner.protocol import SandboxPolicy

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("postgres")]

#: Long enough for a runner's removal, its daemon's restart and its adding again to come
#: before the killed replica's lease on the execution expires.
LEASE_TTL_S = "8"


async def _post(replica: Replica, path: str, **body: Any) -> dict[str, Any]:
    async with replica.client() as client:
        answer = await client.post(path, json=body)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


async def _get(replica: Replica, path: str) -> dict[str, Any]:
    async with replica.client() as client:
        answer = await client.get(path)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


async def test_a_removed_runners_unknown_execution_is_not_reopened_by_a_lease_taken_over(
    home: Path,
) -> None:
    """Finding (E9, E11; docs/runners.md "Health": adding the runner again does not reopen
    them). A replica watching an execution whose runner stopped answering (``unknown``, still
    asked about) is killed -9; before its lease expires the runner is removed on the other
    replica, which ends the execution ``unknown`` with the reason and lets go of its
    workspace's writer, and the runner is added again. The dead replica's lease, which that
    end could not delete (another holder's), was then taken over and the final record
    watched again: the runner, back, answered, and the ended execution turned ``running``
    (with no writer) and then ``completed``, its end posted twice. A final record is never
    watched or changed again."""
    async with fresh_database() as url:
        daemon = await start_daemon(home / "daemon", SandboxPolicy(), subprocess=True)
        replicas = await start_replicas(url, 2, replica_env(SHELLYARD_LEASE_TTL_S=LEASE_TTL_S))
        a, b = replicas
        try:
            await _post(a, "/v1/runners", runner_id="r0", address=daemon.url, token=daemon.token)
            await asyncio.sleep(0.3)  # b heard of the runner
            started = await _post(
                b,
                "/v1/executions",
                command="sleep 25; echo done",
                runner_id="r0",
                background=True,
            )
            execution_id = started["execution_id"]
            daemon.kill()  # its sandbox runs on; b's questions about it fail
            deadline = time.monotonic() + 90
            while (await _get(a, f"/v1/executions/{execution_id}"))["state"] != "unknown":
                assert time.monotonic() < deadline, "b never recorded the execution unknown"
                await asyncio.sleep(0.2)
            b.kill()  # its lease on the execution stays until it expires
            removed = await _post(a, "/v1/runners/remove", runner_id="r0")
            assert removed["runner_id"] == "r0", removed
            ended = await _get(a, f"/v1/executions/{execution_id}")
            assert ended["state"] == "unknown" and "was removed" in ended["error"], ended
            await daemon.restart()
            await _post(a, "/v1/runners", runner_id="r0", address=daemon.url, token=daemon.token)
            # b's lease expires (8 s), a takes it over; the command ends 25 s after it began
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline:
                view = await _get(a, f"/v1/executions/{execution_id}")
                assert view["state"] == "unknown" and view["error"] == ended["error"], view
                assert view["finished_at"] == ended["finished_at"], view
                await asyncio.sleep(0.5)
        finally:
            stop_all(replicas)
            await daemon.stop()
