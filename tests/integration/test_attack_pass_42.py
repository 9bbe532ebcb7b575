"""Attack pass of session 42 (second engineer) on the privileges branch: the writer lock in
runner/edits/writers.py (W1), an environment change holding the asking workspace's folders
(own_mounts.py, R2), the netns join by descriptor (netns.py, launch.c) and the start-up sweep.
docs/security.md "Attack pass (session 42)".

As the holder of one session's agent token (a second session made through the admin API)
where the door takes an agent, on real bubblewrap sandboxes on the in-process local runner.
The overlays and namespace files are a root runner's: skipped with that reason otherwise."""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest
from env_fixtures import backend_sdist
from pydantic import ValidationError
from test_attack_pass_41 import _agent, _run
from test_env_tool_rights import _create

from conftest import Yard
from shellyard.contract.environments import EnvironmentChangeBody, EnvironmentCreateRequest
from shellyard.errors import ShellyardError, WorkspaceBusy

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.runner_kinds("local"),
    pytest.mark.skipif(os.geteuid() != 0, reason="a workspace's own overlay is a root runner's"),
]


@pytest.fixture(autouse=True)
def own_mounts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHELLYARD_OWN_MOUNTS", "on")
    monkeypatch.setenv("SHELLYARD_WARM_SANDBOXES", "0")


async def _until(check: Any, what: str) -> None:
    for _ in range(2400):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never: {what}")


async def test_a_second_writer_and_a_command_beside_a_writer_are_refused(yard: Yard) -> None:
    """W1 after the move to edits/writers.py: while an upload streams, a second upload and a
    writer command on the same workspace answer busy; the first upload lands whole."""
    agent = await _agent(yard)
    first = await _run(yard, agent, "echo base > base.txt")
    ws = first.workspace_id
    go = asyncio.Event()
    started = asyncio.Event()

    async def slow() -> AsyncIterator[bytes]:
        yield b"a" * 1000
        started.set()
        await go.wait()
        yield b"b" * 1000

    runner = yard.runner
    upload = asyncio.create_task(runner.write_file(ws, "one.bin", slow(), None))
    await started.wait()

    async def once() -> AsyncIterator[bytes]:
        yield b"second"

    with pytest.raises(WorkspaceBusy, match="another file operation"):
        await runner.write_file(ws, "two.bin", once(), None)
    refused: str
    try:
        done = await _run(yard, agent, "echo ran > ran.txt", wait_ms=5000)
        refused = f"{done.error} {done.state}"
        assert "ran" not in done.stdout
    except ShellyardError as exc:
        refused = exc.message
    assert "file operation" in refused, refused
    go.set()
    result = await upload
    assert result.written[0].size == 2000
    data = await yard.read_file(ws, None, "one.bin")
    assert data == b"a" * 1000 + b"b" * 1000
    seen = await _run(yard, agent, "ls -A")
    assert seen.stdout.split() == ["base.txt", "one.bin"], seen


async def test_a_writer_beside_a_running_command_is_refused_naming_it(yard: Yard) -> None:
    agent = await _agent(yard)
    first = await _run(yard, agent, "true")
    ws = first.workspace_id
    runner = yard.runner
    command = asyncio.create_task(_run(yard, agent, "touch started; sleep 3; echo done"))
    await _until(lambda: ws in runner._runs.busy_workspaces, "the command runs")
    holder = runner._runs.busy_workspaces[ws]

    async def once() -> AsyncIterator[bytes]:
        yield b"beside"

    with pytest.raises(WorkspaceBusy, match=holder):
        await runner.write_file(ws, "beside.txt", once(), None)
    with pytest.raises(WorkspaceBusy):
        await runner.delete_path(ws, "started", False)
    done = await command
    assert done.stdout.strip() == "done", done
    seen = await _run(yard, agent, "ls -A")
    assert seen.stdout.split() == ["started"], seen


FAIL_BUILD = """
    raise SystemExit("the backend refuses to build")
"""


