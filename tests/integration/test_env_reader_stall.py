"""A reader of the workspace's package sources that makes no progress holds nothing
(docs/security.md "Attack pass (session 44)", docs/environments.md "Local package files").

The reader (run as the workspace's uid) copies what the agent named, so the agent decides
what it reads; a file whose reads block (a FUSE mount, a device) would hold the change, its
runner thread and the environment's lock. Here the stall is real: the reader's processes are
stopped (SIGSTOP) right after they start, before they send a byte (the moment is the test's;
what follows is the runner's own). Real components: the control plane with its LocalRunner,
bubblewrap, uv, the reader."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from env_fixtures import make_wheel
from test_env_tool_rights import _agent, _create, _install, _put

from conftest import Yard
from shellyard.contract.environments import EnvironmentChangeBody
from shellyard.errors import ChangeFailed
from shellyard.runner.environments.managers.readers import Pipe, Readers
from shellyard.runner.policy import SandboxPolicy

pytestmark = [pytest.mark.timeout(300), pytest.mark.runner_kinds("local")]


@pytest.fixture
def stopped(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Every reader started from now on is stopped before it sends anything; their process
    groups, in start order (any left at the end is killed: a failing test leaves none)."""
    original = Readers.run
    groups: list[int] = []

    @contextlib.contextmanager
    def run_stopped(self: Readers, argv: list[str]) -> Iterator[Pipe]:
        with original(self, argv) as pipe:
            os.killpg(pipe.pid, signal.SIGSTOP)
            groups.append(pipe.pid)
            yield pipe

    monkeypatch.setattr(Readers, "run", run_stopped)
    yield groups
    for group in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)


def _gone(pid: int) -> bool:
    return not os.path.exists(f"/proc/{pid}")


async def _wheels_in_workspace(yard: Yard, agent: str, tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "built", "sy-stall", "1.0")
    await _put(yard, agent, {f"wheels/{wheel.name}": wheel.read_bytes()}, {})


async def test_a_reader_that_sends_nothing_fails_the_change_naming_the_source(
    yard_factory: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, stopped: list[int]
) -> None:
    """``find_links=/workspace/wheels`` with the reader stalled and a bound of 1 s: the change
    fails with an error naming the folder as the agent named it, the reader is gone, and the
    environment takes the next change (its lock was let go)."""
    yard: Yard = await yard_factory(SandboxPolicy(source_stall_s=1.0))
    agent = await _agent(yard)
    environment_id = await _create(yard, agent, "stall")
    await _wheels_in_workspace(yard, agent, tmp_path)
    options: dict[str, Any] = {
        "manager": "pip", "index_url": "none", "find_links": ["/workspace/wheels"],
        "specs": ["sy-stall"],
    }  # fmt: skip
    with pytest.raises(ChangeFailed) as failed:
        await _install(yard, agent, environment_id, **options)
    error = str(failed.value)
    assert "/workspace/wheels" in error and "reader sent nothing for 1 s" in error, error
    assert str(yard.home) not in error  # the host path is not shown (R2)
    assert stopped and _gone(stopped[0])
    monkeypatch.undo()
    again = await _install(yard, agent, environment_id, **options)
    assert again.state == "succeeded", again


async def test_an_abandoned_change_kills_its_stalled_reader(
    yard_factory: Any, tmp_path: Path, stopped: list[int]
) -> None:
    """The same stall, with a bound of an hour: the runner abandoning the change (its
    environment store closing) kills the reader at once, so the change ends (failed, rolled
    back) instead of holding its thread and the environment's lock for ever."""
    yard: Yard = await yard_factory(SandboxPolicy(source_stall_s=3600.0))
    agent = await _agent(yard)
    environment_id = await _create(yard, agent, "cancel")
    await _wheels_in_workspace(yard, agent, tmp_path)
    body = EnvironmentChangeBody(
        manager="pip", index_url="none", find_links=["/workspace/wheels"], specs=["sy-stall"],
        wait_ms=0,
    )  # fmt: skip
    await yard.plane.environments.install(environment_id, body, agent)  # not waited for
    for _ in range(600):
        if stopped:
            break
        await asyncio.sleep(0.05)
    assert stopped, "no reader started"
    store = yard.runner._environments
    [running] = list(store._running.values())
    # The runner closes (its only way to abandon a change): the change must end well within
    # the close's grace, and its reader with it.
    await asyncio.wait_for(store.aclose(), timeout=60)
    for _ in range(200):
        if _gone(stopped[0]):
            break
        await asyncio.sleep(0.05)
    assert _gone(stopped[0]), "the abandoned change's reader lives on"
    assert running.done.is_set()
    assert running.record.state == "failed", running.record
