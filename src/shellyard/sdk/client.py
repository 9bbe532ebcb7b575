"""Python SDK of the control plane's REST API: ``Client`` (sync) and ``AsyncClient``.

Each JSON operation is described once, as an ``Op`` (``sdk/base.py``): executions and runners
here, sessions/agents/inbox/timers/wakes in ``sdk/sessions.py``, files/history/transfers/
artifacts in ``sdk/files.py``, one module per other concept. The two classes differ only in how they
send; byte streams and log following are written per client around shared logic. Errors come back as
the same ``ShellyardError`` class the server raised.

    from shellyard import Client
    with Client.for_home() as client:
        run = client.run("make test", background=True)
        for chunk in client.follow_logs(run.execution_id):
            sys.stdout.buffer.write(chunk)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from pydantic import TypeAdapter

from shellyard.contract.executions import (
    DEFAULT_LOG_LIMIT,
    DEFAULT_MAX_OUTPUT,
    DEFAULT_WAIT_MS,
    ExecutionView,
    LogsResult,
    RunShellResult,
)
from shellyard.contract.runners import RunnerView
from shellyard.sdk.base import (
    WAIT_SLACK_S,
    AsyncSender,
    Op,
    SyncSender,
    _Call,
    call,
)
from shellyard.sdk.environments import EnvironmentOps
from shellyard.sdk.files import (
    AsyncFileStreams,
    FileDownloads,
    FileOps,
    FileStreams,
)
from shellyard.sdk.interactive import InteractiveOps
from shellyard.sdk.ports import PortOps
from shellyard.sdk.runners import RunnerOps
from shellyard.sdk.sessions import AsyncSessionStreams, SessionOps, SessionStreams
from shellyard.sdk.tokens import TokenOps

__all__ = ["WAIT_SLACK_S", "AsyncClient", "Client", "RunnerView", "_Call"]


_RUN = TypeAdapter(RunShellResult)
_VIEW = TypeAdapter(ExecutionView)
_VIEWS = TypeAdapter(list[ExecutionView])
_LOGS = TypeAdapter(LogsResult)


def _run(command: str | None = None, **options: Any) -> _Call[RunShellResult]:
    """E1: run one command (or ``script_path=`` with ``args=[...]``); returns within
    ``wait_ms`` (default 10 s) with the result, or with ``state`` still running and an
    ``execution_id`` to follow. ``timeout_ms=`` cancels it after that long (E5), ``env=``
    adds variables, ``cwd=`` starts it in a folder of the workspace."""
    body = {k: v for k, v in {"command": command, **options}.items() if v is not None}
    wait_s = float(body.get("wait_ms", DEFAULT_WAIT_MS)) / 1000
    return call("POST", "/v1/executions", _RUN, body=body, timeout_s=wait_s + WAIT_SLACK_S)


def _status(execution_id: str) -> _Call[ExecutionView]:
    return call("GET", f"/v1/executions/{execution_id}", _VIEW)


def _wait(execution_id: str, timeout_s: float = 10.0) -> _Call[ExecutionView]:
    """Wait up to ``timeout_s`` (at most 30) for the execution to end; its view either way."""
    path = f"/v1/executions/{execution_id}/wait"
    return call("GET", path, _VIEW, {"timeout_s": timeout_s}, timeout_s=timeout_s + WAIT_SLACK_S)


def _logs(
    execution_id: str,
    stream: str = "stdout",
    offset: int = 0,
    limit: int = DEFAULT_LOG_LIMIT,
    tail: int | None = None,
    *,
    tail_lines: int | None = None,
    raw: bool = False,
) -> _Call[LogsResult]:
    """One page of a log: ``data`` from ``offset``, ``next_offset`` to ask next, ``complete``
    once the execution ended and everything was read. ``tail``: the last bytes,
    ``tail_lines``: the last lines; ``raw``: ``data`` is base64 of the exact bytes (read them
    with ``page.raw()``)."""
    params: dict[str, object] = {"stream": stream, "offset": offset, "limit": limit}
    if tail is not None:
        params["tail"] = tail
    if tail_lines is not None:
        params["tail_lines"] = tail_lines
    if raw:
        params["encoding"] = "base64"
    return call("GET", f"/v1/executions/{execution_id}/logs", _LOGS, params)


def _result(
    execution_id: str, max_output_length: int = DEFAULT_MAX_OUTPUT
) -> _Call[RunShellResult]:
    """What run_shell answers about the execution now (inline output capped), never waiting."""
    params = {"max_output_length": max_output_length}
    return call("GET", f"/v1/executions/{execution_id}/result", _RUN, params)


def _cancel(execution_id: str, wait_s: float = 0.0) -> _Call[ExecutionView]:
    """E7: SIGTERM, then the whole sandbox after the grace period; ``wait_s`` for the end."""
    path = f"/v1/executions/{execution_id}/cancel"
    return call("POST", path, _VIEW, {"wait_s": wait_s}, timeout_s=wait_s + WAIT_SLACK_S)


def _list(limit: int = 100) -> _Call[list[ExecutionView]]:
    return call("GET", "/v1/executions", _VIEWS, {"limit": limit})


class ExecutionOps:
    """Executions."""

    run = Op(_run)
    status = Op(_status)
    wait = Op(_wait)
    logs = Op(_logs)
    run_result = Op(_result)
    cancel = Op(_cancel)
    list = Op(_list)


@dataclass
class _LogFollower:
    """Where a log follower is and what it asks next. Caught up on a running execution, it
    waits on the execution (which returns at once when it ends) for a pause that grows from
    ``first_pause_s`` to ``poll_s`` and drops back as soon as data flows again."""

    execution_id: str
    stream: str
    offset: int
    chunk: int
    poll_s: float
    first_pause_s: float = 0.02
    pause_s: float = 0.0
    done: bool = False
    #: Ask for the exact bytes (base64 on the wire) rather than text.
    raw: bool = False

    def page(self) -> _Call[LogsResult]:
        return _logs(self.execution_id, self.stream, self.offset, self.chunk, raw=self.raw)

    def take(self, page: LogsResult) -> str:
        """The page's data; afterwards ``done`` says stop, ``pause_s`` how long to wait."""
        self.offset = page.next_offset
        self.done = page.complete or (not page.data and page.state.terminal)
        if page.data:
            self.pause_s = 0.0
        else:
            self.pause_s = min(self.poll_s, max(self.first_pause_s, self.pause_s * 2))
        return page.data

    def wait(self) -> _Call[ExecutionView]:
        return _wait(self.execution_id, self.pause_s)


