"""The first minute of a new user (issue 13): a private home simply works, and a server that
cannot start says why at once, with its own message, through every door that starts it: the
CLI, ``shellyard mcp`` (an error answer to the host's ``initialize``) and ``Client.for_home()``.

"At once" is checked by what the door did, never by a clock: its answer is the server's own
report (the start pipe's, home.py ``ensure_server``), not its start timeout's words; the
server was started once (its log holds one failure line: a door that tried again, or polled
a new start, would have logged it again); and no server is left. The doors are given a start
timeout of :data:`START_GUARD_S` (a hang guard only, far above any start): a door that waited
for its timeout, as before, answers with :data:`TIMED_OUT` and fails the test.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

from shellyard.errors import ShellyardError
from shellyard.home import LOG_NAME, is_served, read_info

#: The failed starts' start timeout (SHELLYARD_START_TIMEOUT_S): a hang guard, far above
#: any start, below the test's own timeout; nothing measures how long the door took.
START_GUARD_S = 120
#: The door's words when its start timeout ran out (home.py ``ensure_server``).
TIMED_OUT = "did not come up within"
NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "SHELLYARD_HOME": str(home), "SHELLYARD_START_TIMEOUT_S": "600"}
    env.pop("SHELLYARD_DATABASE_URL", None)
    env.update(extra)
    return env


def _stop(home: Path) -> None:
    info = read_info(home)
    if info is not None and is_served(home):
        os.kill(info.pid, signal.SIGTERM)
        for _ in range(200):
            if not is_served(home):
                return
            time.sleep(0.05)


@pytest.fixture
def private_home(tmp_path: Path) -> Iterator[Path]:
    """A 0700 home below pytest's own 0700 folder, as ``mktemp -d`` or ``tmp_path`` make it."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    yield home
    _stop(home)


