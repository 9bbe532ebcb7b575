"""The egress proxy of one runner: HTTP(S) ``CONNECT`` and plain-HTTP forwarding on a Unix
socket that every ``egress`` sandbox gets bound in (docs/security.md, "Network").

The sandbox has its own network namespace with loopback only; inside it a ``socat`` relays
``127.0.0.1:3128`` to this socket, and ``HTTP(S)_PROXY`` point there. This process resolves
the name itself, checks every address against ``egress_rules`` and connects to the checked
address (never resolving twice, so DNS rebinding cannot swap it), then splices bytes both
ways. It runs in the runner's event loop: no thread or process per connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

from shellyard.netrules import OwnAddresses, registry_hint, resolve_checked
from shellyard.runner.network.egress_rules import EgressRules

log = logging.getLogger(__name__)

#: Largest request head the proxy reads before it answers 431.
MAX_HEAD = 16 << 10
#: How long a client may take to send its request head.
HEAD_TIMEOUT_S = 30.0
#: How long a connection attempt to an upstream may take.
CONNECT_TIMEOUT_S = 15.0
#: The runner's own addresses are read again at most this often (interfaces change).
OWN_REFRESH_S = 30.0
#: Where the socket appears inside the sandbox, and the port the in-sandbox relay listens on.
SANDBOX_SOCKET = "/run/shellyard/egress.sock"
SANDBOX_PORT = 3128


class Refused(Exception):
    """A destination the filter does not let through; the message says why."""


class EgressProxy:
    """Call ``start()`` in the runner's loop, ``close()`` when the runner stops."""

    def __init__(self, socket_path: Path, rules: EgressRules) -> None:
        self.socket_path = socket_path
        self.rules = rules
        self._server: asyncio.AbstractServer | None = None
        self._own = OwnAddresses(OWN_REFRESH_S)
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        # Traversable, not listable: bwrap (as the sandbox uid) must reach the socket to bind it.
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        # A Unix socket's path holds at most 107 bytes, and a home (a pytest tmp_path, a deep
        # checkout) easily makes a longer one: bind through the folder's descriptor instead, a
        # short path the kernel resolves to the same place. bwrap binds the long path as usual.
        folder = os.open(self.socket_path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            self._server = await asyncio.start_unix_server(
                self._serve, path=f"/proc/self/fd/{folder}/{self.socket_path.name}", limit=MAX_HEAD
            )
        finally:
            os.close(folder)
        # Any local user may connect: what it gets is what a sandbox gets, filtered.
        os.chmod(self.socket_path, 0o666)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._connections):
                task.cancel()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        try:
            await self._handle(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except Exception:  # one client's bad request must not take the proxy down
            log.exception("egress proxy connection failed")
        finally:
            if task is not None:
                self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
        except asyncio.LimitOverrunError:
            await _answer(writer, 431, "request head too large")
            return
        except TimeoutError:
            return  # a client that never finishes its request holds nothing for long
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            await _answer(writer, 400, "malformed request line")
            return
        method, target, version = parts
        if method == "CONNECT":
            host, port = _authority(target, 443)
        else:
            url = urlsplit(target)
            if url.scheme != "http" or not url.hostname:
                await _answer(writer, 400, "only CONNECT and absolute http:// URLs are proxied")
                return
            host, port = url.hostname, url.port or 80
        try:
            upstream_reader, upstream_writer = await self._open(host, port)
        except Refused as exc:
            log.info("egress refused: %s", exc)
            await _answer(writer, 403, f"shellyard egress refused {host}:{port}: {exc}")
            return
        except OSError as exc:
            await _answer(writer, 502, f"cannot connect to {host}:{port}: {exc.strerror or exc}")
            return
        try:
            if method == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await writer.drain()
            else:
                upstream_writer.write(_origin_request(method, target, version, lines[1:]))
            await _splice(reader, writer, upstream_reader, upstream_writer)
        finally:
            upstream_writer.close()

    async def _open(
        self, host: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Resolve, check each address, connect to the first that passes (and only to it)."""
        if port <= 0 or port > 65535:
            raise Refused("no such port")
        exception = self.rules.is_exception(host, port)
        if not exception:
            refusal = self.rules.name_refusal(host, port)
            if refusal is not None:
                raise Refused(refusal)
        loop = asyncio.get_running_loop()
        resolved = await resolve_checked(
            host,
            port,
            self._own.get(),
            exception=exception,
            registry=self.rules.is_registry(host, port),
        )
        failed: list[str] = []
        for family, sockaddr in resolved.allowed:
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                await asyncio.wait_for(loop.sock_connect(sock, sockaddr), CONNECT_TIMEOUT_S)
            except (OSError, TimeoutError) as exc:
                sock.close()
                failed.append(f"{sockaddr[0]}: {exc}")
                continue
            return await asyncio.open_connection(sock=sock)
        if resolved.refused and not failed:
            raise Refused("; ".join(resolved.refused) + registry_hint(resolved.refused))
        raise OSError("; ".join(failed + list(resolved.refused)) or f"{host} has no address")


def _authority(target: str, default_port: int) -> tuple[str, int]:
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return target.strip("[]"), default_port
    return host.strip("[]"), int(port)


def _origin_request(method: str, target: str, version: str, headers: list[str]) -> bytes:
    """The absolute-form request as the origin server expects it: origin-form path, no
    proxy headers, one request per connection (a second one could name another host)."""
    url = urlsplit(target)
    path = url.path or "/"
    if url.query:
        path += "?" + url.query
    kept = [
        h
        for h in headers
        if h and not h.lower().startswith(("proxy-", "connection:", "keep-alive:"))
    ]
    lines = [f"{method} {path} {version}", *kept, "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1")


async def _answer(writer: asyncio.StreamWriter, status: int, message: str) -> None:
    reasons = {400: "Bad Request", 403: "Forbidden", 431: "Too Large", 502: "Bad Gateway"}
    body = (message + "\n").encode()
    writer.write(
        f"HTTP/1.1 {status} {reasons.get(status, 'Error')}\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    with contextlib.suppress(ConnectionError):
        await writer.drain()


async def _splice(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    upstream_reader: asyncio.StreamReader,
    upstream_writer: asyncio.StreamWriter,
) -> None:
    async def pump(source: asyncio.StreamReader, target: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(1 << 16):
                target.write(data)
                await target.drain()  # bounded: never more than a chunk in flight per side
        finally:
            if target.can_write_eof():
                with contextlib.suppress(OSError):
                    target.write_eof()

    tasks = [
        asyncio.ensure_future(pump(reader, upstream_writer)),
        asyncio.ensure_future(pump(upstream_reader, writer)),
    ]
    try:
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for task in tasks:
            task.cancel()
