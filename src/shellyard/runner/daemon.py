"""The runner daemon: the Runner protocol served over HTTP (R1, the SWE-ReX pattern).

One POST endpoint per protocol method, ``/v1/<method>``, with a pydantic body. Every
endpoint needs ``Authorization: Bearer <token>``. A ``ShellyardError`` raised by the runner
crosses the wire as ``error.to_dict()`` with its ``http_status``, so ``RemoteRunner`` raises
the same class again. Byte payloads (``read_log``, ``read_file``) travel as the raw body, their
chunk metadata in ``X-Shellyard-*`` headers: a 1 MiB chunk is not inflated by base64 in JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import logging
import os
import secrets
import socket
import stat
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal, TypeVar, cast

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from shellyard.errors import InvalidInput, ShellyardError, Unauthorized
from shellyard.listen import bind_socket, socket_url
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
    GcResult,
    LogStream,
    ObjectResult,
    PathEntry,
    PruneResult,
    Runner,
    RunnerExecution,
    RunnerInfo,
    SandboxPolicy,
    SnapshotInfo,
    StartRequest,
)

logger = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)

#: The server answers a ``wait`` after at most this long; the client loops for longer waits.
WAIT_CAP_S = 30.0
API_PREFIX = "/v1"
TOKEN_FILE_NAME = "token"
#: Response headers of the byte endpoints.
H_OFFSET = "X-Shellyard-Offset"
H_NEXT_OFFSET = "X-Shellyard-Next-Offset"
H_SIZE = "X-Shellyard-Size"
H_COMPLETE = "X-Shellyard-Complete"
#: Request header of the upload endpoints (their body is the raw byte stream): the other
#: arguments as ASCII JSON.
H_ARGS = "X-Shellyard-Args"
#: Printed (stderr) once the runner is started and the socket accepts requests.
READY_PREFIX = "shellyard runner daemon ready on "


# --- wire messages (the request bodies; responses are the protocol's own models) ---


class ExecutionRef(BaseModel):
    execution_id: str


class WaitRequest(BaseModel):
    execution_id: str
    timeout_s: float = Field(allow_inf_nan=False)


class WorkspaceRef(BaseModel):
    workspace_id: str


class LogRef(BaseModel):
    execution_id: str
    #: Any text: the runner itself refuses an unknown stream, with the same error as locally.
    stream: str


class LogReadRequest(LogRef):
    offset: int
    limit: int


class LogSize(BaseModel):
    size: int


class PathRef(BaseModel):
    workspace_id: str
    seq: int | None = None
    path: str


class FileReadRequest(PathRef):
    offset: int
    limit: int


class ListDirRequest(BaseModel):
    workspace_id: str
    seq: int | None = None
    path: str = ""
    recursive: bool = False
    after: str | None = None
    limit: int = 1000


class DiffRequest(BaseModel):
    workspace_id: str
    from_seq: int
    to_seq: int | None = None
    path: str = ""
    after: str | None = None
    limit: int = 1000


class ReadStreamRequest(PathRef):
    offset: int = 0
    length: int | None = None


class WriteFileArgs(BaseModel):
    workspace_id: str
    path: str
    mode: int | None = None


class WriteTarArgs(BaseModel):
    workspace_id: str
    path: str = ""


class DeleteRequest(BaseModel):
    workspace_id: str
    path: str
    recursive: bool = False


class MoveRequest(BaseModel):
    workspace_id: str
    source: str
    destination: str
    overwrite: bool = False


class RestoreRequest(BaseModel):
    workspace_id: str
    seq: int
    path: str = ""


class NoArgs(BaseModel):
    """The arguments of an upload that has none besides its body."""


class ObjectList(BaseModel):
    sha256s: list[str]


class ObjectResults(BaseModel):
    results: list[ObjectResult]


class SnapshotList(BaseModel):
    snapshots: list[SnapshotInfo]


class ApplyRequest(BaseModel):
    workspace_id: str
    entries: list[ApplyEntry]


class PruneRequest(BaseModel):
    workspace_id: str
    keep: list[int]


class GcRequest(BaseModel):
    grace_s: float = Field(ge=0, allow_inf_nan=False)


class ChangeRef(BaseModel):
    change_id: str


class ChangeWaitRequest(BaseModel):
    change_id: str
    timeout_s: float = Field(allow_inf_nan=False)


class EnvironmentRef(BaseModel):
    environment_id: str


# --- token ---


def load_or_create_token(path: Path) -> str:
    """Return the token stored in ``path``, creating it (0600, random) when it is missing."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            logger.warning(
                "runner token file is readable by others; run chmod 600 on it",
                extra={"action": "token_mode", "path": str(path), "mode": oct(mode)},
            )
        token = path.read_text(encoding="utf-8").strip()
        if not token:
            raise InvalidInput(
                f"the runner token file {path} is empty: delete it to have a new token made, "
                "or write a token into it"
            ) from None
        return token
    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(token + "\n")
    logger.info("created runner token file", extra={"action": "token_created", "path": str(path)})
    return token