def test_a_private_home_just_works(private_home: Path) -> None:
    """R2 with a 0700 home: the sandbox uid gets through, and nobody else was let in."""
    done = subprocess.run(
        [sys.executable, "-m", "shellyard", "run", "--", "echo", "hi"],
        env=_env(private_home),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "hi\n"
    for folder in (private_home, private_home.parent.parent):  # the home and pytest's folder
        assert not folder.stat().st_mode & stat.S_IXOTH, f"{folder} was opened to everyone"
    # A second command on the running server, and after a restart of the server.
    _stop(private_home)
    again = subprocess.run(
        [sys.executable, "-m", "shellyard", "run", "--", "pwd"],
        env=_env(private_home),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert again.returncode == 0, again.stderr


def _can_run_as_nobody() -> bool:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return False
    probe = subprocess.run(
        [*AS_NOBODY, "env", sys.executable, "-c", "import shellyard"],
        capture_output=True,
    )
    return probe.returncode == 0


@pytest.mark.skipif(
    not _can_run_as_nobody(),
    reason="needs root to switch to an unprivileged user, and a Python interpreter and "
    "checkout that user can execute (here the interpreter lives under a 0700 folder)",
)
def test_a_non_root_users_private_default_home_works() -> None:
    """~/.shellyard of an unprivileged user, in a 0700 home folder: the sandbox runs as that
    user (in its own user namespace), who reaches its own folders."""
    base = Path(tempfile.mkdtemp(prefix="shellyard-user-"))
    try:
        base.chmod(0o755)  # like /home: the user's own folder below is the private one
        user_home = base / "user"
        user_home.mkdir(mode=0o700)
        os.chown(user_home, NOBODY, NOBODY)
        env = {k: v for k, v in _env(user_home).items() if k != "SHELLYARD_HOME"}
        env["HOME"] = str(user_home)
        try:
            done = subprocess.run(
                [*AS_NOBODY, sys.executable, "-m", "shellyard", "run", "--", "echo", "hi"],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert done.returncode == 0, done.stderr
            assert done.stdout == "hi\n"
            assert (user_home / ".shellyard" / "shellyard.db").exists()
        finally:
            _stop(user_home / ".shellyard")
    finally:
        shutil.rmtree(base, ignore_errors=True)


# ---------------------------------------------------------------------- failed starts


@dataclass
class FailedStart:
    name: str
    home: Path
    env: dict[str, str]
    #: A piece of the server's own message that every door must show.
    message: str
    #: Whether a server process is started at all (an unusable home is refused before).
    spawns: bool = True


def _failing_env(home: Path, **extra: str) -> dict[str, str]:
    return _env(home, SHELLYARD_START_TIMEOUT_S=str(START_GUARD_S), **extra)


@pytest.fixture(params=["bad database url", "port taken", "missing bwrap", "unusable home"])
def failed_start(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FailedStart]:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    case: str = request.param
    with contextlib.ExitStack() as stack:
        if case == "bad database url":
            yield FailedStart(
                case,
                home,
                _failing_env(home, SHELLYARD_DATABASE_URL="nosuchdb://x"),
                "unsupported database URL 'nosuchdb://x'",
            )
        elif case == "port taken":
            taken = stack.enter_context(socket.socket())
            taken.bind(("127.0.0.1", 0))
            taken.listen(1)
            port = taken.getsockname()[1]
            yield FailedStart(
                case,
                home,
                _failing_env(home, SHELLYARD_PORT=str(port)),
                f"cannot listen on 127.0.0.1:{port}: Address already in use",
            )
        elif case == "missing bwrap":
            empty = tmp_path / "bin"
            empty.mkdir()
            yield FailedStart(
                case,
                home,
                _failing_env(home, PATH=str(empty)),
                "bubblewrap (bwrap) is not installed",
            )
        else:
            if subprocess.run(["chattr", "+i", str(home)], capture_output=True).returncode:
                pytest.skip("needs chattr +i (root on a file system with the immutable flag)")
            stack.callback(subprocess.run, ["chattr", "-i", str(home)])
            yield FailedStart(
                case,
                home,
                _failing_env(home),
                f"cannot use {home} as the shellyard home",
                spawns=False,
            )
        _stop(home)


def _assert_prompt(case: FailedStart, answer: str) -> None:
    """The door answered with the server's own report, not at its start timeout, after one
    start (the server's log says the failure once), and left no server running."""
    answer = " ".join(answer.split())
    assert TIMED_OUT not in answer, f"{case.name}: the door waited for its timeout: {answer}"
    if not case.spawns:
        return
    assert "could not start: " in answer, f"{case.name}: not the server's report: {answer}"
    # Each start's last word is its one failure line (cli/exits.py), the traceback before it
    log = (case.home / LOG_NAME).read_text(errors="replace")
    ends = [line for line in log.splitlines() if line.startswith("error (")]
    assert len(ends) == 1, f"{case.name}: not started exactly once: {log}"
    assert case.message in ends[0], f"{case.name}: {ends[0]}"
    assert not is_served(case.home)


def test_failed_start_through_the_cli(failed_start: FailedStart) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "shellyard", "run", "--", "true"],
        env=failed_start.env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2, done.stderr
    assert failed_start.message in " ".join(done.stderr.split()), done.stderr
    _assert_prompt(failed_start, done.stderr)


def _mcp_error(exc: BaseException) -> MCPError | None:
    """The MCPError in what the client raised (anyio's task groups wrap it in a group)."""
    if isinstance(exc, MCPError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _mcp_error(inner)
            if found is not None:
                return found
    return None


async def test_failed_start_through_shellyard_mcp(failed_start: FailedStart) -> None:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "shellyard", "mcp"], env=failed_start.env
    )
    refused: MCPError | None = None
    with open(failed_start.home.parent / "mcp.stderr", "w+") as errlog:
        try:
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
        except BaseException as exc:
            refused = _mcp_error(exc)
            if refused is None:
                raise
        errlog.seek(0)
        stderr = errlog.read()
    # What the host shows: the error answer to initialize, and the same line on stderr.
    assert refused is not None, "initialize succeeded on a home whose server cannot start"
    assert failed_start.message in refused.error.message
    assert failed_start.message in " ".join(stderr.split()), stderr
    _assert_prompt(failed_start, refused.error.message)


def test_failed_start_through_client_for_home(
    failed_start: FailedStart, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shellyard import Client

    for key in ("SHELLYARD_DATABASE_URL", "SHELLYARD_PORT", "PATH"):
        if key in failed_start.env:
            monkeypatch.setenv(key, failed_start.env[key])
    monkeypatch.setenv("SHELLYARD_START_TIMEOUT_S", failed_start.env["SHELLYARD_START_TIMEOUT_S"])
    with pytest.raises(ShellyardError) as refused:
        Client.for_home(failed_start.home)
    assert failed_start.message in refused.value.message
    _assert_prompt(failed_start, refused.value.message)


# ---------------------------------------------------------------------- a quiet stdio server


async def _mcp_stderr(home: Path, calls: int, *args: str) -> list[str]:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "shellyard", "mcp", *args], env=_env(home)
    )
    with open(home.parent / f"mcp{len(args)}.stderr", "w+") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            for n in range(calls):
                result = await session.call_tool("run_shell", {"command": f"echo {n}"})
                assert not result.is_error, result.content
        errlog.seek(0)
        return [line for line in errlog.read().splitlines() if line.strip()]


async def test_shellyard_mcp_stderr_stays_quiet(private_home: Path) -> None:
    """Agent hosts keep a server's stderr: 20 tool calls write nothing there by default;
    --log-level info brings the request log back."""
    quiet = await _mcp_stderr(private_home, 20)
    assert quiet == [], quiet
    chatty = await _mcp_stderr(private_home, 2, "--log-level", "info")
    assert any("HTTP Request" in line for line in chatty), chatty
