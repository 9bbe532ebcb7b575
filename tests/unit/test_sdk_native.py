"""The async SDK's sockets on asyncio itself (sdk/native.py), over real loopback servers: no
anyio timeout scope per read or write any more, and what httpcore relied on anyio for still
holds (timeouts, errors, a kept connection the server closed, a bounded download buffer)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpcore
import httpx
import pytest
from product_loops import run_each_on

from shellyard.sdk import native, wire

ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


@asynccontextmanager
async def serving(
    handle: Any,
) -> AsyncIterator[str]:
    listening = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    async with listening:
        yield f"http://127.0.0.1:{port}"


async def _keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers ``{}`` to each request (no body expected), connection kept."""
    try:
        while True:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(ANSWER)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


async def test_no_anyio_timeout_scope_per_read_or_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """httpcore's anyio streams open ``anyio.fail_after`` for every read and write; the SDK's
    transport opens none (httpx's plain transport, measured the same way, still does)."""
    opened: list[float | None] = []
    real = anyio.fail_after

    def counted(delay: float | None, shield: bool = False) -> Any:
        opened.append(delay)
        return real(delay, shield)

    monkeypatch.setattr(anyio, "fail_after", counted)
    async with serving(_keep_alive) as url:
        for transport, plain in (
            (httpx.AsyncHTTPTransport(), True),
            (wire.async_transport(), False),
        ):
            opened.clear()
            async with httpx.AsyncClient(base_url=url, transport=transport) as http:
                for _ in range(3):
                    assert (await http.get("/health")).json() == {}
            if plain:
                assert len(opened) >= 6, opened  # the check's own witness
            else:
                assert opened == [], opened


async def test_a_read_past_its_timeout_is_a_read_timeout() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # never answers
        writer.close()

    async with (
        serving(silent) as url,
        httpx.AsyncClient(base_url=url, transport=wire.async_transport()) as http,
    ):
        with pytest.raises(httpx.ReadTimeout):
            await http.get("/health", timeout=0.3)


async def test_a_refused_connection_is_a_connect_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: refused
        async with httpx.AsyncClient(transport=wire.async_transport()) as http:
            with pytest.raises(httpx.ConnectError):
                await http.get(f"http://127.0.0.1:{port}/health")


async def test_a_kept_connection_the_server_closed_is_not_reused() -> None:
    """The server closes each connection after its answer (as at its keep-alive deadline):
    the next request goes on a new connection, not into the closed one."""
    connections: list[int] = []

    async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        await reader.readuntil(b"\r\n\r\n")
        writer.write(ANSWER)
        await writer.drain()
        writer.close()

    async with (
        serving(once) as url,
        httpx.AsyncClient(base_url=url, transport=wire.async_transport()) as http,
    ):
        for _ in range(3):
            assert (await http.get("/health")).json() == {}
            await asyncio.sleep(0.05)  # the close reaches the client
    assert len(connections) == 3


class _Kept(native.AsyncioBackend):
    """The backend, keeping the streams it opened (to read their buffered sizes)."""

    def __init__(self, inner: httpcore.AsyncNetworkBackend) -> None:
        super().__init__(inner)
        self.streams: list[Any] = []

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await super().connect_tcp(host, port, timeout, local_address, socket_options)
        self.streams.append(stream)
        return stream