def _home_server(home: Path | None) -> tuple[str, str]:
    from shellyard.config import default_home
    from shellyard.home import ensure_server

    info = ensure_server(home or default_home())
    return info.url, info.token


class Client(
    ExecutionOps,
    InteractiveOps,
    RunnerOps,
    SessionOps,
    FileOps,
    FileDownloads,
    EnvironmentOps,
    TokenOps,
    PortOps,
    SessionStreams,
    FileStreams,
    SyncSender,
):
    """Synchronous client. ``Client.for_home()`` finds (or starts) the home's server; or give
    ``Client(url, token)``. ``agent_id=`` (or ``as_agent``) acts for one agent."""

    @classmethod
    def for_home(cls, home: Path | None = None, *, agent_id: str | None = None) -> Self:
        url, token = _home_server(home)
        return cls(url, token, agent_id=agent_id)

    def _follow(
        self, execution_id: str, stream: str, offset: int, chunk: int, poll_s: float
    ) -> Iterator[str]:
        follower = _LogFollower(execution_id, stream, offset, chunk, poll_s)
        while not follower.done:
            text = follower.take(self._send(follower.page()))
            if text:
                yield text
            elif not follower.done:
                self._send(follower.wait())

    def _follow_raw(
        self, execution_id: str, stream: str, offset: int, chunk: int, poll_s: float
    ) -> Iterator[bytes]:
        follower = _LogFollower(execution_id, stream, offset, chunk, poll_s, raw=True)
        while not follower.done:
            page = self._send(follower.page())
            if follower.take(page):
                yield page.raw()
            elif not follower.done:
                self._send(follower.wait())

    def follow_logs(
        self,
        execution_id: str,
        stream: str = "stdout",
        *,
        offset: int = 0,
        chunk: int = 65536,
        poll_s: float = 0.5,
    ) -> Iterator[bytes]:
        """The log's bytes from ``offset`` as they are written, in pieces of at most ``chunk``
        bytes, until the execution ends and all was read. Memory stays bounded by ``chunk``:
        nothing is kept once yielded. The bytes are exact (base64 on the wire), UTF-8 or not."""
        yield from self._follow_raw(execution_id, stream, offset, chunk, poll_s)

    def follow(
        self, execution_id: str, stream: str = "stdout", offset: int = 0, poll_s: float = 0.2
    ) -> Iterator[str]:
        """``follow_logs`` as text."""
        return self._follow(execution_id, stream, offset, 65536, poll_s)


class AsyncClient(
    ExecutionOps,
    InteractiveOps,
    RunnerOps,
    SessionOps,
    FileOps,
    FileDownloads,
    EnvironmentOps,
    TokenOps,
    PortOps,
    AsyncSessionStreams,
    AsyncFileStreams,
    AsyncSender,
):
    """Asynchronous client with the same operations as ``Client`` (each awaited); log
    following and downloads are ``async for`` iterators."""

    @classmethod
    def for_home(cls, home: Path | None = None, *, agent_id: str | None = None) -> Self:
        url, token = _home_server(home)
        return cls(url, token, agent_id=agent_id)

    async def _follow(
        self, execution_id: str, stream: str, offset: int, chunk: int, poll_s: float
    ) -> AsyncIterator[str]:
        follower = _LogFollower(execution_id, stream, offset, chunk, poll_s)
        while not follower.done:
            text = follower.take(await self._send(follower.page()))
            if text:
                yield text
            elif not follower.done:
                await self._send(follower.wait())

    async def _follow_raw(
        self, execution_id: str, stream: str, offset: int, chunk: int, poll_s: float
    ) -> AsyncIterator[bytes]:
        follower = _LogFollower(execution_id, stream, offset, chunk, poll_s, raw=True)
        while not follower.done:
            page = await self._send(follower.page())
            if follower.take(page):
                yield page.raw()
            elif not follower.done:
                await self._send(follower.wait())

    async def follow_logs(
        self,
        execution_id: str,
        stream: str = "stdout",
        *,
        offset: int = 0,
        chunk: int = 65536,
        poll_s: float = 0.5,
    ) -> AsyncIterator[bytes]:
        """See ``Client.follow_logs``."""
        async for data in self._follow_raw(execution_id, stream, offset, chunk, poll_s):
            yield data

    def follow(
        self, execution_id: str, stream: str = "stdout", offset: int = 0, poll_s: float = 0.2
    ) -> AsyncIterator[str]:
        return self._follow(execution_id, stream, offset, 65536, poll_s)
