"""A control plane and a runner daemon of an older protocol (runner/protocol.py
``PROTOCOL_VERSION``, runner/transport/compat.py): a start whose options the daemon would drop
(E1's env, cwd, args) is refused with the reason and runs nothing; what the old daemon does
know still runs, and an upgrade is seen at the next start.

Contract ids: E1 (the per-command options), R1 (one Runner protocol for every kind), R4 (the
direct transport)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from runner_daemon_fixture import RunnerDaemon, start_daemon

from shellyard.config import Settings
from shellyard.contract.executions import (
    ExecutionList,
    ExecutionState,
    ExecutionWait,
    RunShellRequest,
    RunShellResult,
)
from shellyard.control.plane import ControlPlane, build
from shellyard.errors import RunnerOutdated
from shellyard.runner.local import LocalRunner
from shellyard.runner.protocol import PROTOCOL_VERSION, RunnerInfo, SandboxPolicy, StartRequest

pytestmark = pytest.mark.timeout(180)

POLICY = SandboxPolicy(network="off", cancel_grace_s=1.0)


@dataclass
class OlderRunner:
    """A LocalRunner served as a daemon of protocol 1 would serve it: ``info`` announces no
    protocol (so 1), and ``start`` drops the fields version 1 does not know, as its request
    model would. Every start that reaches it is kept, to show what was (not) sent."""

    inner: LocalRunner
    announced: int = 1
    starts: list[StartRequest] = field(default_factory=list)

    async def info(self) -> RunnerInfo:
        info = await self.inner.info()
        if self.announced == 1:  # a release before the announcement sends no field at all
            return RunnerInfo.model_validate(info.model_dump(exclude={"protocol"}))
        return info.model_copy(update={"protocol": self.announced})

    async def start(self, request: StartRequest) -> Any:
        self.starts.append(request)
        if self.announced == 1:
            request = request.model_copy(update={"env": {}, "cwd": None, "args": []})
        return await self.inner.start(request)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@dataclass
class OldYard:
    plane: ControlPlane
    daemon: RunnerDaemon
    runner: OlderRunner

    async def run(self, command: str, **options: Any) -> RunShellResult:
        request = RunShellRequest(command=command, runner_id="old", **options)
        return await self.plane.executions.run_shell(request)


@pytest.fixture
async def old_yard() -> AsyncIterator[OldYard]:
    base = Path(tempfile.mkdtemp(prefix="shellyard-old-daemon-", dir="/tmp"))
    base.chmod(0o711)
    root = base / "runner"
    root.mkdir()
    older = OlderRunner(LocalRunner(root, POLICY))
    daemon = await start_daemon(root, POLICY, runner=older)  # type: ignore[arg-type]
    plane = await build(Settings(home=base / "home", local_policy=POLICY))
    try:
        await plane.runners.add_direct("old", daemon.url, daemon.token)
        yield OldYard(plane, daemon, older)
    finally:
        await plane.aclose()
        await daemon.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"cwd": "sub"}, "cwd"),
        ({"env": {"GREETING": "hi"}}, "env"),
    ],
)
async def test_options_an_old_daemon_would_drop_are_refused_and_nothing_runs(
    old_yard: OldYard, options: dict[str, Any], named: str
) -> None:
    """E1 over R1: a protocol-1 daemon would run ``cwd`` in the root and ``env`` without the
    variables; the control plane refuses the start, says to upgrade, and nothing runs."""
    made = await old_yard.run("mkdir -p sub")
    assert made.state == ExecutionState.completed, made
    with pytest.raises(RunnerOutdated) as refused:
        await old_yard.run("touch ran-anyway", **options)
    message = refused.value.message
    assert named in message and "Upgrade shellyard on that runner" in message, message
    assert refused.value.http_status == 409
    assert refused.value.details["runner_protocol"] == 1
    assert refused.value.details["needed_protocol"] == PROTOCOL_VERSION
    # Nothing reached the daemon with the option, and nothing ran: the file is not there.
    assert all(not (s.env or s.cwd or s.args) for s in old_yard.runner.starts)
    listing = await old_yard.run("ls -A; ls -A sub")
    assert listing.state == ExecutionState.completed
    assert "ran-anyway" not in listing.stdout, listing.stdout
    # The refused start has a terminal record with the same reason and freed the workspace.
    records = await old_yard.plane.executions.list(ExecutionList(limit=10))
    failed = [r for r in records if r.state == ExecutionState.failed]
    assert len(failed) == 1 and failed[0].error and "Upgrade shellyard" in failed[0].error


async def test_args_for_a_script_are_refused_by_an_old_daemon(old_yard: OldYard) -> None:
    """E1 args: the script would run without its arguments on protocol 1."""
    await old_yard.run("printf 'echo \"$#:$*\"\\n' > s.sh")
    with pytest.raises(RunnerOutdated, match="args"):
        await old_yard.plane.executions.run_shell(
            RunShellRequest(script_path="s.sh", args=["a", "b"], runner_id="old")
        )
    plain = await old_yard.plane.executions.run_shell(
        RunShellRequest(script_path="s.sh", runner_id="old")
    )
    assert plain.stdout == "0:\n", plain


async def test_what_an_old_daemon_knows_still_runs_there(old_yard: OldYard) -> None:
    """A plain command, and timeout_ms (the control plane's own cancel, E5), work on an old
    daemon: only options it would drop are refused."""
    plain = await old_yard.run("echo still")
    assert plain.state == ExecutionState.completed and plain.stdout == "still\n"
    timed = await old_yard.run("sleep 60", timeout_ms=1000, wait_ms=0)
    view = await old_yard.plane.executions.wait(timed.execution_id, ExecutionWait(timeout_s=60))
    assert view.state == ExecutionState.cancelled and view.limit == "timeout", view


async def test_an_upgraded_daemon_is_seen_at_the_next_start(old_yard: OldYard) -> None:
    """Refused on protocol 1; once the daemon announces the current protocol, the same run
    goes through with its options (the client asks again instead of trusting an old answer)."""
    await old_yard.run("mkdir -p sub")
    with pytest.raises(RunnerOutdated):
        await old_yard.run("pwd; echo $GREETING", cwd="sub", env={"GREETING": "hi"})
    old_yard.runner.announced = PROTOCOL_VERSION
    result = await old_yard.run("pwd; echo $GREETING", cwd="sub", env={"GREETING": "hi"})
    assert result.state == ExecutionState.completed, result
    assert result.stdout == "/workspace/sub\nhi\n"
