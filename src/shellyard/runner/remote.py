"""RemoteRunner: the Runner protocol over HTTP to a runner daemon (R1, direct or SSH tunnel).

Errors cross intact: a JSON error body from the daemon is raised again as the same
``ShellyardError`` class. A daemon that cannot be asked (connection refused or reset, a
timeout, a 5xx without an error body) raises ``RunnerUnavailable``, which the control plane
treats as retryable (E9); it never resubmits on its own behalf except as described in
``_post``.
"""

from __future__ import annotations

import time
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from shellyard.errors import InvalidInput, RunnerUnavailable, ShellyardError, error_from_dict
from shellyard.runner.daemon import (
    API_PREFIX,
    H_COMPLETE,
    H_NEXT_OFFSET,
    H_OFFSET,
    H_SIZE,
    WAIT_CAP_S,
    ExecutionRef,
    FileReadRequest,
    LogReadRequest,
    LogRef,
    LogSize,
    PathRef,
    WaitRequest,
    WorkspaceRef,
)
from shellyard.runner.protocol import (
    FileChunk,
    LogChunk,
    LogStream,
    PathEntry,
    RunnerExecState,
    RunnerExecution,
    RunnerInfo,
    SnapshotInfo,
    StartRequest,
)

M = TypeVar("M", bound=BaseModel)


def _body(model: type[M], **fields: Any) -> M:
    """A request body; bad arguments raise InvalidInput, as the runner would locally."""
    try:
        return model(**fields)
    except ValidationError as e:
        raise InvalidInput(f"bad runner request: {e}") from e


#: Added to a long poll's duration to get the HTTP read timeout of that request.
WAIT_MARGIN_S = 10.0