# --- the app ---


def _error_response(error: ShellyardError, status: int | None = None) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(error, Unauthorized) else None
    return JSONResponse(
        jsonable_encoder(error.to_dict()),
        status_code=status or error.http_status,
        headers=headers,
    )


def _bearer_check(token: str) -> Callable[[Request], None]:
    expected = token.encode("utf-8")

    def check(request: Request) -> None:
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given:
            raise Unauthorized(
                "this runner daemon needs 'Authorization: Bearer <token>'; the token is in the "
                "daemon's token file (<root>/token on the runner host unless set otherwise)"
            )
        # Constant-time compare so the token cannot be guessed byte by byte from timings.
        if not hmac.compare_digest(given.strip().encode("utf-8"), expected):
            raise Unauthorized(
                "wrong bearer token for this runner daemon; use the token from its token "
                "file (<root>/token on the runner host unless set otherwise)"
            )

    return check


def _bytes_response(
    data: bytes, offset: int, next_offset: int, size: int, complete: bool | None = None
) -> Response:
    headers = {H_OFFSET: str(offset), H_NEXT_OFFSET: str(next_offset), H_SIZE: str(size)}
    if complete is not None:
        headers[H_COMPLETE] = "true" if complete else "false"
    return Response(content=data, media_type="application/octet-stream", headers=headers)


def _upload_args(request: Request, model: type[M]) -> M:
    """The arguments of an upload endpoint, from its ``X-Shellyard-Args`` header."""
    try:
        return model.model_validate(json.loads(request.headers.get(H_ARGS, "{}")))
    except (ValueError, ValidationError) as exc:
        raise InvalidInput(f"bad {H_ARGS} header for {request.url.path}: {exc}") from None


def _stream_response(stream: ByteStream) -> StreamingResponse:
    return StreamingResponse(stream, media_type="application/octet-stream")


