"""Executions end to end through the control plane, on a local and a direct runner.

Contract ids: E1–E12, W1, W3, R1. Every test drives real bubblewrap sandboxes."""

from __future__ import annotations

import asyncio
import time

import pytest

from conftest import Yard, processes_of
from shellyard.contract.executions import (
    ExecutionCancelQuery,
    ExecutionList,
    ExecutionLogsQuery,
    ExecutionState,
    ExecutionWait,
    RunShellRequest,
    parse_run_shell,
)
from shellyard.errors import InvalidInput, NotFound, WorkspaceBusy

# R1: the same suite against local, direct and ssh runners.
pytestmark = pytest.mark.runner_kinds("local", "direct", "ssh")


async def test_foreground_result_has_state_exit_code_and_output(yard: Yard) -> None:
    """E1, E3: a foreground command returns its state, exit code and output."""
    result = await yard.run("echo out; echo err >&2; exit 7")
    assert result.state == ExecutionState.completed
    assert result.exit_code == 7
    assert result.stdout == "out\n"
    assert result.stderr == "err\n"
    assert result.snapshot_seq is not None
    assert result.environment_revision is None


async def test_each_execution_is_a_fresh_process_at_the_root(yard: Yard) -> None:
    """E2: no working directory, variable or shell state carries over; every execution
    starts at /workspace (PWD too); HOME is the workspace's home, /home/agent (R2)."""
    first = await yard.run("mkdir -p sub && cd sub && export CARRIED=yes && pwd")
    assert first.stdout == "/workspace/sub\n"
    second = await yard.run('pwd; echo "carried=${CARRIED:-}"; echo "home=$HOME pwd=$PWD"')
    assert second.stdout.splitlines() == [
        "/workspace",
        "carried=",
        "home=/home/agent pwd=/workspace",
    ]


async def test_wait_budget_returns_running_id_and_command_completes(yard: Yard) -> None:
    """E3: wait_ms is a response budget, not a timeout."""
    started = time.monotonic()
    result = await yard.run("sleep 2; echo finished > done.txt; echo late", wait_ms=200)
    assert time.monotonic() - started < 1.8
    assert result.state == ExecutionState.running
    assert result.exit_code is None
    view = await yard.plane.executions.wait(result.execution_id, ExecutionWait(timeout_s=30))
    assert view.state == ExecutionState.completed and view.exit_code == 0
    logs = await yard.plane.executions.logs(result.execution_id, ExecutionLogsQuery())
    assert logs.data == "late\n" and logs.complete
    content = await yard.read_file(view.workspace_id, view.snapshot_seq, "done.txt")
    assert content == b"finished\n"


async def test_background_returns_at_acceptance(yard: Yard) -> None:
    """E4: background returns as soon as the execution is accepted."""
    result = await yard.run("sleep 1; echo bg", background=True)
    assert result.state in (ExecutionState.running, ExecutionState.queued)
    assert result.stdout == ""
    view = await yard.plane.executions.wait(result.execution_id, ExecutionWait(timeout_s=30))
    assert view.state == ExecutionState.completed


async def test_leftover_processes_are_killed_when_main_exits(yard: Yard) -> None:
    """E8: the main process exits; what it left behind in its sandbox is killed before the
    record turns terminal, and the snapshot is committed."""
    result = await yard.run("(sleep 300 &); (setsid sleep 301 &); echo left > f.txt", wait_ms=20000)
    assert result.state == ExecutionState.completed
    assert processes_of(result.execution_id) == []
    assert await yard.read_file(result.workspace_id, result.snapshot_seq, "f.txt") == b"left\n"