async def test_refused_and_failed_changes_leave_no_hold(yard: Yard) -> None:
    """A refused source (outside /workspace, a link out of it, a missing folder) and a build
    that fails: the workspace's holds are back at 0 after each."""
    sdist = base64.b64encode(backend_sdist("sy-fails", "1.0", FAIL_BUILD)).decode()
    put = await yard.run(
        f"mkdir dist && echo {sdist} | base64 -d > dist/sy_fails-1.0.tar.gz"
        " && ln -s /etc etc-link && ln -s /etc/shadow dist/shadow"
    )
    assert put.exit_code == 0, put
    ws = put.workspace_id
    mounts = yard.runner._mounts
    await _until(lambda: mounts.holds(ws) == [0, 0], "the command let go")
    created = await yard.plane.environments.create(
        EnvironmentCreateRequest(
            name="fails", language="python", runner_id=yard.runner_id, wait_ms=30_000
        )
    )
    if created.state != "ready":
        assert created.change_id is not None, created
        await yard.plane.environments.wait(created.change_id, 120)
    env = created.environment_id
    for source in ("/etc", "/workspace/etc-link", "/workspace/../etc", "/workspace/missing"):
        state = "refused"
        try:
            body = EnvironmentChangeBody(
                manager="pip", specs=["sy-fails"], index_url="none", find_links=[source]
            )
            change = await yard.plane.environments.install(env, body)
            done = await yard.plane.environments.wait(change.change_id, 120)
            state = done.state
        except (ShellyardError, ValidationError):
            pass
        assert state != "succeeded", source
        await _until(lambda: mounts.holds(ws) == [0, 0], f"holds back to 0 after {source}")
    body = EnvironmentChangeBody(
        manager="pip", specs=["sy-fails"], index_url="none", find_links=["/workspace/dist"]
    )
    with pytest.raises(ShellyardError, match="the backend refuses to build"):
        change = await yard.plane.environments.install(env, body)
        await yard.plane.environments.wait(change.change_id, 120)
    await _until(lambda: mounts.holds(ws) == [0, 0], "holds back to 0 after a failed build")


async def test_no_namespace_descriptor_reaches_the_sandbox(yard: Yard) -> None:
    """netns join by descriptor: the runner's --netns-fd/--userns-fd descriptors are closed
    before the command; neither the command nor the sandbox's init holds a namespace."""
    agent = await _agent(yard)
    assert (await _run(yard, agent, "true")).exit_code == 0
    for options in ({}, {"read_only": True}):
        done = await _run(
            yard,
            agent,
            "for f in /proc/self/fd/* /proc/1/fd/*; do echo $f $(readlink $f); done",
            **options,
        )
        assert done.exit_code == 0, done
        lines = done.stdout.splitlines()
        assert lines, done
        for line in lines:
            assert ":[" not in line or line.split()[-1].split(":")[0] in (
                "pipe",
                "socket",
                "anon_inode",
            ), line
        assert not [x for x in lines if "net:[" in x or "user:[" in x or "mnt:[" in x], lines


async def test_a_refused_local_source_names_no_host_path(yard: Yard) -> None:
    """Found and fixed: a find_links under /workspace that does not exist was refused with the
    workspace's host path (the home, the runner, the workspace id's folder), which R2 and
    docs/security.md "Host paths" say an agent never sees; it names /workspace/missing now."""
    agent = await _agent(yard)
    first = await _run(yard, agent, "true")
    assert first.exit_code == 0, first
    environment_id = await _create(yard, agent, "leak")
    body = EnvironmentChangeBody(
        manager="pip", specs=["sy-none"], index_url="none", find_links=["/workspace/missing"]
    )
    with pytest.raises(ShellyardError) as refused:
        change = await yard.plane.environments.install(environment_id, body, agent)
        await yard.plane.environments.wait(change.change_id, 120, agent)
    message = refused.value.message
    assert "/workspace/missing" in message, message
    assert str(yard.home) not in message, message
