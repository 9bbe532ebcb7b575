"""``shellyard serve``: the control plane for one home, with its REST API and MCP over
streamable HTTP (/mcp), in this process.

Loopback by default. Bearer tokens are on unless ``--no-auth`` is given, which is allowed only
on a loopback address: anyone who can reach a non-loopback port must present a token."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import traceback
from collections.abc import Awaitable, Callable

import uvicorn
from fastapi import FastAPI
from starlette.types import Message, Receive, Scope, Send

from shellyard import filemodes, loops
from shellyard.api.app import create_app
from shellyard.api.connections import KEEP_ALIVE_S, MAX_CONCURRENCY, BoundedHttp
from shellyard.config import Settings
from shellyard.control.plane import build
from shellyard.control.tokens import ADMIN_TOKEN_NAME
from shellyard.errors import InvalidInput
from shellyard.home import (
    INFO_NAME,
    ServerInfo,
    last_port,
    lock_home,
    remember_port,
    server_settings,
    write_info,
)
from shellyard.listen import bind_socket, socket_url

DEFAULT_HOST = "127.0.0.1"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def check_bind(host: str, auth: bool) -> None:
    """Refuse to serve without tokens on an address other machines can reach."""
    if not auth and not is_loopback(host):
        raise InvalidInput(
            f"--no-auth is allowed only on a loopback address (127.0.0.1, ::1), not {host!r}: "
            "without tokens anyone who reaches the port could run commands. Drop --no-auth "
            f"(clients then use the admin token in <home>/{ADMIN_TOKEN_NAME}, or tokens made "
            "with 'shellyard token create'), or bind to 127.0.0.1"
        )


def _bind(settings: Settings, host: str, port: int) -> socket.socket:
    """The listening socket: ``port``, or for 0 the port this home's server had last time
    when it is free (agent hosts keep ``http://127.0.0.1:PORT/mcp`` in their config), else
    a free one."""
    if port == 0 and (previous := last_port(settings.home)):
        with contextlib.suppress(OSError):
            return bind_socket(host, previous)
    return bind_socket(host, port)


class AppAfterBuild:
    """The ASGI app uvicorn serves. Its lifespan's startup builds the plane and makes the REST
    app over it (``make``), then hands that app the lifespan, startup message included; every
    request goes to that app. So the app and its routers only ever see a built plane, and the
    build still runs inside uvicorn's start-up, under its signal handling, with a failure
    reported as a failed start-up (docs/architecture.md "Wiring")."""

    def __init__(self, make: Callable[[], Awaitable[FastAPI]]) -> None:
        self._make = make
        self._app: FastAPI | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            # uvicorn serves requests only once the lifespan's startup is complete
            assert self._app is not None, "a request before the lifespan's startup"
            await self._app(scope, receive, send)
            return
        startup = await receive()
        try:
            self._app = await self._make()
        except BaseException:
            # as Starlette's own lifespan reports a failed startup (uvicorn then exits)
            await send({"type": "lifespan.startup.failed", "message": traceback.format_exc()})
            raise
        given = False

        async def receive_again() -> Message:
            nonlocal given
            if not given:
                given = True
                return startup
            return await receive()

        await self._app(scope, receive_again, send)


def serve(
    settings: Settings,
    host: str = DEFAULT_HOST,
    port: int = 0,
    *,
    auth: bool = True,
    on_ready: Callable[[], None] | None = None,
    log_level: str = "warning",
    json_logs: bool = False,
) -> None:
    """Run the control plane in this process until SIGINT/SIGTERM. ``on_ready`` is called once
    requests can be served; a start that fails raises what it failed on (also when it failed
    inside the app's start-up, which uvicorn would only log)."""
    check_bind(host, auth)
    filemodes.private_dir(settings.home)  # docs/security.md "The home's files"
    lock_fd = lock_home(settings.home)
    try:
        sock = _bind(settings, host, port)
    except OSError as exc:
        os.close(lock_fd)
        raise InvalidInput(
            f"cannot listen on {host}:{port}: {exc.strerror}. Pick another --port (0 picks a "
            "free one) or stop what uses it"
        ) from None
    failed: list[BaseException] = []

    async def make_app() -> FastAPI:
        try:
            plane = await build(settings)
        except BaseException as exc:
            failed.append(exc)
            raise
        try:
            # The admin token exists from the first start on, even with --no-auth, so that
            # restarting with tokens on needs no extra step.
            token = await plane.tokens.ensure_admin_file(settings.home)
        except BaseException as exc:
            failed.append(exc)
            await plane.aclose()
            raise

        async def on_start() -> None:
            info = ServerInfo(
                pid=os.getpid(),
                url=socket_url(sock),
                token=token if auth else "",
                token_file=str(settings.home / ADMIN_TOKEN_NAME) if auth else None,
                settings=server_settings(),
            )
            write_info(settings.home, info)  # published only once requests can be served
            remember_port(settings.home, sock.getsockname()[1])
            if on_ready is not None:
                on_ready()

        async def on_stop() -> None:
            with contextlib.suppress(FileNotFoundError):
                (settings.home / INFO_NAME).unlink()
            await plane.aclose()

        return create_app(plane, auth_required=auth, lifespan_hooks=(on_start, on_stop))

    app = AppAfterBuild(make_app)
    # Open wake streams (server-sent events) never end on their own: give them a few seconds.
    config = uvicorn.Config(
        app,
        log_level=log_level,
        lifespan="on",
        access_log=False,
        timeout_graceful_shutdown=3,
        # slow or many clients (docs/security.md "Limits at each door"): a header size bound
        # and deadline, a body deadline and a cap per client address (api/connections.py),
        # a cap for the whole server
        http=BoundedHttp,
        timeout_keep_alive=KEEP_ALIVE_S,
        limit_concurrency=MAX_CONCURRENCY,
        # JSON logs (docs/operations.md): uvicorn's lines go through the root's JSON handler too.
        log_config=None if json_logs else uvicorn.config.LOGGING_CONFIG,
    )
    server = uvicorn.Server(config)
    try:
        # on uvloop by default (shellyard/loops.py); uvicorn's own ``loop`` setting is unused:
        # it applies only to uvicorn.run, which does not take an open socket and a lock
        loops.run(server.serve(sockets=[sock]))
    except SystemExit:
        if not failed:  # uvicorn exits (status 3) after logging a failed start-up: say why
            raise
    finally:
        os.close(lock_fd)
    if failed:
        raise failed[0]