async def test_cancel_kills_double_forked_daemon_ignoring_sigterm(yard: Yard) -> None:
    """E7: SIGTERM to the group, then the whole pid namespace; cancelled only after every
    process is gone and the snapshot is committed."""
    script = (
        "echo before > marker.txt; "
        'bash -c \'setsid bash -c "trap \\"\\" TERM; while true; do sleep 0.2; done" &\' ; '
        "trap '' TERM; while true; do sleep 0.2; done"
    )
    result = await yard.run(script, wait_ms=1000)
    assert result.state == ExecutionState.running
    await asyncio.sleep(0.5)
    assert len(processes_of(result.execution_id)) >= 4
    view = await yard.plane.executions.cancel(result.execution_id, ExecutionCancelQuery(wait_s=20))
    assert view.state == ExecutionState.cancelled
    assert view.exit_code is None
    assert processes_of(result.execution_id) == []
    assert view.snapshot_seq is not None
    saved = await yard.read_file(view.workspace_id, view.snapshot_seq, "marker.txt")
    assert saved == b"before\n"
    again = await yard.plane.executions.cancel(result.execution_id, ExecutionCancelQuery())
    assert again == view  # E7: a finished execution comes back unchanged


async def test_cancel_sends_sigterm_to_the_command_first(yard: Yard) -> None:
    """E7: the command gets SIGTERM and may clean up before anything is killed: its
    handler's file is in the committed snapshot."""
    script = (
        "trap 'echo cleaned > cleanup.txt; exit 0' TERM; echo ready; while true; do sleep 0.1; done"
    )
    result = await yard.run(script, wait_ms=1000)
    assert result.state == ExecutionState.running
    view = await yard.plane.executions.cancel(result.execution_id, ExecutionCancelQuery(wait_s=20))
    assert view.state == ExecutionState.cancelled
    assert view.snapshot_seq is not None
    saved = await yard.read_file(view.workspace_id, view.snapshot_seq, "cleanup.txt")
    assert saved == b"cleaned\n"


async def test_second_writer_refused_naming_holder_then_queued(yard: Yard) -> None:
    """W1: a second writer is refused with the holder named; with queue it runs after."""
    first = await yard.run("sleep 1.5; echo one >> order.txt", background=True)
    with pytest.raises(WorkspaceBusy) as refused:
        await yard.run("echo two >> order.txt", wait_ms=0)
    assert first.execution_id in refused.value.message
    listed = [v.execution_id for v in await yard.plane.executions.list(ExecutionList())]
    assert listed == [first.execution_id]  # the refusal recorded nothing
    second = await yard.run("echo two >> order.txt", queue=True, wait_ms=0)
    assert second.state == ExecutionState.queued
    view = await yard.plane.executions.wait(second.execution_id, ExecutionWait(timeout_s=30))
    assert view.state == ExecutionState.completed
    order = await yard.read_file(view.workspace_id, view.snapshot_seq, "order.txt")
    assert order == b"one\ntwo\n"


async def test_idempotency_key_never_starts_a_second_process(yard: Yard) -> None:
    """E10: a retried submission with the same key returns the same execution."""
    first = await yard.run("echo run >> runs.txt; sleep 0.5", idempotency_key="call-1", wait_ms=0)
    again = await yard.run("echo run >> runs.txt; sleep 0.5", idempotency_key="call-1")
    assert again.execution_id == first.execution_id
    assert again.state == ExecutionState.completed
    runs = await yard.read_file(again.workspace_id, again.snapshot_seq, "runs.txt")
    assert runs == b"run\n"


async def test_inline_output_is_capped_with_head_tail_and_marker(yard: Yard) -> None:
    """E12: head and tail kept with a marker saying how much was left out."""
    result = await yard.run(
        "printf 'HEAD'; head -c 100000 /dev/zero | tr '\\0' x; printf 'TAIL'",
        max_output_length=1000,
    )
    assert result.output_truncated
    assert len(result.stdout) <= 1000 + 200
    assert result.stdout.startswith("HEAD") and result.stdout.endswith("TAIL")
    assert "characters omitted" in result.stdout
    full = await yard.plane.executions.logs(result.execution_id, ExecutionLogsQuery(tail=4))
    assert full.data == "TAIL" and full.size == 100008


