"""The runner daemon: the Runner protocol served over HTTP (R1, the SWE-ReX pattern).

Its routes are derived from the one operation table in ``runner/transport/wire.py`` (``POST
/v1/<method>``), which ``RemoteRunner`` derives its calls from too. Every request must be
signed with the runner's key, the daemon's token (runner/transport/signing.py, R4): the key itself
never crosses the wire. A ``ShellyardError`` raised by the runner crosses the wire
in the one error envelope of ``shellyard.errors`` with its ``http_status``, so
``RemoteRunner`` raises the same class again.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import socket
import stat
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from shellyard import loops, settings_env
from shellyard.contract import rawjson
from shellyard.errors import (
    InvalidInput,
    ShellyardError,
    Unauthorized,
    encode_error,
    validation_message,
)
from shellyard.listen import bind_socket, socket_url
from shellyard.runner.limits.settings import limits_from_env
from shellyard.runner.policy import parse_network, policy_from_env
from shellyard.runner.protocol import (
    Runner,
    RunnerExecState,
    RunnerExecution,
    SandboxPolicy,
    StartRequest,
)
from shellyard.runner.transport.signing import SCHEME, Verifier
from shellyard.runner.transport.wire import (
    API_PREFIX,
    H_ARGS,
    OPERATIONS,
    START_WAIT_CAP_S,
    WAIT_CAP_S,
    LogHead,
    LongPoll,
    Operation,
    StartAnswer,
    StartWait,
    arguments,
    chunk_header,
)

logger = logging.getLogger(__name__)

__all__ = [
    "API_PREFIX",
    "READY_PREFIX",
    "TOKEN_FILE_NAME",
    "bind_socket",
    "bind_unix_socket",
    "create_runner_app",
    "load_or_create_token",
    "main",
    "make_runner_server",
    "run_runner_daemon",
    "serve_runner",
    "socket_url",
]

TOKEN_FILE_NAME = "token"
#: Printed (stderr) once the runner is started and the socket accepts requests.
READY_PREFIX = "shellyard runner daemon ready on "


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
    headers = {"WWW-Authenticate": SCHEME} if isinstance(error, Unauthorized) else None
    return JSONResponse(
        jsonable_encoder(encode_error(error)),
        status_code=status or error.http_status,
        headers=headers,
    )


def _parse(op: Operation, raw: bytes | str, source: str) -> BaseModel:
    try:
        return rawjson.loads(op.request, raw or b"{}")
    except ValidationError as exc:
        problems = validation_message(exc.errors())
        raise InvalidInput(f"bad {source} for {op.path}: {problems}") from None


def _answer(op: Operation, result: Any) -> Response:
    """The HTTP answer of ``op`` for the Runner method's ``result``."""
    if op.kind == "download":
        return StreamingResponse(result, media_type="application/octet-stream")
    if op.kind == "chunk":
        headers = {
            chunk_header(name): (str(value).lower() if isinstance(value, bool) else str(value))
            for name, value in result
            if name != "data"
        }
        return Response(result.data, media_type="application/octet-stream", headers=headers)
    if result is None and op.nullable:
        return Response(b"null", media_type="application/json")
    if op.unwrap is not None:
        assert op.response is not None  # the table gives every unwrapped answer a model
        result = op.response(**{op.unwrap: result})
    return Response(rawjson.dumps(result), media_type="application/json")


#: RunnerExecution fields only ``start`` sets; a later status or wait leaves them empty.
START_ONLY = ("base_environment", "base_revision", "note")


