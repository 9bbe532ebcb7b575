"""E1 per-command options (timeout_ms, env, cwd, args) and the workspace's home, end to end
through the control plane on a local runner and a runner daemon (the wire).

Contract ids: E1, E2, E5, E7, E11, W2, W6; docs/contract.md "Per-command options", "The home"."""

from __future__ import annotations

import time

import pytest

from conftest import Yard
from shellyard.contract.executions import (
    ExecutionList,
    ExecutionState,
    ExecutionWait,
    RunShellRequest,
    parse_run_shell,
)
from shellyard.errors import InvalidInput, NotFound, PathRefused

pytestmark = pytest.mark.runner_kinds("local", "direct")


async def test_timeout_ms_cancels_with_outcome_timeout_and_frees_the_workspace(
    yard: Yard,
) -> None:
    """E1/E5: timeout_ms is an explicit cancel on the caller's behalf: the record ends
    cancelled, its limit and error say timeout, and the workspace takes the next command."""
    started = time.monotonic()
    result = await yard.run("echo begun; sleep 120", timeout_ms=1500, wait_ms=0)
    view = await yard.plane.executions.wait(result.execution_id, ExecutionWait(timeout_s=60))
    assert view.state == ExecutionState.cancelled, view
    assert view.limit == "timeout" and view.error and view.error.startswith("timeout"), view
    assert time.monotonic() - started < 60
    after = await yard.run("echo free")
    assert after.state == ExecutionState.completed and after.stdout == "free\n"
    quick = await yard.run("echo quick", timeout_ms=60_000)
    assert quick.state == ExecutionState.completed and quick.limit is None


async def test_env_reaches_the_command_after_the_sandbox_own(yard: Yard) -> None:
    """E1 env: extra variables, applied inside the sandbox; odd values arrive unchanged."""
    value = "a b 'c' \"d\" $HOME;\nnext"
    result = await yard.run(
        'printf "%s|%s" "$GREETING" "$ODD"', env={"GREETING": "hi", "ODD": value}
    )
    assert result.stdout == f"hi|{value}"


@pytest.mark.parametrize("name", ["HOME", "PWD", "SHELLYARD_EXECUTION_ID", "https_proxy"])
def test_env_names_of_the_sandbox_are_refused(name: str) -> None:
    with pytest.raises(InvalidInput, match="set by the sandbox itself"):
        parse_run_shell({"command": "true", "env": {name: "x"}})


def test_env_names_must_be_variable_names() -> None:
    with pytest.raises(InvalidInput, match="not a variable name"):
        parse_run_shell({"command": "true", "env": {"A-B": "x"}})


async def test_cwd_starts_in_a_folder_of_the_workspace(yard: Yard) -> None:
    await yard.run("mkdir -p src/pkg")
    result = await yard.run('pwd; echo "$PWD"; echo x > here.txt', cwd="src/pkg")
    assert result.stdout == "/workspace/src/pkg\n/workspace/src/pkg\n"
    seq = result.snapshot_seq
    assert await yard.read_file(result.workspace_id, seq, "src/pkg/here.txt") == b"x\n"


@pytest.mark.parametrize("cwd", ["..", "../x", "/etc", "a/../../b"])
async def test_cwd_outside_the_workspace_is_refused(yard: Yard, cwd: str) -> None:
    """W6: nothing recorded, a clear reason."""
    before = await yard.plane.executions.list(ExecutionList())
    with pytest.raises(PathRefused):
        await yard.run("pwd", cwd=cwd)
    assert len(await yard.plane.executions.list(ExecutionList())) == len(before)


async def test_cwd_that_does_not_exist_fails_with_the_reason(yard: Yard) -> None:
    result = await yard.run("pwd", cwd="nowhere")
    assert result.state == ExecutionState.failed
    assert result.error and "nowhere" in result.error and "not a folder" in result.error


async def test_cwd_through_a_link_is_refused(yard: Yard) -> None:
    await yard.run("ln -s /etc out")
    result = await yard.run("pwd", cwd="out")
    assert result.state == ExecutionState.failed
    assert result.error and "symbolic link" in result.error


async def test_args_reach_the_script_exactly(yard: Yard) -> None:
    await yard.run("printf '%s\\n' '#!/bin/bash' 'for a in \"$@\"; do echo \"<$a>\"; done' > s.sh")
    args = ["two words", "it's", 'say "hi"', "", "$HOME", "-x"]
    result = await yard.run(script_path="s.sh", args=args)
    assert result.stdout.splitlines() == [f"<{a}>" for a in args]


def test_args_without_script_path_are_refused() -> None:
    with pytest.raises(InvalidInput, match="args go with script_path only"):
        parse_run_shell({"command": "true", "args": ["x"]})


async def test_home_persists_for_its_workspace_and_is_in_no_snapshot(yard: Yard) -> None:
    """The home (docs/contract.md): ~/.cache/x written by one command is seen by the next of
    the same workspace, by no other workspace, and is in no snapshot, listing or diff."""
    first = await yard.run(
        'echo "$HOME $XDG_CACHE_HOME $XDG_CONFIG_HOME"; mkdir -p ~/.cache && echo kept > '
        "~/.cache/x && echo tracked > t.txt"
    )
    assert first.stdout == "/home/agent /home/agent/.cache /home/agent/.config\n"
    second = await yard.run("cat ~/.cache/x; ls -A /workspace")
    assert second.stdout == "kept\nt.txt\n"
    session, _agent = await yard.plane.store.default_owner()
    someone = await yard.plane.store.create_agent(str(session.id))
    other = await yard.plane.executions.run_shell(
        RunShellRequest(command="cat ~/.cache/x 2>&1 || echo absent", runner_id=yard.runner_id),
        agent_id=str(someone.id),
    )
    assert other.workspace_id != first.workspace_id
    assert other.stdout.endswith("absent\n")
    listing = await yard.runner.list_dir(
        first.workspace_id, second.snapshot_seq, "", True, None, 1000
    )
    names = {entry.path for entry in listing.entries}
    assert names == {"t.txt"}, names
    diff = await yard.runner.diff(first.workspace_id, 0, second.snapshot_seq, "", None, 1000)
    assert ".cache" not in diff.model_dump_json()
    with pytest.raises(NotFound):
        await yard.read_file(first.workspace_id, second.snapshot_seq, ".cache/x")
    # read-only beside the writer: the home is seen, read-only (W2)
    reader = await yard.run("cat ~/.cache/x; touch ~/y 2>&1 | head -c 200", read_only=True)
    assert reader.stdout.startswith("kept\n") and "Read-only" in reader.stdout
