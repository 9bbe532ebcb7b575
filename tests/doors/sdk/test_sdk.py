"""The Python SDK (issue 6 item 4): ``from shellyard import Client, AsyncClient``, typed results
across the API, and log following that stays in bounded memory (E4: logs are paged by offset).

The server runs in its own process (started on demand, as ``Client.for_home`` does for a user)
so the test process's peak memory is the client's alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from proc_memory import peak_resident, reset_peak, resident

from shellyard import AsyncClient, Client
from shellyard.contract.executions import ExecutionState, ExecutionView, LogsResult
from shellyard.contract.files import DirListing, EditView
from shellyard.contract.sessions import SessionView, TimerView
from shellyard.errors import InvalidInput, NotFound, Unauthorized
from shellyard.home import read_info
from shellyard.sdk.client import RunnerView

#: 20 bursts of 10 MB of "y\n", with pauses: the follower catches up and waits many times.
BURSTS, BURST = 20, 10_000_000
TOTAL = BURSTS * BURST
PRODUCER = f"for i in $(seq {BURSTS}); do yes | head -c {BURST}; sleep 0.1; done"
#: Far below the 200 MB followed: the follower may hold a few chunks, never the log. The
#: allocator keeps freed 1 MiB buffers around (glibc raises its mmap threshold after the first
#: frees), which alone was measured at 48 MiB of peak growth after other tests had run.
RSS_GROWTH_LIMIT = 64 << 20
PATTERN = b"y\n" * (1 << 20)


class _Checker:
    """Counts the followed bytes and checks each chunk continues the ``y\\n`` pattern."""

    def __init__(self) -> None:
        self.total = 0
        self.chunks = 0

    def add(self, chunk: bytes) -> None:
        assert 0 < len(chunk) <= 1 << 20
        start = self.total % 2
        assert chunk == PATTERN[start : start + len(chunk)], f"bad content at {self.total}"
        self.total += len(chunk)
        self.chunks += 1


def test_package_exports_the_clients_lazily() -> None:
    """``import shellyard`` does not import httpx (the runner daemon imports the package)."""
    code = "import sys, shellyard; assert 'httpx' not in sys.modules; print(shellyard.Client)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "shellyard.sdk.client.Client" in done.stdout


def test_follow_logs_to_the_end_in_bounded_memory(served_home: Path) -> None:
    """E4 + issue 6: ``follow_logs`` follows a running command printing 200 MB to its end;
    every byte arrives in order, and the client's peak memory grows far less than that."""
    with Client.for_home(served_home) as client:
        run = client.run(PRODUCER, background=True)
        assert run.state in (ExecutionState.queued, ExecutionState.running)
        checker = _Checker()
        reset_peak()
        base = resident()
        for chunk in client.follow_logs(run.execution_id, chunk=1 << 20, poll_s=0.2):
            checker.add(chunk)
        growth = peak_resident() - base
        assert checker.total == TOTAL
        assert checker.chunks >= TOTAL >> 20
        assert growth < RSS_GROWTH_LIMIT, f"peak RSS grew {growth >> 20} MiB"
        final = client.status(run.execution_id)
        assert final.state == ExecutionState.completed and final.exit_code == 0


async def test_async_follow_logs_to_the_end_in_bounded_memory(served_home: Path) -> None:
    """The same with ``async for`` on ``AsyncClient``; stderr is followed too."""
    async with AsyncClient.for_home(served_home) as client:
        run = await client.run(PRODUCER + "; echo done >&2", background=True)
        checker = _Checker()
        reset_peak()
        base = resident()
        async for chunk in client.follow_logs(run.execution_id, chunk=1 << 20, poll_s=0.2):
            checker.add(chunk)
        growth = peak_resident() - base
        assert checker.total == TOTAL
        assert growth < RSS_GROWTH_LIMIT, f"peak RSS grew {growth >> 20} MiB"
        errors = [c async for c in client.follow_logs(run.execution_id, "stderr")]
        assert b"".join(errors) == b"done\n"


def test_follow_logs_from_an_offset_of_a_finished_execution(served_home: Path) -> None:
    """Following a finished execution from an offset yields the rest and ends at once."""
    with Client.for_home(served_home) as client:
        run = client.run("printf 'hello world'", wait_ms=20_000)
        assert run.state == ExecutionState.completed
        rest = b"".join(client.follow_logs(run.execution_id, offset=6, chunk=2))
        assert rest == b"world"


def test_typed_calls_across_the_api(served_home: Path) -> None:
    """A few calls in each area come back as their models; errors as their classes."""
    with Client.for_home(served_home) as client:
        run = client.run("mkdir -p out && echo result > out/r.txt", wait_ms=20_000)
        assert run.exit_code == 0
        view = client.wait(run.execution_id, 1)
        assert isinstance(view, ExecutionView) and view.snapshot_seq is not None
        page = client.logs(run.execution_id)
        assert isinstance(page, LogsResult) and page.complete
        assert any(v.execution_id == run.execution_id for v in client.list())

        listing = client.list_files("out")
        assert isinstance(listing, DirListing)
        assert [e.path for e in listing.entries] == ["out/r.txt"]
        assert b"".join(client.iter_file("out/r.txt")) == b"result\n"
        edit = client.write_file("out/w.txt", b"written")
        assert isinstance(edit, EditView)
        assert client.read_text("out/w.txt").data == "written"

        session = client.create_session()
        assert isinstance(session, SessionView)
        assert client.session(session.session_id).session_id == session.session_id
        timer = client.as_agent(session.main_agent_id).timer_create("check", after_ms=600_000)
        assert isinstance(timer, TimerView) and timer.state == "pending"

        runners = client.runners()
        assert [r.runner_id for r in runners] == ["local"]
        assert all(isinstance(r, RunnerView) for r in runners)

        with pytest.raises(NotFound, match="ex_nope"):
            client.status("ex_nope")
        with pytest.raises(InvalidInput):
            client.logs(run.execution_id, stream="both")


async def test_async_typed_calls(served_home: Path) -> None:
    async with AsyncClient.for_home(served_home) as client:
        run = await client.run("echo hi", wait_ms=20_000)
        assert (await client.status(run.execution_id)).exit_code == 0
        sessions = await client.sessions()
        assert all(isinstance(s, SessionView) for s in sessions)
        transfers = await client.transfers()
        assert transfers == []
        with pytest.raises(NotFound):
            await client.timer_get("tm_nope")


def test_tokens_through_the_sdk(served_home: Path) -> None:
    """§3 security through the SDK: an agent token made with the admin client acts as that
    agent only, and is refused from the request after its revocation."""
    with Client.for_home(served_home) as admin:
        session = admin.create_session()
        made = admin.token_create("agent", agent_id=session.main_agent_id)
        assert made.kind == "agent" and made.token.startswith("sy_")
        assert made.token_id in {t.token_id for t in admin.token_list()}
        url = admin_url(served_home)
        with Client(url, made.token) as agent:
            ran = agent.run("echo scoped", wait_ms=20_000)
            assert ran.stdout == "scoped\n"
            assert [v.execution_id for v in agent.list()] == [ran.execution_id]
        assert admin.token_revoke(made.token_id).revoked_at is not None
        with Client(url, made.token) as agent, pytest.raises(Unauthorized):
            agent.list()


def admin_url(home: Path) -> str:
    info = read_info(home)
    assert info is not None
    return info.url
