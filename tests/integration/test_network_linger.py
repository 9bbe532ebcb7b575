"""A workspace's network namespace outlives its last execution for a while (issue 13: making
and removing one cost more than the sandbox spawn), so commands run one after another join
the same one; nothing of a finished command is left in it (E8), and it is gone once the
runner closes (issue 17, docs/decisions.md)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from shellyard.config import Settings
from shellyard.contract.executions import ExecutionState, RunShellRequest
from shellyard.control.plane import build

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("nsenter") is None,
    reason="a network namespace per workspace needs root and util-linux's nsenter",
)


def _mounted(path: Path) -> bool:
    return path.exists() and os.stat(path).st_dev != os.stat(path.parent).st_dev


async def test_commands_one_after_another_share_the_namespace(home: Path) -> None:
    plane = await build(Settings(home=home / "home"))
    try:
        # A listener left behind by the first command dies with its sandbox (E8).
        first = await plane.executions.run_shell(
            RunShellRequest(
                command="readlink /proc/self/ns/net; "
                "(python3 -m http.server 8765 >/dev/null 2>&1 &) ; sleep 0.5"
            )
        )
        assert first.state == ExecutionState.completed, first.stderr
        namespace = plane.runners.get("local").root / "sandbox" / "netns" / first.workspace_id
        assert _mounted(namespace)  # still there after its only execution ended
        second = await plane.executions.run_shell(
            RunShellRequest(
                command="readlink /proc/self/ns/net; "
                "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8765), 2)'"
                " 2>/dev/null && echo reached || echo refused; python3 -c '"
                'import socket; s = socket.socket(); s.bind(("127.0.0.1", 8765)); s.listen(); '
                'socket.create_connection(("127.0.0.1", 8765), 2); print("loopback-up")\''
            )
        )
        assert second.state == ExecutionState.completed, second.stderr
        same, reach, loopback = second.stdout.split()
        assert same == first.stdout.split()[0]
        assert reach == "refused"  # the first command's listener went with its sandbox
        assert loopback == "loopback-up"  # and its port is free again
    finally:
        await plane.aclose()
    assert not _mounted(namespace)  # the runner let go of it: the home can be removed