async def start_and_wait(runner: Runner, request: StartWait) -> StartAnswer:
    """``start``, then wait up to ``wait_s`` for the end; an execution that ended is answered
    with its log sizes and first ``log_bytes`` of each log, so a quick command costs the
    client one round trip instead of start, wait and a log read per stream."""
    plain = StartRequest.model_validate(request.model_dump(include=set(StartRequest.model_fields)))
    record: RunnerExecution = await runner.start(plain)
    budget = min(request.wait_s, START_WAIT_CAP_S)
    if budget > 0 and record.state == RunnerExecState.running:
        started = record
        record = await runner.wait(record.execution_id, budget)
        # What only start answers (the default base environment used, or the note that it
        # ran without one: docs/environments.md) stays in the answer when the record is the ended
        # one.
        record = record.model_copy(update={name: getattr(started, name) for name in START_ONLY})
    answer = StartAnswer.model_construct(**dict(record))  # a validated record, extended
    if budget > 0 and record.state != RunnerExecState.running:
        logs: list[LogHead] = []
        for stream in ("stdout", "stderr"):
            size = await runner.log_size(record.execution_id, stream)
            data = b""
            if size and request.log_bytes:
                head = await runner.read_log(
                    record.execution_id, stream, 0, min(size, request.log_bytes)
                )
                data = head.data
            logs.append(LogHead.model_construct(stream=stream, size=size, data=data))
        answer.logs = logs
    return answer


def _endpoint(
    runner: Runner, op: Operation, verifier: Verifier
) -> Callable[[Request], Awaitable[Response]]:
    method: Callable[..., Awaitable[Any]] = getattr(runner, op.name)
    if op.name == "start":

        async def method(request: StartWait) -> StartAnswer:
            return await start_and_wait(runner, request)

    async def endpoint(request: Request) -> Response:
        # The signature is checked before the body is read (R4).
        signed = verifier.check_headers(request.method, op.path, request.headers)
        if op.kind == "upload":
            verifier.check_body(signed, None)
            body = _parse(op, request.headers.get(H_ARGS, "{}"), f"{H_ARGS} header")
            kwargs = arguments(op, body)
            kwargs["data"] = request.stream()
        else:
            raw = await request.body()
            verifier.check_body(signed, raw)
            body = _parse(op, raw, "request to the runner daemon")
            kwargs = arguments(op, body)
        if isinstance(body, LongPoll):
            # Capped so no proxy or client read timeout has to outlast it; the client loops.
            kwargs["timeout_s"] = min(body.timeout_s, WAIT_CAP_S)
        result = await method(**kwargs)
        return _answer(op, result)

    endpoint.__name__ = op.name
    return endpoint


def create_runner_app(
    runner: Runner,
    token: str,
    *,
    on_startup: Callable[[], Awaitable[object]] | None = None,
    close_runner: bool = False,
    ready_url: str | None = None,
) -> FastAPI:
    """Serve ``runner`` over HTTP, one endpoint per operation of ``wire.OPERATIONS``.

    ``on_startup`` runs in the server's event loop before the first request (start a
    LocalRunner there, so its tasks live in that loop); ``close_runner`` makes shutdown call
    ``runner.aclose()``. ``ready_url`` is announced on stderr once started.
    """
    if not token:
        raise InvalidInput("the runner daemon needs a non-empty token")
    verifier = Verifier(token.encode("utf-8"))

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
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )

    async def on_shellyard_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ShellyardError)
        return _error_response(exc)

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
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)
    for op in OPERATIONS.values():
        app.add_api_route(op.path, _endpoint(runner, op, verifier), methods=["POST"])
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
    tls: tuple[Path, Path] | None = None,
) -> uvicorn.Server:
    """A uvicorn server around a new ``LocalRunner(root, policy)``, ready to ``serve([sock])``.

    The runner is started in the server's event loop (lifespan) and closed on shutdown.
    ``tls``: (certificate, key) PEM files; the daemon then speaks HTTPS (R4 off loopback).
    """
    from shellyard.runner.local import LocalRunner  # the heavy part; only the daemon needs it

    runner = LocalRunner(root, policy, hidden=hidden)
    app = create_runner_app(
        runner,
        token,
        on_startup=runner.startup,
        close_runner=True,
        ready_url=_url(sock).replace("http://", "https://") if tls else _url(sock),
    )
    config = uvicorn.Config(
        app,
        ssl_certfile=str(tls[0]) if tls else None,
        ssl_keyfile=str(tls[1]) if tls else None,
        log_level=log_level,
        access_log=False,
        # Longer than the client's keep-alive expiry, so the client never reuses a
        # connection the server is closing at the same moment.
        timeout_keep_alive=75,
        timeout_graceful_shutdown=10,
        lifespan="on",
    )
    return uvicorn.Server(config)


