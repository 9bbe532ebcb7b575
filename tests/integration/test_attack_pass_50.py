"""Attack pass of session 50 (second engineer) on the fixes of session 50: the holders of an
environment (store/environments.py ``_holders``, V5), the SDK's and ``shellyard run``'s reading
of an answer (sdk/answer_clock.py, sdk/base.py ``parse``, cli/entry.py), the pidfd fallbacks
(runner/prefix_mounts.py, runner/environments/tools.py) and the groups used again
(runner/limits/recycle.py) (docs/security.md "Attack pass (session 50)").

The hostile servers are real loopback sockets answering with the raw bytes each attack needs.
Each test says whether it is a finding (fixed here) or a property that held."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import resource
import socket
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter
from sdk_paths import Handler, on_every_path, port_of, serving, wakes_on_both

from shellyard.cli import entry
from shellyard.cli.exits import exit_code_of
from shellyard.errors import AnswerLost, RunnerUnavailable, ShellyardError
from shellyard.home import INFO_NAME, LOCK_NAME
from shellyard.runner.environments.tools import SandboxedTools
from shellyard.runner.prefix_mounts import PrefixMounts
from shellyard.runner.protocol import SandboxPolicy
from shellyard.runner.sandbox.spawn import Sandboxes
from shellyard.sdk.base import call

pytestmark = pytest.mark.timeout(120)

ANY = TypeAdapter(dict[str, Any])


def _answering(body: bytes) -> Handler:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = f"HTTP/1.1 200 OK\r\ncontent-length: {len(body)}\r\n\r\n".encode()
        writer.write(head + body)
        await writer.drain()

    return answer


@contextlib.contextmanager
def served_home(home: Path, url: str) -> Any:
    """A home whose server (the lock held, its info written) is the loopback one at ``url``:
    what ``shellyard run``'s fast path reads before it posts."""
    home.mkdir(parents=True, exist_ok=True)
    info = {"pid": os.getpid(), "url": url, "token": "tok"}
    (home / INFO_NAME).write_text(json.dumps(info))
    fd = os.open(home / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    "body",
    [
        b"<html><body>502 Bad Gateway</body></html>",
        b"[1, 2]",
        b'"text"',
        b"{}",
        b'{"state": "running"}',
        b'{"state": ["completed"]}',
        b"\x1b]0;owned\x07\x1b[2J" + b"x" * 4096,
        b'{"state": "completed", "stdout": 5}',
        b'{"state": "completed", "exit_code": "0"}',
        b"[" * 100_000,
    ],
)
async def test_the_fast_run_path_names_an_answer_it_cannot_read(
    body: bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Finding (fixed): ``shellyard run``'s fast path (cli/entry.py) decoded a successful
    answer with ``json.loads`` and read it as a dict: a proxy's HTML page ended in a
    JSONDecodeError's traceback, a JSON list or string in an AttributeError's, ``{}`` in a
    KeyError's, ``{"state": "running"}`` (not final: handed to the SDK to follow) in pydantic's
    ValidationError, and ``{"state": [..]}`` in a TypeError's. Now each is the SDK's error for
    an answer it cannot read (sdk/base.py ``not_understood``): one line on stderr naming the
    first 80 bytes with their control codes escaped, exit code 2."""
    async with serving(_answering(body)) as url:
        with served_home(tmp_path / "home", url):
            code = await asyncio.to_thread(
                entry.quick_run, ["run", "--home", str(tmp_path / "home"), "--", "true"]
            )
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error (internal): the control plane's answer "), err
    assert "Traceback" not in err and "\x1b" not in err and "\x07" not in err
    assert len(err) < 1000, err  # the first 80 bytes, not the whole answer


async def test_a_post_whose_answer_never_began_is_an_answer_lost() -> None:
    """Finding (fixed): a POST sent whole to a server that then said nothing for the whole
    timeout (it may have started the command: a store that blocks, a server stopped after it
    read the request) was "cannot reach the control plane ... retry", exit code 75, on
    ``shellyard run``'s fast path; a script following 75 ran the command twice. The server
    was reached and the request went whole: now it is ``AnswerLost`` (exit code 124) as an
    answer cut later by the clock is; a connection refused is still 75's "cannot reach"."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(5)

    async with serving(silent) as url:
        request = b"POST /v1/executions HTTP/1.1\r\ncontent-length: 0\r\n\r\n"
        with pytest.raises(ShellyardError) as lost:
            await asyncio.to_thread(entry._exchange, "127.0.0.1", port_of(url), request, 0.5)
    assert isinstance(lost.value, AnswerLost), lost.value
    assert "may have acted on this POST" in str(lost.value)
    assert exit_code_of(lost.value) == 124


async def test_a_post_whose_answer_never_began_is_an_answer_lost_on_every_sdk_path() -> None:
    """Finding (fixed): the SDK's three paths (lean, async httpx, blocking) made the same
    silence after a POST sent whole "cannot reach the control plane ... retry"
    (RunnerUnavailable, 75); now ``AnswerLost`` there too. A GET's silence stays retryable."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(5)

    async with serving(silent) as url:
        posts = await on_every_path(url, call("POST", "/v1/executions", ANY, timeout_s=0.5))
        gets = await on_every_path(url, call("GET", "/v1/x", ANY, timeout_s=0.5))
    for outcome in posts:
        assert isinstance(outcome, AnswerLost), outcome
        assert exit_code_of(outcome) == 124, outcome
    for outcome in gets:
        assert isinstance(outcome, RunnerUnavailable), outcome
        assert not isinstance(outcome, AnswerLost) and exit_code_of(outcome) == 75, outcome


@pytest.mark.parametrize("data", [b"<html>", b'{"seq": "x"}', b"[" * 100_000])
async def test_a_wake_it_cannot_read_is_the_sdks_error(data: bytes) -> None:
    """Finding (fixed): the wake stream's events were read with ``json.loads`` then
    ``WakeView.model_validate``: an event that was not JSON gave a JSONDecodeError, one of
    another shape pydantic's ValidationError (its documentation link, every missing field),
    a deep nest a RecursionError, on the blocking and async clients. Now each is the SDK's
    error for an answer it cannot read (sdk/base.py ``parse``), naming its first 80 bytes."""

    async def one_wake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        event = b"event: wake\ndata: " + data + b"\n\n"
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        writer.write(head + f"content-length: {len(event)}\r\n\r\n".encode() + event)
        await writer.drain()

    async with serving(one_wake) as url:
        outcomes = await wakes_on_both(url)
    for outcome in outcomes:
        assert type(outcome) is ShellyardError, repr(outcome)
        assert "the control plane's answer is not" in str(outcome), outcome
        assert len(str(outcome)) < 1000, outcome


async def test_a_deep_nest_is_an_answer_the_sdk_cannot_read_on_every_path() -> None:
    """Finding (fixed): ``parse`` (sdk/base.py) fell back to Python's ``json`` for an answer
    pydantic's parser called invalid JSON (for names that are not UTF-8), and ``json`` met
    100,000 ``[`` with a RecursionError, raised as such on every SDK path. Now it is the
    SDK's "is not JSON" error naming the first 80 bytes."""
    async with serving(_answering(b"[" * 100_000)) as url:
        outcomes = await on_every_path(url, call("GET", "/v1/x", ANY))
    for outcome in outcomes:
        assert type(outcome) is ShellyardError, repr(outcome)
        assert "the control plane's answer is not JSON" in str(outcome), outcome


async def test_a_wrong_answer_names_its_problems_in_a_bounded_message() -> None:
    """Finding (fixed): ``not_understood`` named pydantic's first three problems with their
    locations, and a location holds the answer's own keys (a ``dict[str, str]`` field, as
    ``env`` or a batch's ``errors``): an answer with a 1 MiB key made a 1 MiB error message
    (on a terminal, a screenful per line of a log). Now the problems are cut to a few hundred
    characters, as the answer's own bytes are to 80."""
    key = "\x1b[2J" + "k" * (1 << 20)
    body = json.dumps({key: 5}).encode()
    async with serving(_answering(body)) as url:
        outcomes = await on_every_path(url, call("GET", "/v1/x", TypeAdapter(dict[str, str])))
    for outcome in outcomes:
        assert type(outcome) is ShellyardError, repr(outcome)
        assert "is not what the SDK expects" in str(outcome), str(outcome)[:300]
        assert len(str(outcome)) < 1000 and "\x1b" not in str(outcome), str(outcome)[:300]


@contextlib.contextmanager
def descriptors_full() -> Any:
    """This process's descriptor table full (a real EMFILE for every open, pidfd_open too)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    filler: list[int] = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 4096), hard))
    try:
        with contextlib.suppress(OSError):
            while True:
                filler.append(os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC))
        yield
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.skipif(os.geteuid() != 0, reason="a prefix's own overlay is a root runner's")
def test_a_holder_attached_with_the_descriptor_table_full_keeps_its_overlay(
    tmp_path: Path,
) -> None:
    """Finding (fixed): with the runner's descriptor table full (the EMFILE that makes
    ``pidfd_open`` fail, the case the fallback of 7cf20b1 is for) the fallback read the
    holder's start time from /proc, which is one more open refused the same way:
    ``start_time`` said "gone" (None), so the holder was dropped at ``attach``, and a holder
    kept by pid was dropped by ``reap`` while the table stayed full; the overlay was then
    unmounted under the running sandbox. Now only "no such process" means gone; a /proc
    that cannot be read keeps the hold, and the overlay goes once its holder has exited."""
    prefix = tmp_path / "environments" / "env1" / "prefix"
    (prefix / "bin").mkdir(parents=True)
    prefixes = PrefixMounts(tmp_path / "prefixes")
    prefixes.linger_s = 0  # no reaper thread: the test reaps when it says so
    prefixes.startup(True)
    holder = subprocess.Popen(["sleep", "600"])
    try:
        ((point, _),), hold = prefixes.hold([(prefix, Path("/env"))])
        with descriptors_full():
            hold.attach(holder.pid)
            hold.close()
            still = prefixes.reap(), os.path.ismount(point)
        assert still == (0, True), "unmounted under a running holder (attach)"
        with descriptors_full():
            still = prefixes.reap(), os.path.ismount(point)
        assert still == (0, True), "unmounted under a running holder (reap)"
        assert prefixes.reap() == 0 and os.path.ismount(point)
        holder.kill()
        holder.wait()
        assert prefixes.reap() == 1 and not point.exists()
    finally:
        holder.kill()
        holder.wait()
        prefixes.close()


async def test_a_polled_package_tool_is_killed_at_its_time_limit_with_the_table_full(
    tmp_path: Path,
) -> None:
    """Finding (fixed): a package tool's end is polled when ``pidfd_open`` is refused (7cf20b1),
    and the reason for that is most often EMFILE; at the time limit ``_wait`` first opened the
    change's log to say why it kills, and that open, refused by the same full table, raised
    before ``kill``: the tool was never killed at its time limit and ran on unwatched. Now it
    is killed first, and the log's line is best effort. (The tool here is a real process;
    only the Sandboxes' policy is read by ``_wait``, for the free-space reserve.)"""
    prefix = tmp_path / "env" / "prefix"
    for folder in (prefix, tmp_path / "cache", tmp_path / "scratch"):
        folder.mkdir(parents=True)
    box = Sandboxes(
        policy=SandboxPolicy(), ids=None, bwrap="bwrap", view=None, seccomp=None,  # type: ignore[arg-type]
        disable_userns=False,
    )  # fmt: skip
    log = tmp_path / "change.log"
    log.write_bytes(b"")
    tools = SandboxedTools(
        sandboxes=box,
        prefix=prefix,
        cache=tmp_path / "cache",
        scratch=tmp_path / "scratch",
        log_path=log,
        base_env={},
        on_spawn=lambda *args: None,
        timeout_s=0.5,
    )
    tool = subprocess.Popen(["sleep", "600"])
    try:
        with descriptors_full():
            try:
                outcome: Any = await asyncio.wait_for(tools._wait(tool, 0), 30)
            except Exception as exc:
                outcome = exc
            running = tool.poll() is None
        assert not running, f"the tool runs on past its time limit ({outcome!r})"
        assert outcome == -9, repr(outcome)
    finally:
        tool.kill()
        tool.wait()


@pytest.mark.parametrize("how", ["closed", "reset", "cut head"])
async def test_a_post_whose_connection_broke_after_it_went_is_an_answer_lost(how: str) -> None:
    """Finding (fixed): on ``shellyard run``'s fast path a POST sent whole whose connection
    then ended without a whole answer (closed with no byte, reset, a head cut short: the
    server killed after it read the request, which may have started the command: E11 keeps
    it running) was "cannot reach ... retry" or "cut or not HTTP", RunnerUnavailable, exit
    75; retrying ran the command twice. Now ``AnswerLost``, exit 124, as for a cut by the
    clock (the fast path opens a fresh connection: the request was never a stale one's)."""

    async def broken(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if how == "cut head":
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-le")
            await writer.drain()
        elif how == "reset":
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()

    async with serving(broken) as url:
        request = b"POST /v1/executions HTTP/1.1\r\ncontent-length: 0\r\n\r\n"
        with pytest.raises(ShellyardError) as lost:
            await asyncio.to_thread(entry._exchange, "127.0.0.1", port_of(url), request, 5)
    assert isinstance(lost.value, AnswerLost), repr(lost.value)
    assert exit_code_of(lost.value) == 124 and "may have acted" in str(lost.value)
