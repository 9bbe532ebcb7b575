"""Package builds held by their workspace's cgroups (R2; docs/limits.md "Tenants", "Package
tools are held too").

A package change's tools run the agent's code: here, the in-tree build backend of an sdist the
agent put in its workspace. The build allocates 1.5 GiB under ``SHELLYARD_MEMORY_LIMIT=512M``,
or forks 500 processes under ``SHELLYARD_PROCESS_LIMIT=200``: the change fails with the limit
named first in its error (V8: the prefix is rolled back), a command in another workspace runs
while the build is held, and no tool group is left afterwards. Real sandboxes, real uv, real
cgroup v1 hierarchies (skipped, with the reason, where none is writable)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from env_fixtures import backend_sdist
from test_env_tool_rights import _agent, _create, _install, _put
from test_tenants import needs_cgroups, other_workspace_run, policy, until_gone

from conftest import Yard
from shellyard.errors import ChangeFailed
from shellyard.runner.limits import cgroups

pytestmark = [pytest.mark.timeout(300), needs_cgroups]

#: 1.5 GiB touched page by page: a real allocation, not a reservation.
HOG = """
b = bytearray(1536 << 20)
b[::4096] = b"x" * (len(b) // 4096)
RESULT = "survived"
"""
#: 500 processes that each wait (so they are all there at once), then end.
FORKS = """
import time
children = []
for _ in range(500):
    pid = os.fork()
    if pid == 0:
        time.sleep(20)
        os._exit(0)
    children.append(pid)
RESULT = len(children)
"""


async def build_beside(yard: Yard, name: str, body: str) -> tuple[str, Any]:
    """Install the sdist ``name`` whose backend runs ``body`` from a workspace of its own,
    and meanwhile run a command in another workspace; (the change's error, that command)."""
    agent = await _agent(yard)
    environment_id = await _create(yard, agent, name)
    archive = f"dist/{name.replace('-', '_')}-1.0.tar.gz"
    await _put(yard, agent, {archive: backend_sdist(name, "1.0", body)}, {})

    async def install() -> str:
        try:
            change = await _install(
                yard, agent, environment_id, manager="pip", specs=[name], index_url="none",
                find_links=["/workspace/dist"],
            )  # fmt: skip
        except ChangeFailed as failed:
            return str(failed)
        assert change.state == "failed", change  # the build was not stopped
        return str(change.error)

    async def beside() -> Any:
        await asyncio.sleep(1.0)  # the build is under way
        return await other_workspace_run(yard, "echo B runs")

    error, other = await asyncio.gather(install(), beside())
    return error, other


@pytest.mark.runner_kinds("local", "direct")
async def test_a_build_past_the_memory_limit_is_stopped_and_says_memory(
    yard_factory: Any,
) -> None:
    """R2, V8: the build backend touches 1.5 GiB under a 512 MiB limit: the change fails with
    ``limit: memory`` leading the runner's error; B's command runs meanwhile; no tool group is left.
    Before: the build ran in no cgroup and the install succeeded."""
    yard: Yard = await yard_factory(policy(memory_limit_bytes=512 << 20))
    error, other = await build_beside(yard, "sy-hog", HOG)
    assert "): limit: memory: the tool was stopped at its memory limit of 512 MiB" in error, error
    assert "SHELLYARD_MEMORY_LIMIT" in error, error
    assert other.exit_code == 0 and "B runs" in other.stdout, other
    # removed by the runner's removal thread once the tool's processes have ended
    await until_gone(yard, lambda group: "-tool" in group.name)


@pytest.mark.runner_kinds("local", "direct")
async def test_a_build_past_the_process_limit_is_stopped_and_says_processes(
    yard_factory: Any,
) -> None:
    """R2, V8: the build backend forks 500 processes under a workspace process limit of 200:
    a fork fails, the change fails with ``limit: processes`` leading the runner's error; B's command
    runs meanwhile; no tool group is left. Before: all 500 were made and the install
    succeeded."""
    yard: Yard = await yard_factory(policy(process_limit=200))
    error, other = await build_beside(yard, "sy-forks", FORKS)
    assert "): limit: processes: the tool's workspace reached its process limit" in error, error
    assert "of 200 (SHELLYARD_PROCESS_LIMIT)" in error, error
    assert other.exit_code == 0 and "B runs" in other.stdout, other
    # removed by the runner's removal thread once the tool's processes have ended
    await until_gone(yard, lambda group: "-tool" in group.name)


def test_a_sweep_leaves_a_running_tool_s_group_alone(tmp_path: Path) -> None:
    """R2, E11: a sweep (a runner re-attaching or closing while a change runs) removes the
    groups of ended executions, never a running tool's (it would end the build under it);
    the tool's own end removes it."""
    tree = cgroups.CgroupTree.probe(
        f"shellyard-test-held-{tmp_path.name[-8:]}", cgroups.TenantLimits(256 << 20, 64), "v1"
    )
    assert tree is not None
    try:
        tree.start("ws", "stale")
        tree.start("ws", "change-tool1", held=True)
        assert tree.sweep(set()) == ["stale"]
        names = {p.name for p in tree.groups()}
        assert "change-tool1" in names and "stale" not in names, names
        tree.finish("ws", "change-tool1")
        tree.drain()  # removed by the tree's removal thread
        assert "change-tool1" not in {p.name for p in tree.groups()}
    finally:
        tree.close(set())