def bind_unix_socket(path: Path) -> socket.socket:
    """Listen on a Unix socket at ``path`` (0600: only the daemon's user may connect; the SSH
    server, logged in as that user, forwards to it). A stale socket file is replaced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_socket():
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        sock.bind(str(path))
    except OSError:
        sock.close()
        raise
    finally:
        os.umask(old_umask)
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _url(sock: socket.socket) -> str:
    if sock.family == socket.AF_UNIX:
        return f"unix:{sock.getsockname()}"
    return socket_url(sock)


def serve_runner(
    root: Path,
    policy: SandboxPolicy,
    host: str = "127.0.0.1",
    port: int = 8765,
    token: str | None = None,
    *,
    log_level: str = "info",
    hidden: list[Path] | None = None,
    unix_socket: Path | None = None,
    tls: tuple[Path, Path] | None = None,
) -> None:
    """Run a runner daemon for ``root`` until SIGINT/SIGTERM (blocking).

    ``token`` None reads ``<root>/token``, creating it on first start. ``hidden`` paths
    (beside ``root``, always hidden) are invisible inside every sandbox.
    """
    root.mkdir(parents=True, exist_ok=True)
    if token is None:
        token = load_or_create_token(root / TOKEN_FILE_NAME)
    sock = bind_unix_socket(unix_socket) if unix_socket else bind_socket(host, port)
    server = make_runner_server(
        root, policy, token, sock, log_level=log_level, hidden=hidden, tls=tls
    )
    try:
        loops.run(server.serve(sockets=[sock]))  # on uvloop by default (shellyard/loops.py)
    finally:
        sock.close()


def run_runner_daemon(
    root: Path,
    host: str,
    port: int,
    token_file: Path | None,
    network: str,
    host_paths: Sequence[str] = (),
    unix_socket: Path | None = None,
    tls: tuple[Path, Path] | None = None,
) -> None:
    """What ``shellyard runner serve`` calls: serve ``root`` with the token from ``token_file``
    (default ``<root>/token``, created on first start), the given network mode (off, egress,
    host) and read-only host paths, beside those of ``SHELLYARD_HOST_PATHS``."""
    settings_env.check_environment()  # every SHELLYARD_* value, refused at start when wrong
    try:
        mode = parse_network(network, "--network")
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    policy = policy_from_env(SandboxPolicy()).model_copy(update={"network": mode})
    policy = limits_from_env(policy, os.environ)  # limits (R2): docs/limits.md
    if host_paths:
        policy = SandboxPolicy.model_validate(
            {**policy.model_dump(), "host_paths": [*policy.host_paths, *host_paths]}
        )
    if mode == "host":
        logger.warning("network 'host': commands share this host's network, loopback included")
    root.mkdir(parents=True, exist_ok=True)
    token_path = (token_file or root / TOKEN_FILE_NAME).absolute()
    token = load_or_create_token(token_path)
    # A token file outside the root would otherwise be readable by a sandbox running as the
    # daemon's own (non-root) user.
    serve_runner(
        root,
        policy,
        host,
        port,
        token,
        hidden=[token_path, *(tls or ())],
        unix_socket=unix_socket,
        tls=tls,
    )


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m shellyard.runner.transport.daemon``: a bare entry point (tests, SSH runners).

    ``--policy-json`` gives the whole SandboxPolicy; otherwise ``--network`` sets it.
    """
    ap = argparse.ArgumentParser(prog="python -m shellyard.runner.transport.daemon")
    ap.add_argument("--root", type=Path, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--socket", type=Path, default=None, help="listen on this Unix socket")
    ap.add_argument("--tls-cert", type=Path, default=None)
    ap.add_argument("--tls-key", type=Path, default=None)
    ap.add_argument("--token-file", type=Path, default=None)
    ap.add_argument("--network", choices=("off", "egress", "host", "on"), default="off")
    ap.add_argument("--host-path", action="append", default=[])
    ap.add_argument("--policy-json", default=None)
    ap.add_argument("--log-level", default="info")
    # limits (R2); also read from SHELLYARD_WORKSPACE_QUOTA etc. (docs/limits.md)
    ap.add_argument("--workspace-quota", default=None, help="bytes or K/M/G/T; 0: none")
    ap.add_argument("--log-limit", default=None, help="bytes kept per log stream; 0: all")
    ap.add_argument("--free-space-reserve", default=None, help="bytes or N%% of the volume")
    ap.add_argument("--cpu-limit", default=None, help="CPU seconds per process; 0: none")
    # package sources; also SHELLYARD_ALLOWED_SOURCES (docs/environments.md)
    ap.add_argument("--allowed-source", action="append", default=None, help="repeatable")
    ap.add_argument("--packages-offline", action="store_true", help="local sources only")
    args = ap.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper())
    root: Path = args.root
    root.mkdir(parents=True, exist_ok=True)
    if args.policy_json is not None:
        policy = SandboxPolicy.model_validate_json(args.policy_json)
    else:
        policy = SandboxPolicy(
            network=parse_network(args.network, "--network"), host_paths=list(args.host_path)
        )
    policy = limits_options(policy, args)  # limits (R2, docs/limits.md)
    policy = sources_options(policy, args)  # package sources (docs/environments.md)
    token = load_or_create_token(args.token_file or root / TOKEN_FILE_NAME)
    serve_runner(
        root,
        policy,
        args.host,
        args.port,
        token,
        log_level=args.log_level,
        unix_socket=args.socket,
        tls=(args.tls_cert, args.tls_key) if args.tls_cert else None,
    )


