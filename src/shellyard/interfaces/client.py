"""Python clients of the control plane's REST API: ``Client`` (sync) and ``AsyncClient``.

Each operation is described once (``_Call``: method, path, params, body, result model); the two
classes differ only in how they send it. Errors come back as the same ``ShellyardError`` class
the server raised.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import httpx
from pydantic import BaseModel, TypeAdapter

from shellyard.errors import RunnerUnavailable, ShellyardError, error_from_dict
from shellyard.interfaces.client_files import AsyncFileClient, FileClient
from shellyard.interfaces.client_sessions import AsyncSessionCalls, SessionCalls
from shellyard.model import ExecutionView, LogsResult, RunShellResult

T = TypeVar("T")

#: Extra seconds on top of a server-side wait before the HTTP read gives up.
WAIT_SLACK_S = 15.0


@dataclass
class _Call(Generic[T]):
    method: str
    path: str
    result: TypeAdapter[T]
    params: dict[str, Any] = field(default_factory=dict)
    body: Any = None
    timeout_s: float = 30.0


_RUN = TypeAdapter(RunShellResult)
_VIEW = TypeAdapter(ExecutionView)
_VIEWS = TypeAdapter(list[ExecutionView])
_LOGS = TypeAdapter(LogsResult)


def _run_call(**request: Any) -> _Call[RunShellResult]:
    body = {k: v for k, v in request.items() if v is not None}
    wait_s = float(body.get("wait_ms", 10_000)) / 1000
    return _Call("POST", "/v1/executions", _RUN, body=body, timeout_s=wait_s + WAIT_SLACK_S)


def _logs_call(
    execution_id: str, stream: str, offset: int, limit: int, tail: int | None
) -> _Call[LogsResult]:
    params: dict[str, Any] = {"stream": stream, "offset": offset, "limit": limit}
    if tail is not None:
        params["tail"] = tail
    return _Call("GET", f"/v1/executions/{execution_id}/logs", _LOGS, params=params)


def _decode(response: httpx.Response, call: _Call[T]) -> T:
    if response.status_code >= 400:
        try:
            error = response.json()["error"]
        except (ValueError, KeyError, TypeError):
            if response.status_code >= 500:
                raise RunnerUnavailable(
                    f"the control plane answered {response.status_code}: {response.text[:200]}"
                ) from None
            raise ShellyardError(f"HTTP {response.status_code}: {response.text[:200]}") from None
        raise error_from_dict(error)
    return call.result.validate_python(response.json())


def _headers(token: str, agent_id: str | None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {token}"}
    if agent_id:
        headers["X-Shellyard-Agent"] = agent_id
    return headers


def _body(call: _Call[Any]) -> Any:
    return call.body.model_dump(mode="json") if isinstance(call.body, BaseModel) else call.body


class Client(SessionCalls, FileClient):
    """Synchronous client. ``Client.for_home()`` finds (or starts) the home's server. Sessions,
    agents, the inbox, wakes and timers come from ``SessionCalls``."""

    def __init__(self, url: str, token: str, *, agent_id: str | None = None) -> None:
        self._http = httpx.Client(base_url=url, headers=_headers(token, agent_id), timeout=30)

    @classmethod
    def for_home(cls, home: Path | None = None, *, agent_id: str | None = None) -> Client:
        from shellyard.config import default_home
        from shellyard.interfaces.home import ensure_server

        info = ensure_server(home or default_home())
        return cls(info.url, info.token, agent_id=agent_id)

    def _send(self, call: _Call[T]) -> T:
        try:
            response = self._http.request(
                call.method,
                call.path,
                params=call.params,
                json=_body(call),
                timeout=call.timeout_s,
            )
        except httpx.TransportError as exc:
            raise RunnerUnavailable(f"cannot reach the control plane: {exc}") from exc
        return _decode(response, call)

    def run(self, command: str | None = None, **options: Any) -> RunShellResult:
        return self._send(_run_call(command=command, **options))

    def status(self, execution_id: str) -> ExecutionView:
        return self._send(_Call("GET", f"/v1/executions/{execution_id}", _VIEW))

    def wait(self, execution_id: str, timeout_s: float = 10.0) -> ExecutionView:
        return self._send(
            _Call(
                "GET",
                f"/v1/executions/{execution_id}/wait",
                _VIEW,
                params={"timeout_s": timeout_s},
                timeout_s=timeout_s + WAIT_SLACK_S,
            )
        )

    def logs(
        self,
        execution_id: str,
        stream: str = "stdout",
        offset: int = 0,
        limit: int = 65536,
        tail: int | None = None,
    ) -> LogsResult:
        return self._send(_logs_call(execution_id, stream, offset, limit, tail))

    def follow(
        self, execution_id: str, stream: str = "stdout", offset: int = 0, poll_s: float = 0.2
    ) -> Iterator[str]:
        """Yield log text as it is written until the execution ends (bounded memory)."""
        while True:
            chunk = self.logs(execution_id, stream, offset)
            if chunk.data:
                yield chunk.data
            offset = chunk.next_offset
            if chunk.complete:
                return
            if not chunk.data:
                if chunk.state.terminal:
                    return
                time.sleep(poll_s)

    def cancel(self, execution_id: str, wait_s: float = 0.0) -> ExecutionView:
        return self._send(
            _Call(
                "POST",
                f"/v1/executions/{execution_id}/cancel",
                _VIEW,
                params={"wait_s": wait_s},
                timeout_s=wait_s + WAIT_SLACK_S,
            )
        )

    def list(self, limit: int = 100) -> list[ExecutionView]:
        return self._send(_Call("GET", "/v1/executions", _VIEWS, params={"limit": limit}))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class AsyncClient(AsyncSessionCalls, AsyncFileClient):
    """Asynchronous client with the same operations as ``Client``."""

    def __init__(self, url: str, token: str, *, agent_id: str | None = None) -> None:
        self._http = httpx.AsyncClient(base_url=url, headers=_headers(token, agent_id), timeout=30)

    async def _send(self, call: _Call[T]) -> T:
        try:
            response = await self._http.request(
                call.method,
                call.path,
                params=call.params,
                json=_body(call),
                timeout=call.timeout_s,
            )
        except httpx.TransportError as exc:
            raise RunnerUnavailable(f"cannot reach the control plane: {exc}") from exc
        return _decode(response, call)

    async def run(self, command: str | None = None, **options: Any) -> RunShellResult:
        return await self._send(_run_call(command=command, **options))

    async def status(self, execution_id: str) -> ExecutionView:
        return await self._send(_Call("GET", f"/v1/executions/{execution_id}", _VIEW))

    async def logs(
        self,
        execution_id: str,
        stream: str = "stdout",
        offset: int = 0,
        limit: int = 65536,
        tail: int | None = None,
    ) -> LogsResult:
        return await self._send(_logs_call(execution_id, stream, offset, limit, tail))

    async def follow(
        self, execution_id: str, stream: str = "stdout", offset: int = 0, poll_s: float = 0.2
    ) -> AsyncIterator[str]:
        import asyncio

        while True:
            chunk = await self.logs(execution_id, stream, offset)
            if chunk.data:
                yield chunk.data
            offset = chunk.next_offset
            if chunk.complete or (not chunk.data and chunk.state.terminal):
                return
            if not chunk.data:
                await asyncio.sleep(poll_s)

    async def cancel(self, execution_id: str, wait_s: float = 0.0) -> ExecutionView:
        return await self._send(
            _Call(
                "POST",
                f"/v1/executions/{execution_id}/cancel",
                _VIEW,
                params={"wait_s": wait_s},
                timeout_s=wait_s + WAIT_SLACK_S,
            )
        )

    async def aclose(self) -> None:
        await self._http.aclose()