class RemoteRunner:
    """A Runner whose methods are HTTP calls to a runner daemon.

    ``base_url``: the daemon, e.g. ``http://10.0.0.5:8765`` or a local SSH tunnel end.
    ``token``: the daemon's bearer token. ``timeout_s``: the per-request timeout of quick
    calls. ``slow_timeout_s``: the timeout of calls whose work grows with the workspace or the
    cancel grace period (``ensure_workspace``, ``start``, ``cancel``, ``commit``). One
    ``httpx.AsyncClient`` with keep-alive serves every call; ``aclose`` closes it.
    ``transport`` replaces httpx's TCP transport (a Unix socket, a mock in tests).
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout_s: float = 30,
        slow_timeout_s: float = 600,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._slow = httpx.Timeout(slow_timeout_s, connect=min(timeout_s, 10.0))
        self._client = httpx.AsyncClient(
            base_url=self.base_url + API_PREFIX,
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0)),
            # The daemon keeps idle connections 75 s; expiring ours sooner avoids reusing one
            # it is closing at that moment.
            limits=httpx.Limits(keepalive_expiry=30.0),
            transport=transport,
        )

    def __repr__(self) -> str:
        return f"RemoteRunner({self.base_url!r})"

    # --- transport ---

    async def _post(
        self, method: str, body: BaseModel | None, timeout: httpx.Timeout | None = None
    ) -> httpx.Response:
        content = body.model_dump_json().encode() if body is not None else b"{}"
        kwargs: dict[str, Any] = {
            "content": content,
            "headers": {"Content-Type": "application/json"},
        }
        if timeout is not None:
            kwargs["timeout"] = timeout
        # Every protocol method is idempotent (``start`` by execution id, E10), so one quick
        # retry is safe; it covers a pooled keep-alive connection that died while idle.
        # Timeouts are not retried: the daemon is slow or gone, and a retry would only double
        # the wait.
        for attempt in (1, 2):
            try:
                response = await self._client.post(f"/{method}", **kwargs)
                break
            except (httpx.UnsupportedProtocol, httpx.LocalProtocolError) as e:
                # Our own request cannot be sent (a bad URL or token): not worth retrying.
                raise InvalidInput(
                    f"cannot send {method} to the runner at {self.base_url}: {e}; "
                    "check the runner's address and token",
                    method=method,
                ) from e
            except httpx.TimeoutException as e:
                raise RunnerUnavailable(
                    f"runner at {self.base_url} did not answer {method} in time ({e!r}); "
                    "what runs there keeps running; ask again later",
                    method=method,
                ) from e
            except httpx.TransportError as e:
                if attempt == 2:
                    raise RunnerUnavailable(
                        f"runner at {self.base_url} cannot be reached for {method} ({e!r}); "
                        "what runs there keeps running; ask again later",
                        method=method,
                    ) from e
        if response.status_code >= 400:
            raise self._error(method, response)
        return response

    def _error(self, method: str, response: httpx.Response) -> ShellyardError:
        try:
            data = response.json()
        except ValueError:
            data = None
        if isinstance(data, dict) and "code" in data and "message" in data:
            return error_from_dict(data)
        text = response.text[:300]
        if response.status_code >= 500:
            # A proxy, tunnel or crashed worker; not the daemon speaking: retryable (E9).
            return RunnerUnavailable(
                f"runner at {self.base_url} answered HTTP {response.status_code} to {method}: "
                f"{text!r}; ask again later",
                method=method,
                http_status=response.status_code,
            )
        return ShellyardError(
            f"runner at {self.base_url} answered HTTP {response.status_code} to {method}: {text!r}",
            method=method,
            http_status=response.status_code,
        )

    async def _call(
        self,
        method: str,
        body: BaseModel | None,
        model: type[M],
        timeout: httpx.Timeout | None = None,
    ) -> M:
        response = await self._post(method, body, timeout)
        try:
            return model.model_validate_json(response.content)
        except ValidationError as e:
            raise ShellyardError(
                f"runner at {self.base_url} sent a malformed {method} answer: {e}"
            ) from e

    # --- the Runner protocol ---

    async def info(self) -> RunnerInfo:
        return await self._call("info", None, RunnerInfo)

    async def ensure_workspace(self, workspace_id: str) -> SnapshotInfo:
        body = _body(WorkspaceRef, workspace_id=workspace_id)
        return await self._call("ensure_workspace", body, SnapshotInfo, self._slow)

    async def start(self, request: StartRequest) -> RunnerExecution:
        return await self._call("start", request, RunnerExecution, self._slow)

    async def status(self, execution_id: str) -> RunnerExecution:
        return await self._call(
            "status", _body(ExecutionRef, execution_id=execution_id), RunnerExecution
        )

    async def wait(self, execution_id: str, timeout_s: float) -> RunnerExecution:
        """Long-poll until the execution is no longer running or ``timeout_s`` has passed.

        The daemon answers each poll within ``WAIT_CAP_S``; longer waits are several polls.
        """
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            remaining = max(0.0, deadline - time.monotonic())
            poll_s = min(remaining, WAIT_CAP_S)
            body = _body(WaitRequest, execution_id=execution_id, timeout_s=poll_s)
            timeout = httpx.Timeout(poll_s + WAIT_MARGIN_S, connect=10.0)
            record = await self._call("wait", body, RunnerExecution, timeout)
            if record.state != RunnerExecState.running or time.monotonic() >= deadline:
                return record

    async def cancel(self, execution_id: str) -> RunnerExecution:
        body = _body(ExecutionRef, execution_id=execution_id)
        return await self._call("cancel", body, RunnerExecution, self._slow)

    async def read_log(
        self, execution_id: str, stream: LogStream, offset: int, limit: int
    ) -> LogChunk:
        body = _body(
            LogReadRequest, execution_id=execution_id, stream=stream, offset=offset, limit=limit
        )
        r = await self._post("read_log", body)
        h = r.headers
        return LogChunk(
            data=r.content,
            offset=int(h[H_OFFSET]),
            next_offset=int(h[H_NEXT_OFFSET]),
            size=int(h[H_SIZE]),
            complete=h[H_COMPLETE] == "true",
        )

    async def log_size(self, execution_id: str, stream: LogStream) -> int:
        body = _body(LogRef, execution_id=execution_id, stream=stream)
        return (await self._call("log_size", body, LogSize)).size

    async def commit(self, workspace_id: str) -> SnapshotInfo:
        body = _body(WorkspaceRef, workspace_id=workspace_id)
        return await self._call("commit", body, SnapshotInfo, self._slow)

    async def head(self, workspace_id: str) -> SnapshotInfo:
        return await self._call(
            "head", _body(WorkspaceRef, workspace_id=workspace_id), SnapshotInfo
        )

    async def stat_path(self, workspace_id: str, seq: int | None, path: str) -> PathEntry | None:
        body = _body(PathRef, workspace_id=workspace_id, seq=seq, path=path)
        r = await self._post("stat_path", body)
        if r.content.strip() == b"null":
            return None
        return PathEntry.model_validate_json(r.content)

    async def read_file(
        self, workspace_id: str, seq: int | None, path: str, offset: int, limit: int
    ) -> FileChunk:
        body = _body(
            FileReadRequest,
            workspace_id=workspace_id,
            seq=seq,
            path=path,
            offset=offset,
            limit=limit,
        )
        r = await self._post("read_file", body)
        h = r.headers
        return FileChunk(
            data=r.content,
            offset=int(h[H_OFFSET]),
            next_offset=int(h[H_NEXT_OFFSET]),
            size=int(h[H_SIZE]),
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __aenter__(self) -> RemoteRunner:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
