"""A foreground run whose sandbox is lost while it runs, through REST against a real
``shellyard serve`` (its own process and home, the local runner, bubblewrap): E7/E9.

bwrap's monitor, killed -9 from outside, records no exit code; the runner answers that the
sandbox ended without one (``lost``), which the record keeps as ``unknown`` (E9: the outcome
could not be confirmed). Unlike an ``unknown`` whose runner did not answer (a start's answer
that never came: ``tests/integration/test_env_hold_outage.py``
``test_a_foreground_run_whose_start_never_answered_answers_without_its_runner``, which checks
that no log is asked of that runner), this runner answered and holds the log, so the answer
carries the output the command printed before the loss."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from served_server import served_server

from conftest import processes_of
from shellyard.runner import processes

pytestmark = pytest.mark.timeout(180)

LINE = "printed-before-the-loss"
#: Hang guards only (a loaded host may be slow): nothing here asserts how long anything took.
GUARD_S = 90.0


def _execution_folder(home: Path) -> Path:
    """The one execution's folder once its first line is in its stdout log."""
    executions = home / "runners" / "local" / "executions"
    deadline = time.monotonic() + GUARD_S
    while time.monotonic() < deadline:
        for stdout in executions.glob("*/stdout"):
            if LINE.encode() in stdout.read_bytes():
                return stdout.parent
        time.sleep(0.05)
    raise AssertionError(f"no execution under {executions} printed {LINE!r}")


def _monitor(folder: Path) -> int:
    """bwrap's monitor: the parent of the namespace's init its status file names."""
    init = processes.read_bwrap_status(folder / "status").get("child-pid")
    assert isinstance(init, int), init
    with open(f"/proc/{init}/stat") as stat:
        parent = int(stat.read().rsplit(")", 1)[1].split()[1])
    with open(f"/proc/{parent}/cmdline", "rb") as cmdline:
        assert cmdline.read().split(b"\0")[0].endswith(b"bwrap"), parent
    return parent


def test_a_foreground_run_whose_sandbox_was_lost_answers_unknown_with_its_output() -> None:
    """E7/E9: ``echo``, then ``sleep``; once the line is in the log, bwrap's monitor is
    killed -9. The foreground POST answers ``unknown`` with the runner's reason and with the
    line in ``stdout`` (it was answered without its output: ``_respond`` skipped every
    ``unknown``); nothing of the sandbox is left running (the sleep went with it, E7)."""
    with served_server() as served:
        answer: dict[str, Any] = {}

        def post() -> None:
            response = httpx.post(
                f"{served.url}/v1/executions",
                json={"command": f"echo {LINE}; sleep 120", "wait_ms": 30_000},
                headers=served.session,
                timeout=GUARD_S,
            )
            answer.update(response.json(), status=response.status_code)

        caller = threading.Thread(target=post, daemon=True)
        caller.start()
        folder = _execution_folder(served.home)
        assert processes_of(folder.name)  # the sleep runs
        os.kill(_monitor(folder), signal.SIGKILL)
        caller.join(GUARD_S)
        assert not caller.is_alive(), "the foreground run never answered"
        assert answer["status"] == 200, answer
        assert answer["execution_id"] == folder.name, answer
        assert answer["state"] == "unknown", answer
        assert answer["exit_code"] is None, answer
        assert "without recording an exit code" in (answer["error"] or ""), answer
        assert LINE in answer["stdout"], answer
        # E7: nothing of the sandbox runs on (its init, a zombie of the host's pid 1 now
        # that its parent is gone, reads no environment)
        assert processes_of(folder.name) == []
        view = httpx.get(
            f"{served.url}/v1/executions/{folder.name}", headers=served.session, timeout=GUARD_S
        ).json()
        assert view["state"] == "unknown" and view["finished_at"] is not None, view
