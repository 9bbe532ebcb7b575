"""RemoteRunner: the Runner protocol over HTTP to a runner daemon (R1, direct or SSH tunnel).

Every call is derived from the operation table of ``runner/transport/wire.py`` (the same table the
daemon's routes come from): a method only names its operation and passes its arguments.
Errors cross intact: the daemon's error envelope is raised again as the same
``ShellyardError`` class. A daemon that cannot be asked (connection refused or reset, a
timeout, a 5xx without an error body) raises ``RunnerUnavailable``, which the control plane
treats as retryable (E9); it never resubmits on its own behalf except as described in
``_post``.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import httpx
from pydantic import BaseModel, ValidationError

from shellyard.contract import rawjson
from shellyard.errors import InvalidInput, RunnerUnavailable, ShellyardError, decode_error
from shellyard.runner.protocol import (
    ApplyEntry,
    ApplyResult,
    ByteStream,
    DiffResult,
    DirListing,
    EditResult,
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
    PortView,
    PruneResult,
    RunnerExecState,
    RunnerExecution,
    RunnerInfo,
    ScreenView,
    SnapshotInfo,
    StartRequest,
)
from shellyard.runner.transport import compat
from shellyard.runner.transport.signing import UNSIGNED_STREAM, body_digest, signed_headers
from shellyard.runner.transport.wire import (
    API_PREFIX,
    H_ARGS,
    OPERATIONS,
    WAIT_CAP_S,
    InputArgs,
    LongPoll,
    Operation,
    StartAnswer,
    StartWait,
    chunk_header,
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
#: How long ``start`` lets the daemon wait for the command to end before it answers, and the
#: bytes of each log it sends along then: a command that ends sooner costs one round trip
#: (start, status and its logs together). A longer one costs this much more before ``start``
#: answers (a background start too), and is then watched as before.
START_WAIT_S = 0.5
START_LOG_BYTES = 64 << 10
#: Finished executions whose ``start`` answer is kept to answer ``wait``, ``status``,
#: ``log_size`` and ``read_log`` without a round trip (a finished record never changes; its
#: logs only by ``prune_logs``, which forgets them here). Bounded: at most this many, each
#: holding at most ``2 * START_LOG_BYTES`` of logs, for at most ``ENDED_KEEP_S``.
ENDED_KEEP = 64
ENDED_KEEP_S = 120.0


@dataclass
class _Ended:
    """An execution that ended within its ``start``: its record and the heads of its logs."""

    record: RunnerExecution
    #: stream → (size, first bytes)
    logs: dict[str, tuple[int, bytes]]
    at: float


class RemoteRunner:
    """A Runner whose methods are HTTP calls to a runner daemon.

    ``base_url``: the daemon, e.g. ``http://10.0.0.5:8765`` or a local SSH tunnel end.
    ``token``: the daemon's key (its token file), which signs every request (R4).
    ``timeout_s``: the per-request timeout of quick calls. ``slow_timeout_s``: the timeout of
    calls whose work grows with the workspace or the cancel grace period (``slow`` in the
    operation table). One ``httpx.AsyncClient`` with keep-alive serves every call; ``aclose``
    closes it.
    ``transport`` replaces httpx's TCP transport (an SSH tunnel, a mock in tests); ``label``
    names the runner in messages.
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout_s: float = 30,
        slow_timeout_s: float = 600,
        transport: httpx.AsyncBaseTransport | None = None,
        label: str | None = None,
        start_wait_s: float = START_WAIT_S,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        #: 0 turns the one-round-trip start off (the daemon answers ``start`` at once).
        self.start_wait_s = start_wait_s
        self._ended: OrderedDict[str, _Ended] = OrderedDict()
        #: How messages name the runner (an ssh runner's base_url is only its tunnel's end).
        self.label = label or self.base_url
        # The key signs every request (R4); it is never sent.
        self._key = token.encode("utf-8")
        #: The daemon's runner protocol, from its last ``info`` answer (None: not asked yet).
        self._protocol: int | None = None
        self._slow = httpx.Timeout(slow_timeout_s, connect=min(timeout_s, 10.0))
        self._client = httpx.AsyncClient(
            base_url=self.base_url + API_PREFIX,
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0)),
            # The daemon keeps idle connections 75 s; expiring ours sooner avoids reusing one
            # it is closing at that moment.
            limits=httpx.Limits(keepalive_expiry=30.0),
            transport=transport,
        )

    def __repr__(self) -> str:
        return f"RemoteRunner({self.label!r})"

    # --- transport ---

    async def _invoke(self, name: str, **arguments: Any) -> Any:
        """Call the Runner method ``name`` on the daemon, as ``wire.OPERATIONS`` says."""
        op = OPERATIONS[name]
        if op.kind == "upload":
            data: ByteStream = arguments.pop("data")
            args = _body(op.request, **arguments)
            return self._decode(op, await self._upload(op.name, args, data))
        body = arguments["request"] if op.whole else _body(op.request, **arguments)
        if isinstance(body, LongPoll):
            return await self._long_poll(op, body)
        if op.kind == "download":
            return await self._open_stream(op.name, body)
        response = await self._post(op.name, body, self._slow if op.slow else None)
        if op.kind == "chunk":
            return self._chunk(op, response)
        return self._decode(op, response)

    async def _long_poll(self, op: Operation, body: LongPoll) -> Any:
        """Poll until the answer's state is no longer ``running`` or ``timeout_s`` has
        passed; the daemon answers each poll within ``WAIT_CAP_S``."""
        timeout_s = body.timeout_s
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            poll_s = min(max(0.0, deadline - time.monotonic()), WAIT_CAP_S)
            poll = body.model_copy(update={"timeout_s": poll_s})
            timeout = httpx.Timeout(poll_s + WAIT_MARGIN_S, connect=10.0)
            record = self._decode(op, await self._post(op.name, poll, timeout))
            if record.state != "running" or time.monotonic() >= deadline:
                return record

    def _decode(self, op: Operation, response: httpx.Response) -> Any:
        if op.nullable and response.content.strip() == b"null":
            return None
        assert op.response is not None  # json and upload operations have an answer model
        try:
            result = rawjson.loads(op.response, response.content)
        except ValidationError as e:
            raise ShellyardError(
                f"runner at {self.label} sent a malformed {op.name} answer: {e}"
            ) from e
        return getattr(result, op.unwrap) if op.unwrap is not None else result

    def _chunk(self, op: Operation, response: httpx.Response) -> Any:
        assert op.response is not None
        fields: dict[str, object] = {"data": response.content}
        try:
            for name in op.response.model_fields:
                if name != "data":
                    fields[name] = response.headers[chunk_header(name)]
            return op.response.model_validate(fields)
        except (KeyError, ValidationError) as e:
            raise ShellyardError(
                f"runner at {self.label} sent a malformed {op.name} answer: {e!r}"
            ) from e

    def _signed(self, method: str, content: bytes) -> dict[str, str]:
        digest = body_digest(content)
        headers = signed_headers(self._key, "POST", f"{API_PREFIX}/{method}", digest)
        headers["Content-Type"] = "application/json"
        return headers

    async def _post(
        self, method: str, body: BaseModel | None, timeout: httpx.Timeout | None = None
    ) -> httpx.Response:
        content = rawjson.dumps(body) if body is not None else b"{}"
        kwargs: dict[str, Any] = {"content": content}
        if timeout is not None:
            kwargs["timeout"] = timeout
        # Every protocol method is idempotent (``start`` by execution id, E10), so one quick
        # retry is safe; it covers a pooled keep-alive connection that died while idle.
        # Timeouts are not retried: the daemon is slow or gone, and a retry would only double
        # the wait.
        for attempt in (1, 2):
            # Signed afresh on each attempt: the daemon refuses a signature seen before.
            kwargs["headers"] = self._signed(method, content)
            try:
                response = await self._client.post(f"/{method}", **kwargs)
                break
            except (httpx.UnsupportedProtocol, httpx.LocalProtocolError) as e:
                # Our own request cannot be sent (a bad URL or token): not worth retrying.
                raise InvalidInput(
                    f"cannot send {method} to the runner at {self.label}: {e}; "
                    "check the runner's address and token",
                    method=method,
                ) from e
            except httpx.TimeoutException as e:
                raise RunnerUnavailable(
                    f"runner at {self.label} did not answer {method} in time ({e!r}); "
                    "what runs there keeps running; ask again later",
                    method=method,
                ) from e
            except httpx.TransportError as e:
                if attempt == 2:
                    raise RunnerUnavailable(
                        f"runner at {self.label} cannot be reached for {method} ({e!r}); "
                        "what runs there keeps running; ask again later",
                        method=method,
                    ) from e
        if response.status_code >= 400:
            raise self._error(method, response)
        return response

    def _error(self, method: str, response: httpx.Response) -> ShellyardError:
        error = decode_error(response.content)
        if error is not None:
            return error
        text = response.text[:300]
        if response.status_code >= 500:
            # A proxy, tunnel or crashed worker; not the daemon speaking: retryable (E9).
            return RunnerUnavailable(
                f"runner at {self.label} answered HTTP {response.status_code} to {method}: "
                f"{text!r}; ask again later",
                method=method,
                http_status=response.status_code,
            )
        return ShellyardError(
            f"runner at {self.label} answered HTTP {response.status_code} to {method}: {text!r}",
            method=method,
            http_status=response.status_code,
        )

    async def _open_stream(self, method: str, body: BaseModel) -> ByteStream:
        """POST ``body``; return the answer's bytes as a stream. An error answer is raised
        here, before the first chunk."""
        content = rawjson.dumps(body)
        request = self._client.build_request(
            "POST",
            f"/{method}",
            content=content,
            headers=self._signed(method, content),
            timeout=self._slow,
        )
        try:
            response = await self._client.send(request, stream=True)
        except httpx.TransportError as e:
            raise RunnerUnavailable(
                f"runner at {self.label} cannot be reached for {method} ({e!r}); ask again later",
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
                f"the {method} stream from the runner at {self.label} broke ({e!r}); what "
                "arrived is incomplete, ask again",
                method=method,
            ) from e
        finally:
            await response.aclose()

    async def _upload(self, method: str, args: BaseModel, data: ByteStream) -> httpx.Response:
        """POST ``data`` as the raw body (streamed), the other arguments in a header. Never
        retried: a stream cannot be sent twice."""
        encoded = json.dumps(args.model_dump(mode="json"))
        headers = {
            H_ARGS: encoded,
            "Content-Type": "application/octet-stream",
            **signed_headers(self._key, "POST", f"{API_PREFIX}/{method}", UNSIGNED_STREAM, encoded),
        }
        try:
            response = await self._client.post(
                f"/{method}", content=data, headers=headers, timeout=self._slow
            )
        except httpx.TransportError as e:
            raise RunnerUnavailable(
                f"runner at {self.label} did not take the {method} upload ({e!r}); ask again later",
                method=method,
            ) from e
        if response.status_code >= 400:
            raise self._error(method, response)
        return response

    # --- the Runner protocol: each method names its operation in wire.OPERATIONS ---

    async def info(self) -> RunnerInfo:
        info = cast(RunnerInfo, await self._invoke("info"))
        self._protocol = info.protocol  # heartbeats ask it, so an up- or downgrade is seen
        return info

    async def ensure_workspace(self, workspace_id: str) -> SnapshotInfo:
        return cast(SnapshotInfo, await self._invoke("ensure_workspace", workspace_id=workspace_id))

    async def start(self, request: StartRequest) -> RunnerExecution:
        """Start, letting the daemon wait ``start_wait_s`` for the end (one round trip for a
        quick command); an answer with ``logs`` is kept for the calls that follow. Options
        the daemon's protocol would drop are refused (compat.py): asked again first, so a
        daemon upgraded since its last answer is seen at once."""
        if compat.unhonoured(request, self._protocol):
            await self.info()
            compat.check_start(request, self._protocol, self.label)
        op = OPERATIONS["start"]
        wait_s = 0.0 if request.detached else self.start_wait_s
        body = StartWait.model_construct(  # a validated StartRequest, extended
            **dict(request),
            wait_s=wait_s,
            log_bytes=START_LOG_BYTES if wait_s > 0 else 0,
        )
        answer = cast(StartAnswer, self._decode(op, await self._post(op.name, body, self._slow)))
        record = RunnerExecution.model_construct(
            **{name: getattr(answer, name) for name in RunnerExecution.model_fields}
        )
        if answer.logs is not None and record.state != RunnerExecState.running:
            # A log cut by the retained-log cap reads as head, marker and tail at offsets the
            # runner maps: those reads go to the runner.
            logs = {} if record.logs_cut else {h.stream: (h.size, h.data) for h in answer.logs}
            self._keep(record, logs)
        return record

    def _keep(self, record: RunnerExecution, logs: dict[str, tuple[int, bytes]]) -> None:
        now = time.monotonic()
        self._ended[record.execution_id] = _Ended(record, logs, now)
        self._ended.move_to_end(record.execution_id)
        while len(self._ended) > ENDED_KEEP:
            self._ended.popitem(last=False)
        while now - next(iter(self._ended.values())).at > ENDED_KEEP_S:
            self._ended.popitem(last=False)  # the newest is never old: the loop ends

    def _kept(self, execution_id: str) -> _Ended | None:
        ended = self._ended.get(execution_id)
        if ended is not None and time.monotonic() - ended.at > ENDED_KEEP_S:
            del self._ended[execution_id]
            return None
        return ended

    async def status(self, execution_id: str) -> RunnerExecution:
        ended = self._kept(execution_id)
        if ended is not None:
            return ended.record
        return cast(RunnerExecution, await self._invoke("status", execution_id=execution_id))

    async def wait(self, execution_id: str, timeout_s: float) -> RunnerExecution:
        """Long-poll until the execution is no longer running or ``timeout_s`` has passed."""
        ended = self._kept(execution_id)
        if ended is not None:
            return ended.record
        return cast(
            RunnerExecution,
            await self._invoke("wait", execution_id=execution_id, timeout_s=timeout_s),
        )

    async def cancel(self, execution_id: str) -> RunnerExecution:
        return cast(RunnerExecution, await self._invoke("cancel", execution_id=execution_id))

    # E13: interactive executions
    async def send_input(self, execution_id: str, data: bytes, eof: bool) -> int:
        op = OPERATIONS["send_input"]
        # raw bytes in Python, base64 in JSON (validating would read them as base64)
        body = InputArgs.model_construct(execution_id=execution_id, data=data, eof=eof)
        return cast(int, self._decode(op, await self._post(op.name, body, self._slow)))

    async def screen(self, execution_id: str) -> ScreenView:
        return cast(ScreenView, await self._invoke("screen", execution_id=execution_id))

    async def resize(self, execution_id: str, rows: int, cols: int) -> ScreenView:
        answer = await self._invoke("resize", execution_id=execution_id, rows=rows, cols=cols)
        return cast(ScreenView, answer)

    async def read_log(
        self, execution_id: str, stream: LogStream, offset: int, limit: int
    ) -> LogChunk:
        ended = self._kept(execution_id)
        if ended is not None and stream in ended.logs and offset >= 0 and limit > 0:
            size, head = ended.logs[stream]
            end = min(size, offset + limit)
            if end <= len(head):  # the span is in the head the start answer carried
                data = head[offset:end] if offset < end else b""
                return LogChunk(
                    data=data,
                    offset=offset,
                    next_offset=offset + len(data),
                    size=size,
                    complete=offset + len(data) >= size,
                )
        return cast(
            LogChunk,
            await self._invoke(
                "read_log", execution_id=execution_id, stream=stream, offset=offset, limit=limit
            ),
        )

    async def log_size(self, execution_id: str, stream: LogStream) -> int:
        ended = self._kept(execution_id)
        if ended is not None and stream in ended.logs:
            return ended.logs[stream][0]
        return cast(int, await self._invoke("log_size", execution_id=execution_id, stream=stream))

    async def commit(self, workspace_id: str) -> SnapshotInfo:
        return cast(SnapshotInfo, await self._invoke("commit", workspace_id=workspace_id))

    async def head(self, workspace_id: str) -> SnapshotInfo:
        return cast(SnapshotInfo, await self._invoke("head", workspace_id=workspace_id))

    async def stat_path(self, workspace_id: str, seq: int | None, path: str) -> PathEntry | None:
        return cast(
            "PathEntry | None",
            await self._invoke("stat_path", workspace_id=workspace_id, seq=seq, path=path),
        )

    async def read_file(
        self, workspace_id: str, seq: int | None, path: str, offset: int, limit: int
    ) -> FileChunk:
        return cast(
            FileChunk,
            await self._invoke(
                "read_file",
                workspace_id=workspace_id,
                seq=seq,
                path=path,
                offset=offset,
                limit=limit,
            ),
        )

    # --- files and history: byte streams are never held whole in memory ---

    async def list_snapshots(self, workspace_id: str) -> list[SnapshotInfo]:
        return cast(
            "list[SnapshotInfo]", await self._invoke("list_snapshots", workspace_id=workspace_id)
        )

    async def list_dir(
        self,
        workspace_id: str,
        seq: int | None,
        path: str,
        recursive: bool,
        after: str | None,
        limit: int,
    ) -> DirListing:
        return cast(
            DirListing,
            await self._invoke(
                "list_dir",
                workspace_id=workspace_id,
                seq=seq,
                path=path,
                recursive=recursive,
                after=after,
                limit=limit,
            ),
        )

    async def diff(
        self,
        workspace_id: str,
        from_seq: int,
        to_seq: int | None,
        path: str,
        after: str | None,
        limit: int,
    ) -> DiffResult:
        return cast(
            DiffResult,
            await self._invoke(
                "diff",
                workspace_id=workspace_id,
                from_seq=from_seq,
                to_seq=to_seq,
                path=path,
                after=after,
                limit=limit,
            ),
        )

    async def read_stream(
        self, workspace_id: str, seq: int | None, path: str, offset: int, length: int | None
    ) -> ByteStream:
        return cast(
            ByteStream,
            await self._invoke(
                "read_stream",
                workspace_id=workspace_id,
                seq=seq,
                path=path,
                offset=offset,
                length=length,
            ),
        )

    async def export_tar(self, workspace_id: str, seq: int | None, path: str) -> ByteStream:
        return cast(
            ByteStream,
            await self._invoke("export_tar", workspace_id=workspace_id, seq=seq, path=path),
        )

    async def write_file(
        self, workspace_id: str, path: str, data: ByteStream, mode: int | None
    ) -> EditResult:
        return cast(
            EditResult,
            await self._invoke(
                "write_file", workspace_id=workspace_id, path=path, data=data, mode=mode
            ),
        )

    async def write_tar(self, workspace_id: str, path: str, data: ByteStream) -> EditResult:
        return cast(
            EditResult,
            await self._invoke("write_tar", workspace_id=workspace_id, path=path, data=data),
        )

    async def delete_path(self, workspace_id: str, path: str, recursive: bool) -> EditResult:
        return cast(
            EditResult,
            await self._invoke(
                "delete_path", workspace_id=workspace_id, path=path, recursive=recursive
            ),
        )

    async def move_path(
        self, workspace_id: str, source: str, destination: str, overwrite: bool
    ) -> EditResult:
        return cast(
            EditResult,
            await self._invoke(
                "move_path",
                workspace_id=workspace_id,
                source=source,
                destination=destination,
                overwrite=overwrite,
            ),
        )

    async def restore(self, workspace_id: str, seq: int, path: str) -> EditResult:
        return cast(
            EditResult,
            await self._invoke("restore", workspace_id=workspace_id, seq=seq, path=path),
        )

    # --- transfers and retention ---

    async def missing_objects(self, sha256s: list[str]) -> list[str]:
        return cast("list[str]", await self._invoke("missing_objects", sha256s=sha256s))

    async def export_objects(self, sha256s: list[str], pack_version: int = 1) -> ByteStream:
        return cast(
            ByteStream,
            await self._invoke("export_objects", sha256s=sha256s, pack_version=pack_version),
        )

    @property
    def protocol_version(self) -> int:
        """The daemon's protocol as last seen (1 until known: the safe guess)."""
        return self._protocol or 1

    async def import_objects(self, data: ByteStream) -> list[ObjectResult]:
        return cast("list[ObjectResult]", await self._invoke("import_objects", data=data))

    async def apply_entries(self, workspace_id: str, entries: list[ApplyEntry]) -> ApplyResult:
        return cast(
            ApplyResult,
            await self._invoke("apply_entries", workspace_id=workspace_id, entries=entries),
        )

    async def prune_snapshots(self, workspace_id: str, keep: list[int]) -> PruneResult:
        return cast(
            PruneResult,
            await self._invoke("prune_snapshots", workspace_id=workspace_id, keep=keep),
        )

    async def collect_garbage(self, grace_s: float) -> GcResult:
        return cast(GcResult, await self._invoke("collect_garbage", grace_s=grace_s))

    async def prune_logs(self, request: LogPruneRequest) -> LogPruneResult:
        for execution_id in request.execution_ids:
            self._ended.pop(execution_id, None)  # its logs change now
        return cast(LogPruneResult, await self._invoke("prune_logs", request=request))

    # --- managed environments (V1–V8) ---

    async def environment_change(self, request: EnvironmentChangeRequest) -> EnvironmentChange:
        return cast(EnvironmentChange, await self._invoke("environment_change", request=request))

    async def environment_change_status(self, change_id: str) -> EnvironmentChange:
        return cast(
            EnvironmentChange, await self._invoke("environment_change_status", change_id=change_id)
        )

    async def environment_change_wait(self, change_id: str, timeout_s: float) -> EnvironmentChange:
        """Long-poll until the change has ended or ``timeout_s`` has passed (as ``wait``)."""
        return cast(
            EnvironmentChange,
            await self._invoke("environment_change_wait", change_id=change_id, timeout_s=timeout_s),
        )

    async def environment_info(self, environment_id: str) -> EnvironmentInfo:
        return cast(
            EnvironmentInfo, await self._invoke("environment_info", environment_id=environment_id)
        )

    # R5: the daemon forwards a loopback port of its own host (docs/runners.md)
    async def open_port(self, workspace_id: str, port: int, host_port: int) -> PortView:
        return cast(
            PortView,
            await self._invoke(
                "open_port", workspace_id=workspace_id, port=port, host_port=host_port
            ),
        )

    async def list_ports(self, workspace_id: str | None) -> list[PortView]:
        return cast(list[PortView], await self._invoke("list_ports", workspace_id=workspace_id))

    async def close_port(self, workspace_id: str, port: int) -> PortView:
        return cast(
            PortView, await self._invoke("close_port", workspace_id=workspace_id, port=port)
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __aenter__(self) -> RemoteRunner:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