def create_runner_app(
    runner: Runner,
    token: str,
    *,
    on_startup: Callable[[], Awaitable[object]] | None = None,
    close_runner: bool = False,
    ready_url: str | None = None,
) -> FastAPI:
    """Serve ``runner`` over HTTP, one endpoint per protocol method.

    ``on_startup`` runs in the server's event loop before the first request (start a
    LocalRunner there, so its tasks live in that loop); ``close_runner`` makes shutdown call
    ``runner.aclose()``. ``ready_url`` is announced on stderr once started.
    """
    if not token:
        raise InvalidInput("the runner daemon needs a non-empty token")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if on_startup is not None:
            await on_startup()
        if ready_url is not None:
            # A line a parent process can wait for (tests, SSH runners): the port is bound
            # and the runner is started.
            print(READY_PREFIX + ready_url, file=sys.stderr, flush=True)
        try:
            yield
        finally:
            if close_runner:
                await runner.aclose()

    app = FastAPI(
        title="shellyard runner daemon",
        lifespan=lifespan,
        dependencies=[Depends(_bearer_check(token))],
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )

    async def on_shellyard_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ShellyardError)
        return _error_response(exc)

    async def on_validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()
        )
        return _error_response(InvalidInput(f"bad request to the runner daemon: {problems}"))

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        msg = (
            f"the runner daemon answered {exc.status_code} ({exc.detail}) to "
            f"{request.method} {request.url.path}; do client and daemon versions match?"
        )
        return _error_response(ShellyardError(msg), exc.status_code)

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        # Starlette re-raises after this answer, so uvicorn logs the traceback.
        error = ShellyardError(f"runner daemon failed: {type(exc).__name__}: {exc}")
        return _error_response(error)

    app.add_exception_handler(ShellyardError, on_shellyard_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)

    p = API_PREFIX

    @app.post(f"{p}/info")
    async def info() -> RunnerInfo:
        return await runner.info()

    @app.post(f"{p}/ensure_workspace")
    async def ensure_workspace(body: WorkspaceRef) -> SnapshotInfo:
        return await runner.ensure_workspace(body.workspace_id)

    @app.post(f"{p}/start")
    async def start(body: StartRequest) -> RunnerExecution:
        return await runner.start(body)

    @app.post(f"{p}/status")
    async def status(body: ExecutionRef) -> RunnerExecution:
        return await runner.status(body.execution_id)

    @app.post(f"{p}/wait")
    async def wait(body: WaitRequest) -> RunnerExecution:
        # A long poll, capped so no proxy or client read timeout has to outlast it.
        return await runner.wait(body.execution_id, min(body.timeout_s, WAIT_CAP_S))

    @app.post(f"{p}/cancel")
    async def cancel(body: ExecutionRef) -> RunnerExecution:
        return await runner.cancel(body.execution_id)

    @app.post(f"{p}/read_log")
    async def read_log(body: LogReadRequest) -> Response:
        stream = cast(LogStream, body.stream)
        c = await runner.read_log(body.execution_id, stream, body.offset, body.limit)
        return _bytes_response(c.data, c.offset, c.next_offset, c.size, c.complete)

    @app.post(f"{p}/log_size")
    async def log_size(body: LogRef) -> LogSize:
        return LogSize(size=await runner.log_size(body.execution_id, cast(LogStream, body.stream)))

    @app.post(f"{p}/commit")
    async def commit(body: WorkspaceRef) -> SnapshotInfo:
        return await runner.commit(body.workspace_id)

    @app.post(f"{p}/head")
    async def head(body: WorkspaceRef) -> SnapshotInfo:
        return await runner.head(body.workspace_id)

    @app.post(f"{p}/stat_path")
    async def stat_path(body: PathRef) -> PathEntry | None:
        return await runner.stat_path(body.workspace_id, body.seq, body.path)

    @app.post(f"{p}/read_file")
    async def read_file(body: FileReadRequest) -> Response:
        c = await runner.read_file(body.workspace_id, body.seq, body.path, body.offset, body.limit)
        return _bytes_response(c.data, c.offset, c.next_offset, c.size)

    # --- files, history, transfers: byte streams are raw bodies, both ways ---

    @app.post(f"{p}/list_snapshots")
    async def list_snapshots(body: WorkspaceRef) -> SnapshotList:
        return SnapshotList(snapshots=await runner.list_snapshots(body.workspace_id))

    @app.post(f"{p}/list_dir")
    async def list_dir(body: ListDirRequest) -> DirListing:
        return await runner.list_dir(
            body.workspace_id, body.seq, body.path, body.recursive, body.after, body.limit
        )

    @app.post(f"{p}/diff")
    async def diff(body: DiffRequest) -> DiffResult:
        return await runner.diff(
            body.workspace_id, body.from_seq, body.to_seq, body.path, body.after, body.limit
        )

    @app.post(f"{p}/read_stream")
    async def read_stream(body: ReadStreamRequest) -> StreamingResponse:
        stream = await runner.read_stream(
            body.workspace_id, body.seq, body.path, body.offset, body.length
        )
        return _stream_response(stream)

    @app.post(f"{p}/export_tar")
    async def export_tar(body: PathRef) -> StreamingResponse:
        return _stream_response(await runner.export_tar(body.workspace_id, body.seq, body.path))

    @app.post(f"{p}/write_file")
    async def write_file(request: Request) -> EditResult:
        args = _upload_args(request, WriteFileArgs)
        return await runner.write_file(args.workspace_id, args.path, request.stream(), args.mode)

    @app.post(f"{p}/write_tar")
    async def write_tar(request: Request) -> EditResult:
        args = _upload_args(request, WriteTarArgs)
        return await runner.write_tar(args.workspace_id, args.path, request.stream())

    @app.post(f"{p}/delete_path")
    async def delete_path(body: DeleteRequest) -> EditResult:
        return await runner.delete_path(body.workspace_id, body.path, body.recursive)

    @app.post(f"{p}/move_path")
    async def move_path(body: MoveRequest) -> EditResult:
        return await runner.move_path(
            body.workspace_id, body.source, body.destination, body.overwrite
        )

    @app.post(f"{p}/restore")
    async def restore(body: RestoreRequest) -> EditResult:
        return await runner.restore(body.workspace_id, body.seq, body.path)

    @app.post(f"{p}/missing_objects")
    async def missing_objects(body: ObjectList) -> ObjectList:
        return ObjectList(sha256s=await runner.missing_objects(body.sha256s))

    @app.post(f"{p}/export_objects")
    async def export_objects(body: ObjectList) -> StreamingResponse:
        return _stream_response(await runner.export_objects(body.sha256s))

    @app.post(f"{p}/import_objects")
    async def import_objects(request: Request) -> ObjectResults:
        return ObjectResults(results=await runner.import_objects(request.stream()))

    @app.post(f"{p}/apply_entries")
    async def apply_entries(body: ApplyRequest) -> ApplyResult:
        return await runner.apply_entries(body.workspace_id, body.entries)

    @app.post(f"{p}/prune_snapshots")
    async def prune_snapshots(body: PruneRequest) -> PruneResult:
        return await runner.prune_snapshots(body.workspace_id, body.keep)

    @app.post(f"{p}/collect_garbage")
    async def collect_garbage(body: GcRequest) -> GcResult:
        return await runner.collect_garbage(body.grace_s)

    # --- managed environments (V1–V8) ---

    @app.post(f"{p}/environment_change")
    async def environment_change(body: EnvironmentChangeRequest) -> EnvironmentChange:
        return await runner.environment_change(body)

    @app.post(f"{p}/environment_change_status")
    async def environment_change_status(body: ChangeRef) -> EnvironmentChange:
        return await runner.environment_change_status(body.change_id)

    @app.post(f"{p}/environment_change_wait")
    async def environment_change_wait(body: ChangeWaitRequest) -> EnvironmentChange:
        # A long poll, capped like ``wait``.
        timeout_s = min(body.timeout_s, WAIT_CAP_S)
        return await runner.environment_change_wait(body.change_id, timeout_s)

    @app.post(f"{p}/environment_info")
    async def environment_info(body: EnvironmentRef) -> EnvironmentInfo:
        return await runner.environment_info(body.environment_id)

    return app