async def test_logs_page_with_offsets_and_tail(yard: Yard) -> None:
    """E6: per stream, byte offset and limit, next_offset, tail."""
    result = await yard.run("seq 1 20000; seq 1 3 >&2")
    assert result.state == ExecutionState.completed
    collected, offset = [], 0
    while True:
        page = await yard.plane.executions.logs(
            result.execution_id, ExecutionLogsQuery(stream="stdout", offset=offset, limit=10_000)
        )
        collected.append(page.data)
        offset = page.next_offset
        if page.complete:
            break
    text = "".join(collected)
    assert text == "".join(f"{n}\n" for n in range(1, 20001))
    err = await yard.plane.executions.logs(result.execution_id, ExecutionLogsQuery(stream="stderr"))
    assert err.data == "1\n2\n3\n" and err.complete


async def test_script_path_by_shebang_and_extension(yard: Yard) -> None:
    """E1: script_path runs by its shebang, else by extension."""
    await yard.run(
        "printf '#!/bin/sh\\necho shebang $0\\n' > s.run; "
        "printf 'import sys\\nprint(\"py\", sys.version_info[0])\\n' > a.py; "
        "printf 'echo sh-ext\\n' > b.sh"
    )
    assert (await yard.run(script_path="a.py")).stdout == "py 3\n"
    assert (await yard.run(script_path="b.sh")).stdout == "sh-ext\n"
    shebang = await yard.run(script_path="s.run")
    assert shebang.stdout.startswith("shebang ") and shebang.stdout.strip().endswith("s.run")


async def test_bad_input_is_refused_clearly_and_records_nothing(yard: Yard) -> None:
    """E1: both/neither of command and script_path, wait_ms out of range, a missing script,
    an unknown execution id: each a clear error, nothing recorded half-way."""
    with pytest.raises(InvalidInput, match="exactly one of 'command'"):
        parse_run_shell({"command": "true", "script_path": "x.sh"})
    with pytest.raises(InvalidInput, match="exactly one of 'command'"):
        parse_run_shell({})
    with pytest.raises(InvalidInput, match="wait_ms must be between 0 and 30000"):
        parse_run_shell({"command": "true", "wait_ms": 30001})
    with pytest.raises(InvalidInput, match="wait_ms"):
        parse_run_shell({"command": "true", "wait_ms": -1})
    with pytest.raises(NotFound, match=r"script_path 'missing\.py' is not a file"):
        await yard.run(script_path="missing.py")
    with pytest.raises(InvalidInput, match="absolute"):
        await yard.run(script_path="/etc/passwd")
    with pytest.raises(NotFound, match="no execution 'ex_nope'"):
        await yard.plane.executions.status("ex_nope")
    with pytest.raises(NotFound):
        await yard.plane.executions.logs("ex_nope", ExecutionLogsQuery())
    with pytest.raises(NotFound):
        await yard.plane.executions.cancel("ex_nope", ExecutionCancelQuery())
    assert await yard.plane.executions.list(ExecutionList()) == []
    assert RunShellRequest(command="true").wait_ms == 10000


async def test_snapshot_numbers_grow_and_old_state_stays_readable(yard: Yard) -> None:
    """W3: every execution ends with a commit; numbers only grow; old snapshots readable."""
    one = await yard.run("echo v1 > f.txt")
    two = await yard.run("echo v2 > f.txt")
    same = await yard.run("cat f.txt")
    assert one.snapshot_seq is not None and two.snapshot_seq is not None
    assert two.snapshot_seq > one.snapshot_seq
    assert same.snapshot_seq == two.snapshot_seq  # nothing changed: the head is reused
    assert await yard.read_file(one.workspace_id, one.snapshot_seq, "f.txt") == b"v1\n"
    assert await yard.read_file(two.workspace_id, two.snapshot_seq, "f.txt") == b"v2\n"
    history = await yard.plane.store.list_snapshots(one.workspace_id)
    assert [h.made_by_id for h in history if h.seq > 0] == [
        one.execution_id,
        two.execution_id,
    ]
