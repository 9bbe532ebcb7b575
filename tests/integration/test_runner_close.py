"""A runner's close takes every step even when one fails (runner/local.py ``aclose``, the
steps taken by runner/closing.py; E11: the sandboxes keep running): a step that raised left
the later ones undone, and with them the threads and mounts they end (the removal thread of
the cgroups, the mounts' reapers) for the life of the process. The first failure still
reaches the caller."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from local_runner import ended, local_runner

from shellyard.runner.protocol import RunnerExecState, StartRequest

#: The loop's default executor's workers: the loop's, not the runner's.
LOOP_THREADS = "asyncio_"


async def test_a_step_that_fails_does_not_stop_the_rest_of_the_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = set(threading.enumerate())
    closed: list[str] = []
    with pytest.raises(RuntimeError, match="environments refused to close"):
        async with local_runner(tmp_path, "ws-close") as runner:
            started = await runner.start(
                StartRequest(execution_id="ex-close", workspace_id="ws-close", command="true")
            )
            assert (await ended(runner, started.execution_id)).state == RunnerExecState.finished

            async def refuse() -> None:
                raise RuntimeError("environments refused to close")

            # An early step fails; a later one is watched to be reached.
            monkeypatch.setattr(runner._environments, "aclose", refuse)
            real_close = runner._mounts.close

            def mounts_close() -> None:
                closed.append("mounts")
                real_close()

            monkeypatch.setattr(runner._mounts, "close", mounts_close)
    assert closed == ["mounts"], "the steps after the failed one were not taken"
    left = [
        t for t in threading.enumerate() if t not in before and not t.name.startswith(LOOP_THREADS)
    ]
    for thread in left:  # the pools shut down without waiting end once told (watcher.py)
        thread.join(10)
    assert not [t for t in left if t.is_alive()], left