# --- serving a LocalRunner ---


def make_runner_server(
    root: Path,
    policy: SandboxPolicy,
    token: str,
    sock: socket.socket,
    *,
    log_level: str = "info",
    hidden: list[Path] | None = None,
) -> uvicorn.Server:
    """A uvicorn server around a new ``LocalRunner(root, policy)``, ready to ``serve([sock])``.

    The runner is started in the server's event loop (lifespan) and closed on shutdown.
    """
    from shellyard.runner.local import LocalRunner  # the heavy part; only the daemon needs it

    runner = LocalRunner(root, policy, hidden=hidden)
    app = create_runner_app(
        runner,
        token,
        on_startup=runner.startup,
        close_runner=True,
        ready_url=socket_url(sock),
    )
    config = uvicorn.Config(
        app,
        log_level=log_level,
        access_log=False,
        # Longer than the client's keep-alive expiry, so the client never reuses a
        # connection the server is closing at the same moment.
        timeout_keep_alive=75,
        timeout_graceful_shutdown=10,
        lifespan="on",
    )
    return uvicorn.Server(config)


def serve_runner(
    root: Path,
    policy: SandboxPolicy,
    host: str = "127.0.0.1",
    port: int = 8765,
    token: str | None = None,
    *,
    log_level: str = "info",
    hidden: list[Path] | None = None,
) -> None:
    """Run a runner daemon for ``root`` until SIGINT/SIGTERM (blocking).

    ``token`` None reads ``<root>/token``, creating it on first start. ``hidden`` paths
    (beside ``root``, always hidden) are invisible inside every sandbox.
    """
    root.mkdir(parents=True, exist_ok=True)
    if token is None:
        token = load_or_create_token(root / TOKEN_FILE_NAME)
    sock = bind_socket(host, port)
    server = make_runner_server(root, policy, token, sock, log_level=log_level, hidden=hidden)
    try:
        asyncio.run(server.serve(sockets=[sock]))
    finally:
        sock.close()


