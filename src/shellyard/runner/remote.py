"""RemoteRunner: the Runner protocol over HTTP to a runner daemon (R1, direct or SSH tunnel).

Errors cross intact: a JSON error body from the daemon is raised again as the same
``ShellyardError`` class. A daemon that cannot be asked (connection refused or reset, a
timeout, a 5xx without an error body) raises ``RunnerUnavailable``, which the control plane
treats as retryable (E9); it never resubmits on its own behalf except as described in
``_post``.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from shellyard.errors import InvalidInput, RunnerUnavailable, ShellyardError, error_from_dict
from shellyard.runner.daemon import (
    API_PREFIX,
    H_ARGS,
    H_COMPLETE,
    H_NEXT_OFFSET,
    H_OFFSET,
    H_SIZE,
    WAIT_CAP_S,
    ApplyRequest,
    ChangeRef,
    ChangeWaitRequest,
    DeleteRequest,
    DiffRequest,
    EnvironmentRef,
    ExecutionRef,
    FileReadRequest,
    GcRequest,
    ListDirRequest,
    LogReadRequest,
    LogRef,
    LogSize,
    MoveRequest,
    NoArgs,
    ObjectList,
    ObjectResults,
    PathRef,
    PruneRequest,
    ReadStreamRequest,
    RestoreRequest,
    SnapshotList,
    WaitRequest,
    WorkspaceRef,
    WriteFileArgs,
    WriteTarArgs,
)
from shellyard.runner.protocol import (
    ApplyEntry,
    ApplyResult,
    ByteStream,
    DiffResult,
    DirListing,
    EditResult,
    EnvChangeState,
    EnvironmentChange,
    EnvironmentChangeRequest,
    EnvironmentInfo,
    FileChunk,
    GcResult,
    LogChunk,
    LogPruneRequest,
    LogPruneResult,
    LogStream,
    ObjectResult,
    PathEntry,
    PruneResult,
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

    # --- byte streams (files, tar archives, object packs): never held whole in memory ---

    async def _open_stream(self, method: str, body: BaseModel) -> ByteStream:
        """POST ``body``; return the answer's bytes as a stream. An error answer is raised
        here, before the first chunk."""
        request = self._client.build_request(
            "POST",
            f"/{method}",
            content=body.model_dump_json().encode(),
            headers={"Content-Type": "application/json"},
            timeout=self._slow,
        )
        try:
            response = await self._client.send(request, stream=True)
        except httpx.TransportError as e:
            raise RunnerUnavailable(
                f"runner at {self.base_url} cannot be reached for {method} ({e!r}); ask again "
                "later",
                method=method,
            ) from e
        if response.status_code >= 400:
            await response.aread()
            await response.aclose()
            raise self._error(method, response)
        return self._iter_response(method, response)

    async def _iter_response(self, method: str, response: httpx.Response) -> AsyncIterator[bytes]:
        try:
            async for chunk in response.aiter_raw():
                yield chunk
        except httpx.TransportError as e:
            raise RunnerUnavailable(
                f"the {method} stream from the runner at {self.base_url} broke ({e!r}); what "
                "arrived is incomplete, ask again",
                method=method,
            ) from e
        finally:
            await response.aclose()

    async def _upload(self, method: str, args: BaseModel, data: ByteStream, model: type[M]) -> M:
        """POST ``data`` as the raw body (streamed), the other arguments in a header. Never
        retried: a stream cannot be sent twice."""
        headers = {
            H_ARGS: json.dumps(args.model_dump(mode="json")),
            "Content-Type": "application/octet-stream",
        }
        try:
            response = await self._client.post(
                f"/{method}", content=data, headers=headers, timeout=self._slow
            )
        except httpx.TransportError as e:
            raise RunnerUnavailable(
                f"runner at {self.base_url} did not take the {method} upload ({e!r}); ask "
                "again later",
                method=method,
            ) from e
        if response.status_code >= 400:
            raise self._error(method, response)
        try:
            return model.model_validate_json(response.content)
        except ValidationError as e:
            raise ShellyardError(
                f"runner at {self.base_url} sent a malformed {method} answer: {e}"
            ) from e

    # --- files and history ---

    async def list_snapshots(self, workspace_id: str) -> list[SnapshotInfo]:
        body = _body(WorkspaceRef, workspace_id=workspace_id)
        return (await self._call("list_snapshots", body, SnapshotList)).snapshots

    async def list_dir(
        self,
        workspace_id: str,
        seq: int | None,
        path: str,
        recursive: bool,
        after: str | None,
        limit: int,
    ) -> DirListing:
        body = _body(
            ListDirRequest,
            workspace_id=workspace_id,
            seq=seq,
            path=path,
            recursive=recursive,
            after=after,
            limit=limit,
        )
        return await self._call("list_dir", body, DirListing)

    async def diff(
        self,
        workspace_id: str,
        from_seq: int,
        to_seq: int | None,
        path: str,
        after: str | None,
        limit: int,
    ) -> DiffResult:
        body = _body(
            DiffRequest,
            workspace_id=workspace_id,
            from_seq=from_seq,
            to_seq=to_seq,
            path=path,
            after=after,
            limit=limit,
        )
        return await self._call("diff", body, DiffResult)

    async def read_stream(
        self, workspace_id: str, seq: int | None, path: str, offset: int, length: int | None
    ) -> ByteStream:
        body = _body(
            ReadStreamRequest,
            workspace_id=workspace_id,
            seq=seq,
            path=path,
            offset=offset,
            length=length,
        )
        return await self._open_stream("read_stream", body)

    async def export_tar(self, workspace_id: str, seq: int | None, path: str) -> ByteStream:
        body = _body(PathRef, workspace_id=workspace_id, seq=seq, path=path)
        return await self._open_stream("export_tar", body)

    async def write_file(
        self, workspace_id: str, path: str, data: ByteStream, mode: int | None
    ) -> EditResult:
        args = _body(WriteFileArgs, workspace_id=workspace_id, path=path, mode=mode)
        return await self._upload("write_file", args, data, EditResult)

    async def write_tar(self, workspace_id: str, path: str, data: ByteStream) -> EditResult:
        args = _body(WriteTarArgs, workspace_id=workspace_id, path=path)
        return await self._upload("write_tar", args, data, EditResult)

    async def delete_path(self, workspace_id: str, path: str, recursive: bool) -> EditResult:
        body = _body(DeleteRequest, workspace_id=workspace_id, path=path, recursive=recursive)
        return await self._call("delete_path", body, EditResult, self._slow)

    async def move_path(
        self, workspace_id: str, source: str, destination: str, overwrite: bool
    ) -> EditResult:
        body = _body(
            MoveRequest,
            workspace_id=workspace_id,
            source=source,
            destination=destination,
            overwrite=overwrite,
        )
        return await self._call("move_path", body, EditResult, self._slow)

    async def restore(self, workspace_id: str, seq: int, path: str) -> EditResult:
        body = _body(RestoreRequest, workspace_id=workspace_id, seq=seq, path=path)
        return await self._call("restore", body, EditResult, self._slow)

    # --- transfers ---

    async def missing_objects(self, sha256s: list[str]) -> list[str]:
        body = _body(ObjectList, sha256s=sha256s)
        return (await self._call("missing_objects", body, ObjectList)).sha256s

    async def export_objects(self, sha256s: list[str]) -> ByteStream:
        return await self._open_stream("export_objects", _body(ObjectList, sha256s=sha256s))

    async def import_objects(self, data: ByteStream) -> list[ObjectResult]:
        return (await self._upload("import_objects", NoArgs(), data, ObjectResults)).results

    async def apply_entries(self, workspace_id: str, entries: list[ApplyEntry]) -> ApplyResult:
        body = _body(ApplyRequest, workspace_id=workspace_id, entries=entries)
        return await self._call("apply_entries", body, ApplyResult, self._slow)

    async def prune_snapshots(self, workspace_id: str, keep: list[int]) -> PruneResult:
        body = _body(PruneRequest, workspace_id=workspace_id, keep=keep)
        return await self._call("prune_snapshots", body, PruneResult, self._slow)

    async def collect_garbage(self, grace_s: float) -> GcResult:
        body = _body(GcRequest, grace_s=grace_s)
        return await self._call("collect_garbage", body, GcResult, self._slow)

    async def prune_logs(self, request: LogPruneRequest) -> LogPruneResult:
        return await self._call("prune_logs", request, LogPruneResult, self._slow)

    # --- managed environments (V1–V8) ---

    async def environment_change(self, request: EnvironmentChangeRequest) -> EnvironmentChange:
        return await self._call("environment_change", request, EnvironmentChange, self._slow)

    async def environment_change_status(self, change_id: str) -> EnvironmentChange:
        body = _body(ChangeRef, change_id=change_id)
        return await self._call("environment_change_status", body, EnvironmentChange)

    async def environment_change_wait(self, change_id: str, timeout_s: float) -> EnvironmentChange:
        """Long-poll until the change has ended or ``timeout_s`` has passed (as ``wait``)."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            poll_s = min(max(0.0, deadline - time.monotonic()), WAIT_CAP_S)
            body = _body(ChangeWaitRequest, change_id=change_id, timeout_s=poll_s)
            timeout = httpx.Timeout(poll_s + WAIT_MARGIN_S, connect=10.0)
            record = await self._call("environment_change_wait", body, EnvironmentChange, timeout)
            if record.state != EnvChangeState.running or time.monotonic() >= deadline:
                return record

    async def environment_info(self, environment_id: str) -> EnvironmentInfo:
        body = _body(EnvironmentRef, environment_id=environment_id)
        return await self._call("environment_info", body, EnvironmentInfo)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __aenter__(self) -> RemoteRunner:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