def limits_options(policy: SandboxPolicy, args: argparse.Namespace) -> SandboxPolicy:
    """The environment's limits, then the command line's (which win)."""
    from shellyard.runner.limits import settings

    options = {
        settings.ENV_QUOTA: args.workspace_quota,
        settings.ENV_LOG_LIMIT: args.log_limit,
        settings.ENV_RESERVE: args.free_space_reserve,
        settings.ENV_CPU: args.cpu_limit,
    }
    policy = limits_from_env(policy, os.environ)
    return limits_from_env(policy, {k: v for k, v in options.items() if v is not None})


def sources_options(policy: SandboxPolicy, args: argparse.Namespace) -> SandboxPolicy:
    """The environment's package sources (SHELLYARD_ALLOWED_SOURCES,
    SHELLYARD_PACKAGES_OFFLINE, SHELLYARD_SOURCE_STALL_S), then the command line's (which win)."""
    update: dict[str, object] = {}
    sources = os.environ.get("SHELLYARD_ALLOWED_SOURCES")
    if sources is not None:
        update["allowed_sources"] = sources.replace(",", " ").split()
    if settings_env.flag("SHELLYARD_PACKAGES_OFFLINE"):
        update["packages_offline"] = True
    stall = settings_env.get("SHELLYARD_SOURCE_STALL_S")
    if stall is not None:
        update["source_stall_s"] = stall
    if args.allowed_source is not None:
        update["allowed_sources"] = list(args.allowed_source)
    if args.packages_offline:
        update["packages_offline"] = True
    if not update:
        return policy
    return SandboxPolicy.model_validate({**policy.model_dump(), **update})


if __name__ == "__main__":
    main()