def run_runner_daemon(
    root: Path,
    host: str,
    port: int,
    token_file: Path | None,
    network: str,
) -> None:
    """What ``shellyard runner serve`` calls: serve ``root`` with the token from ``token_file``
    (default ``<root>/token``, created on first start) and the given network policy."""
    if network not in ("on", "off"):
        raise InvalidInput(f"network must be 'on' or 'off', not {network!r}")
    net: Literal["on", "off"] = "on" if network == "on" else "off"
    root.mkdir(parents=True, exist_ok=True)
    token_path = (token_file or root / TOKEN_FILE_NAME).absolute()
    token = load_or_create_token(token_path)
    # A token file outside the root would otherwise be readable by a sandbox running as the
    # daemon's own (non-root) user.
    serve_runner(root, SandboxPolicy(network=net), host, port, token, hidden=[token_path])


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m shellyard.runner.daemon``: a bare entry point (tests, SSH runners).

    ``--policy-json`` gives the whole SandboxPolicy; otherwise ``--network`` sets it.
    """
    ap = argparse.ArgumentParser(prog="python -m shellyard.runner.daemon")
    ap.add_argument("--root", type=Path, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--token-file", type=Path, default=None)
    ap.add_argument("--network", choices=("on", "off"), default="on")
    ap.add_argument("--policy-json", default=None)
    ap.add_argument("--log-level", default="info")
    # limits (issue 12); also read from SHELLYARD_WORKSPACE_QUOTA etc. (docs/limits.md)
    ap.add_argument("--workspace-quota", default=None, help="bytes or K/M/G/T; 0: none")
    ap.add_argument("--log-limit", default=None, help="bytes kept per log stream; 0: all")
    ap.add_argument("--free-space-reserve", default=None, help="bytes or N%% of the volume")
    ap.add_argument("--cpu-limit", default=None, help="CPU seconds per process; 0: none")
    args = ap.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper())
    root: Path = args.root
    root.mkdir(parents=True, exist_ok=True)
    if args.policy_json is not None:
        policy = SandboxPolicy.model_validate_json(args.policy_json)
    else:
        policy = SandboxPolicy(network=args.network)
    policy = limits_options(policy, args)  # limits (issue 12)
    token = load_or_create_token(args.token_file or root / TOKEN_FILE_NAME)
    serve_runner(root, policy, args.host, args.port, token, log_level=args.log_level)


def limits_options(policy: SandboxPolicy, args: argparse.Namespace) -> SandboxPolicy:
    """The environment's limits, then the command line's (which win)."""
    from shellyard.runner import limits

    options = {
        limits.ENV_QUOTA: args.workspace_quota,
        limits.ENV_LOG_LIMIT: args.log_limit,
        limits.ENV_RESERVE: args.free_space_reserve,
        limits.ENV_CPU: args.cpu_limit,
    }
    policy = limits.policy_from_env(policy, os.environ)
    return limits.policy_from_env(policy, {k: v for k, v in options.items() if v is not None})


if __name__ == "__main__":
    main()