async def test_a_slowly_read_download_is_held_back_by_the_socket() -> None:
    """64 MiB sent at once, read slowly: the bytes waiting in the client stay near
    HIGH_WATER (reading pauses), and all of them arrive, in order."""
    total = 64 << 20
    block = bytes(range(256)) * 4096  # 1 MiB

    async def big(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(f"HTTP/1.1 200 OK\r\ncontent-length: {total}\r\n\r\n".encode())
        for _ in range(total // len(block)):
            writer.write(block)
            await writer.drain()
        writer.close()

    transport = httpx.AsyncHTTPTransport()
    kept = _Kept(transport._pool._network_backend)  # type: ignore[union-attr]
    transport._pool._network_backend = kept  # type: ignore[union-attr]
    worst = 0
    received = 0
    async with (
        serving(big) as url,
        httpx.AsyncClient(base_url=url, transport=transport) as http,
        http.stream("GET", "/download") as response,
    ):
        async for chunk in response.aiter_raw():
            assert chunk == (block * 2)[received % len(block) :][: len(chunk)]
            received += len(chunk)
            worst = max(worst, kept.streams[0]._connection.size)
            if received < 8 << 20:
                await asyncio.sleep(0.001)
    assert received == total
    # one read of the loop's socket (256 KiB) may land past the mark before reading pauses
    assert worst <= native.HIGH_WATER + (256 << 10), worst


def test_a_call_is_built_as_httpx_builds_it() -> None:
    """sdk/base.py builds a call's request once merged (URL, query, headers, JSON, timeout):
    byte for byte the request ``httpx.Client.request`` sends, for a body, a query, neither,
    and a name to quote; and the client keeps no cookie a server sets."""
    from shellyard.sdk.base import SyncSender, _requests_of, call

    sender = SyncSender("http://127.0.0.1:9/", "tok", agent_id="agt_1")
    http = sender._http
    adapter: Any = None
    calls = [
        call("POST", "/v1/executions", adapter, body={"command": "héllo", "n": [1, None]},
             timeout_s=25.0),
        call("GET", "/v1/files", adapter, {"path": "a b/é&?", "recursive": True, "x": None}),
        call("POST", "/v1/executions/ex_1/cancel", adapter),
        call("DELETE", "/v1/sessions/s_1", adapter, {"force": False}),
        call("GET", "v1/health", adapter),  # no leading slash: joined as httpx joins it
    ]  # fmt: skip
    for made in calls:
        ours = _requests_of(sender).build(made)
        body = made.body
        theirs = http.build_request(
            made.method, made.path, params=made.params, json=body, timeout=made.timeout_s
        )
        assert ours.method == theirs.method
        assert str(ours.url) == str(theirs.url)
        assert ours.headers.multi_items() == theirs.headers.multi_items()
        assert ours.read() == theirs.read()
        assert ours.extensions == theirs.extensions
    response = httpx.Response(200, headers={"set-cookie": "s=1; Path=/"}, request=ours)
    http.cookies.extract_cookies(response)
    assert not http.cookies
    sender.close()


async def test_https_goes_through_start_tls(tmp_path: Any) -> None:
    """An https server (a self-signed certificate the client trusts): the connection is
    upgraded by the loop's start_tls and answers; keep-alive over TLS too."""
    import ssl
    import subprocess

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True,
    )  # fmt: skip
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(cert, key)
    trusted = ssl.create_default_context(cafile=str(cert))
    listening = await asyncio.start_server(_keep_alive, "127.0.0.1", 0, ssl=served)
    port = listening.sockets[0].getsockname()[1]
    transport = httpx.AsyncHTTPTransport(verify=trusted)
    kept = _Kept(transport._pool._network_backend)  # type: ignore[union-attr]
    transport._pool._network_backend = kept  # type: ignore[union-attr]
    async with listening, httpx.AsyncClient(transport=transport) as http:
        for _ in range(2):
            answer = await http.get(f"https://127.0.0.1:{port}/health")
            assert answer.json() == {}
    assert len(kept.streams) == 1
    assert kept.streams[0].get_extra_info("ssl_object") is not None


async def test_a_sender_whose_client_a_subclass_made_and_its_agent_copy() -> None:
    """A subclass that makes its own client (as /mcp's in-process one) sends through it, and
    ``as_agent``'s copy builds with its own client's headers, not the original's."""
    from pydantic import TypeAdapter

    from shellyard.sdk.base import AsyncSender, _requests_of, call

    async def echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen = {k.decode(): v.decode() for k, v in scope["headers"]}
        body = json.dumps({"path": scope["path"], "agent": seen.get("x-shellyard-agent")})
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body.encode()})

    class Own(AsyncSender):
        def __init__(self) -> None:
            self._http = httpx.AsyncClient(
                base_url="http://127.0.0.1", transport=httpx.ASGITransport(app=echo)
            )

    adapter = TypeAdapter(dict[str, Any])
    own = Own()
    assert await own._send(call("GET", "/v1/x", adapter)) == {"path": "/v1/x", "agent": None}
    agent = own.as_agent("agt_2")
    built = _requests_of(agent).build(call("GET", "/v1/y", adapter))
    assert built.headers.get("x-shellyard-agent") == "agt_2"
    assert "x-shellyard-agent" not in _requests_of(own).build(call("GET", "/v1/y", adapter)).headers
    assert await own._send(call("GET", "/v1/z", adapter)) == {"path": "/v1/z", "agent": None}
    await own.aclose()
    await agent.aclose()


async def _keep_alive_calls() -> None:
    """Three calls on one kept connection."""
    async with (
        serving(_keep_alive) as url,
        httpx.AsyncClient(base_url=url, transport=wire.async_transport()) as http,
    ):
        for _ in range(3):
            assert (await http.get("/health")).json() == {}


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_the_sockets_work_on_each_loop_the_product_runs(loop: str, tmp_path: Any) -> None:
    """The tests above run on pytest's asyncio loop; ``shellyard mcp`` runs the SDK on uvloop
    (shellyard/loops.py), whose transports are not instances of asyncio.Transport: each
    socket test again, on each loop."""
    run_each_on(
        loop,
        (
            _keep_alive_calls,
            test_a_read_past_its_timeout_is_a_read_timeout,
            test_a_refused_connection_is_a_connect_error,
            test_a_kept_connection_the_server_closed_is_not_reused,
            test_a_slowly_read_download_is_held_back_by_the_socket,
            lambda: test_https_goes_through_start_tls(tmp_path),
        ),
    )
