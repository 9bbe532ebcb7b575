"""A request's whole time and an unsupported upgrade, over raw sockets against a real server
(its own process and home; api/connections.py, docs/security.md "Limits at each door").

The server runs with ``SHELLYARD_BODY_TIMEOUT_S`` at 2 s (60 by default) so the body's bound
is met quickly; its idle bound (``SHELLYARD_BODY_IDLE_S``, 30 s) is never met here: the slow
clients send a byte well within it. Bounds asserted are generous: what is checked is that the
connection is answered and freed, not how fast."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from raw_http import answers, connect, received
from served_server import Served, served_server, upload

from shellyard.api.connections import HEADER_TIMEOUT_S

pytestmark = pytest.mark.timeout(300)

BODY_TIMEOUT_S = 2.0
MIB = 1 << 20
HOST = b"Host: 127.0.0.1\r\n"


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with served_server({"SHELLYARD_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S)}) as server:
        yield server


def trickle(sock: socket.socket, piece: bytes, every_s: float, most: int) -> bytes:
    """``piece`` every ``every_s`` until the server answers and closes (its answer), or
    ``most`` pieces were sent (b"")."""
    sock.settimeout(every_s)
    answer = b""
    for _ in range(most):
        try:
            sock.sendall(piece)
        except (BrokenPipeError, ConnectionResetError):
            break
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            break
        if not chunk:
            return answer
        answer += chunk
    rest, closed = received(sock, 5)
    return answer + rest if closed else b""


def listed(served: Served) -> list[str]:
    listing = httpx.get(f"{served.url}/v1/files", headers=served.session, timeout=30)
    return [entry["path"] for entry in listing.json()["entries"]]


def test_a_body_at_a_byte_a_second_is_answered_408_and_closed(served: Served) -> None:
    """A body that keeps coming, a byte at a time (so its idle deadline never comes), is
    answered 408 saying what to do once its time is spent, and the connection is freed;
    nothing of the upload lands. (It held the connection for as long as it declared.)"""
    sock = connect(served)
    try:
        sock.sendall(
            b"PUT /v1/files/content?path=trickle.bin HTTP/1.1\r\n" + HOST
            + f"Authorization: {served.session['Authorization']}\r\n".encode()
            + b"Content-Length: 100000\r\n\r\n"
        )  # fmt: skip
        # 60 bytes at 0.5 s: 30 s, the idle deadline; the body's is 2 s + 60 bytes' worth
        answer = trickle(sock, b"x", 0.5, 60)
    finally:
        sock.close()
    assert answers(answer) == [b"HTTP/1.1 408 Request Timeout"], answer
    assert b"send the body at least" in answer and b"connection: close" in answer, answer
    assert "trickle.bin" not in listed(served)


def test_headers_at_a_byte_a_second_are_answered_408_and_closed(served: Served) -> None:
    """A request whose headers come a byte a second (the bytes do not move the header
    deadline) is answered 408 at HEADER_TIMEOUT_S and closed."""
    sock = connect(served)
    try:
        sock.sendall(b"GET /healthz HTTP/1.1\r\n" + HOST + b"X-Slow: ")
        answer = trickle(sock, b"a", 1.0, int(HEADER_TIMEOUT_S * 3))
    finally:
        sock.close()
    assert answers(answer) == [b"HTTP/1.1 408 Request Timeout"], answer
    assert b"headers were not complete" in answer, answer


def test_a_big_upload_at_full_speed_passes_the_body_bound(served: Served) -> None:
    """32 MiB streamed in 1 MiB pieces takes longer than BODY_TIMEOUT_S on a loaded machine
    and still lands: each 64 KiB received earns a second."""

    def body() -> Iterator[bytes]:
        for _ in range(32):
            yield b"y" * MIB

    answer = upload(served, "big.bin", body(), 120)
    assert answer.status_code == 200, answer.text
    assert "big.bin" in listed(served)


def test_a_request_behind_an_h2c_upgrade_in_the_same_read_is_answered(served: Served) -> None:
    """``Upgrade: h2c`` is ignored (no HTTP/2 here): the request is answered as HTTP/1.1 and
    the one pipelined behind it in the same read is answered too (it was dropped)."""
    sock = connect(served)
    try:
        sock.sendall(
            b"GET /healthz HTTP/1.1\r\n" + HOST + b"Connection: Upgrade, HTTP2-Settings\r\n"
            b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"
            b"GET /healthz HTTP/1.1\r\n" + HOST + b"\r\n"
        )  # fmt: skip
        answer, _ = received(sock, 3)
    finally:
        sock.close()
    assert answers(answer) == [b"HTTP/1.1 200 OK"] * 2, answer


@pytest.mark.parametrize("apart", [False, True], ids=["one-read", "body-later"])
def test_an_h2c_upgrade_with_a_body_is_framed_as_any_request(served: Served, apart: bool) -> None:
    """An upgrade request's body is its body (llhttp skipped it and read it as the next
    request: an upload got an empty body, and a body holding a request was answered as one);
    the request behind it is answered."""
    auth = f"Authorization: {served.session['Authorization']}\r\n".encode()
    inner = b"GET /healthz HTTP/1.1\r\n" + HOST + b"\r\n"
    head = (
        b"PUT /v1/files/content?path=upgraded.txt HTTP/1.1\r\n" + HOST + auth
        + b"Connection: Upgrade\r\nUpgrade: h2c\r\n"
        + f"Content-Length: {len(inner)}\r\n\r\n".encode()
    )  # fmt: skip
    after = b"GET /v1/files/content?path=upgraded.txt HTTP/1.1\r\n" + HOST + auth + b"\r\n"
    sock = connect(served)
    try:
        if apart:
            sock.sendall(head)
            time.sleep(0.5)
            sock.sendall(inner + after)
        else:
            sock.sendall(head + inner + after)
        answer, _ = received(sock, 3)
    finally:
        sock.close()
    assert answers(answer) == [b"HTTP/1.1 200 OK"] * 2, answer
    assert answer.endswith(inner), answer


def test_connect_is_refused(served: Served) -> None:
    """CONNECT (an upgrade that cannot be ignored) is a 400, and the connection closed."""
    sock = connect(served)
    try:
        sock.sendall(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n" + HOST)
        answer, closed = received(sock, 3)
    finally:
        sock.close()
    assert answers(answer) == [b"HTTP/1.1 400 Bad Request"] and closed, answer


def test_an_upload_that_waits_for_100_continue_is_served(served: Served) -> None:
    """Held: a client that sends its body only after ``100 Continue`` (asked for when the
    application first reads) is served; its wait is not counted against it."""
    body = b"z" * 1000
    sock = connect(served)
    try:
        sock.sendall(
            b"PUT /v1/files/content?path=continued.bin HTTP/1.1\r\n" + HOST
            + f"Authorization: {served.session['Authorization']}\r\n".encode()
            + f"Expect: 100-continue\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        )  # fmt: skip
        sock.settimeout(30)
        interim = sock.recv(65536)
        assert interim.startswith(b"HTTP/1.1 100 Continue"), interim
        sock.sendall(body)
        answer, _ = received(sock, 3)
    finally:
        sock.close()
    assert answers(interim + answer)[-1] == b"HTTP/1.1 200 OK", answer
    assert "continued.bin" in listed(served)
