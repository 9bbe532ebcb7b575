"""A change its runner abandoned while the record there says ``running`` (docs/environments.md,
"How a change is made safe" step 8 and "After a restart"): the control plane's driver backs
off instead of spinning on waits the runner answers at once, says so in the change's progress
line, and the change still ends ``interrupted`` (environment unchanged) once the runner starts
again. Real components: a control plane with its LocalRunner, uv building a package that hangs.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from env_fixtures import host_prefix, make_slow_sdist, prefix_hash

from conftest import open_yard
from shellyard.contract.environments import EnvironmentChangeBody, EnvironmentCreateRequest
from shellyard.runner.local import LocalRunner
from shellyard.runner.protocol import EnvChangeState, EnvironmentChange

pytestmark = pytest.mark.timeout(300)

#: How long the driver's waits are counted once the change is abandoned.
WINDOW_S = 3.0
#: At most this many waits in the window. With the back-off (0.1 s doubling) it is about 6; the
#: spinning driver asked thousands of times.
MOST_WAITS = 25


async def test_abandoned_change_is_asked_with_backoff_and_ends_at_the_runner_restart(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plane, runner_id, _ = await open_yard(home, "local")
    try:
        created = await plane.environments.create(
            EnvironmentCreateRequest(name="main", runner_id=runner_id, wait_ms=30_000)
        )
        assert created.state == "ready", created
        environment_id = created.environment_id
        runner = plane.runners.get(runner_id)
        assert isinstance(runner, LocalRunner)
        prefix = host_prefix(home / "home" / "runners" / "local", environment_id)
        before = prefix_hash(prefix)
        sdists = home / "sdists"
        make_slow_sdist(sdists, "sy-slow", "1.0", prefix, "hang")
        started = await plane.environments.install(
            environment_id,
            EnvironmentChangeBody(
                manager="pip", specs=["sy-slow==1.0"], find_links=[str(sdists)],
                index_url="none", wait_ms=0,
            ),
        )  # fmt: skip
        change_id = started.change_id
        deadline = time.monotonic() + 120
        while not (prefix / ".build-started").exists():
            assert time.monotonic() < deadline, "the package build never started"
            await asyncio.sleep(0.05)

        waits = 0
        real_wait = runner.environment_change_wait

        async def counted(change_id: str, timeout_s: float) -> EnvironmentChange:
            nonlocal waits
            waits += 1
            # A runner behind a transport (the daemon, ssh) yields on every call; the local
            # one answers a finished wait without ever suspending, so without this the spin
            # would hold the event loop itself and no window could be measured.
            await asyncio.sleep(0)
            return await real_wait(change_id, timeout_s)

        monkeypatch.setattr(runner, "environment_change_wait", counted)
        # Abandon it as the runner's close does with a change that outlives its grace
        # (store.aclose cancels the task): tools killed, journal and the record ``running``
        # left for the next start's recovery.
        task = runner._environments._running[change_id].task
        assert task is not None
        task.cancel()
        while change_id in runner._environments._running:
            await asyncio.sleep(0.01)
        on_runner = await runner.environment_change_status(change_id)
        assert on_runner.state == EnvChangeState.running

        waits = 0
        await asyncio.sleep(WINDOW_S)
        counted_waits = waits
        assert counted_waits <= MOST_WAITS, f"{counted_waits} waits in {WINDOW_S} s: spinning"
        assert counted_waits >= 2  # still asking: an end would be seen
        view = await plane.environments.change_status(change_id)
        assert view.state == "running"
        assert view.progress is not None and "not working on it" in view.progress, view.progress
        assert "interrupted" in view.progress
    finally:
        await plane.aclose()

    # The runner's next start (here, with the control plane it lives in) rolls the prefix back
    # and records the change interrupted; the driver re-attaches and records that end.
    plane, runner_id, _ = await open_yard(home, "local")
    try:
        ended = await plane.environments.wait(change_id, 30)
        assert (ended.state, ended.error_kind) == ("failed", "interrupted"), ended
        view = await plane.environments.show(environment_id)
        assert view.revision == 1 and view.pending_changes == []
        assert prefix_hash(prefix) == before
    finally:
        await plane.aclose()
