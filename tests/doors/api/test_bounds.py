"""Limits at each door (docs/security.md "Limits at each door"; R2, T1): an attack through one
door must not stall the other clients or grow the server's memory without bound.

A real server (its own process, a fresh home) is attacked by one session's token while a
second client probes ``/healthz``; the probe's worst latency and the server's peak resident
size (``VmHWM`` of /proc) are read during the attack. Each attack is refused with a message
that says what was wrong."""

from __future__ import annotations

import bz2
import io
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from proc_memory import peak_resident
from served_server import Served, served_server

#: The other client's worst answer time while an attack runs (the probe is a trivial route).
PROBE_BOUND_S = 2.0


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with served_server() as server:
        yield server


def during(served: Served, attack: Callable[[], httpx.Response]) -> tuple[httpx.Response, float]:
    """Run ``attack`` in a thread while the main thread probes /healthz; (its answer, the
    probe's worst latency)."""
    result: list[httpx.Response] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            result.append(attack())
        except BaseException as exc:  # reported below
            failed.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    worst = 0.0
    with httpx.Client(base_url=served.url, timeout=120) as probe:
        while thread.is_alive():
            started = time.monotonic()
            assert probe.get("/healthz").status_code == 200
            worst = max(worst, time.monotonic() - started)
            time.sleep(0.1)
    thread.join()
    if failed:
        raise failed[0]
    return result[0], worst


def upload(served: Served, body: bytes) -> Callable[[], httpx.Response]:
    def send() -> httpx.Response:
        return httpx.post(
            f"{served.url}/v1/files/archive",
            params={"path": "up"},
            content=body,
            headers=served.session,
            timeout=600,
        )

    return send


def meta_header(kind: bytes, payload_size: int) -> bytes:
    info = tarfile.TarInfo("././@LongLink" if kind in (b"L", b"K") else "././@PaxHeader")
    info.type, info.size = kind, payload_size
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def one_file(name: str = "a.txt") -> bytes:
    info = tarfile.TarInfo(name)
    info.size = 1
    return info.tobuf(format=tarfile.USTAR_FORMAT) + b"x" + bytes(511) + bytes(1024)


def error_of(response: httpx.Response) -> dict[str, Any]:
    error: dict[str, Any] = response.json()["error"]
    return error


def test_pax_header_of_digits_stalls_no_one(served: Served) -> None:
    """CVE-2024-6232: a pax header of 64,000 digits (a few hundred bytes compressed) made
    tarfile's regular expressions run for seconds holding the GIL; the scan refuses it
    before tarfile sees it, and /healthz answers meanwhile."""
    payload = b"1" * 64_000
    tar = meta_header(b"x", len(payload)) + payload + bytes(-len(payload) % 512) + one_file()
    body = bz2.compress(tar)
    assert len(body) < 1000
    response, worst = during(served, upload(served, body))
    assert response.status_code == 400, response.text
    assert "digits" in error_of(response)["message"]
    assert worst < PROBE_BOUND_S, f"/healthz took {worst:.1f} s during the upload"


def test_long_name_header_of_a_large_declared_size_is_not_read_into_memory(
    served: Served,
) -> None:
    """A GNU long-name header declaring 400 MB (zeros, a few hundred bytes compressed) was
    read whole into memory; it is refused at its header and the peak RSS stays put."""
    declared = 400 << 20
    compressor = bz2.BZ2Compressor()
    parts = [compressor.compress(meta_header(b"L", declared))]
    zeros = bytes(1 << 20)
    for _ in range(declared >> 20):
        parts.append(compressor.compress(zeros))
    parts.append(compressor.compress(one_file()))
    parts.append(compressor.flush())
    body = b"".join(parts)
    assert len(body) < 4 << 20
    before = peak_resident(served.pid)
    response, worst = during(served, upload(served, body))
    grown = peak_resident(served.pid) - before
    assert response.status_code == 400, response.text
    assert "extended header" in error_of(response)["message"]
    assert grown < 100 << 20, f"the server's peak RSS grew by {grown >> 20} MB"
    assert worst < PROBE_BOUND_S


def test_a_pax_header_past_the_bound_is_refused(served: Served) -> None:
    payload = b"20 comment=" + b"a" * 8 + b"\n"
    big = meta_header(b"x", 10 << 20)
    response = upload(served, big + payload)()
    assert response.status_code == 400 and "extended header" in error_of(response)["message"]


def test_an_upload_past_the_quota_is_refused_at_its_header(served: Served) -> None:
    """A member declaring more than the workspace quota (10 GiB by default) is refused before
    any byte of it is written (413 too_large); nothing is unpacked."""
    info = tarfile.TarInfo("huge.bin")
    info.size = 11 << 30
    header = info.tobuf(format=tarfile.GNU_FORMAT)
    response = upload(served, bz2.compress(header + bytes(1 << 20)))()
    assert response.status_code == 413, response.text
    assert error_of(response)["code"] == "too_large"
    listing = httpx.get(
        f"{served.url}/v1/files", params={"path": ""}, headers=served.session, timeout=60
    )
    assert "huge.bin" not in listing.text


def test_a_good_archive_still_unpacks(served: Served) -> None:
    """Every format tarfile writes (ustar, GNU with long names, pax), each compression."""
    for fmt in (tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        for mode in ("w", "w:gz", "w:bz2", "w:xz"):
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode=mode, format=fmt) as tar:  # type: ignore[call-overload]
                long_name = "d/" + "n" * 150 + ".txt" if fmt != tarfile.USTAR_FORMAT else "d/n.txt"
                info = tarfile.TarInfo(long_name)
                info.size = 3
                tar.addfile(info, io.BytesIO(b"abc"))
            response = upload(served, buf.getvalue())()
            assert response.status_code == 200, (fmt, mode, response.text)
            got = httpx.get(
                f"{served.url}/v1/files/content",
                params={"path": f"up/{long_name}"},
                headers=served.session,
                timeout=60,
            )
            assert got.content == b"abc", (fmt, mode)


def test_a_glob_of_repeated_double_stars_stalls_no_one(served: Served) -> None:
    """``**`` 14 times over a 14-deep folder, matching nothing: the recursive matcher ran for
    a minute on the event loop; now it answers at once (not found) and /healthz meanwhile."""
    deep = "/".join(f"d{i}" for i in range(14))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(f"{deep}/f.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"f"))
    assert upload(served, buf.getvalue())().status_code == 200
    ws = httpx.get(f"{served.url}/v1/workspaces", headers=served.session, timeout=60).json()
    workspace = ws[0]["workspace_id"]

    def transfer() -> httpx.Response:
        return httpx.post(
            f"{served.url}/v1/transfers",
            json={
                "source_workspace_id": workspace,
                "paths": ["up/" + "**/" * 14 + "nothing"],
                "target_workspace_id": workspace,
                "target_folder": "copy",
            },
            headers=served.session,
            timeout=600,
        )

    response, worst = during(served, transfer)
    assert response.status_code == 404, response.text
    assert "matches nothing" in error_of(response)["message"]
    assert worst < PROBE_BOUND_S, f"/healthz took {worst:.1f} s during the transfer"


def raw_post(served: Served, path: str, total: int, headers: dict[str, str]) -> tuple[str, int]:
    """POST ``total`` bytes of JSON-ish body over a plain socket, stopping as soon as the
    server answers; (the status line and headers, bytes of body sent by then)."""
    import select
    import socket
    from urllib.parse import urlsplit

    where = urlsplit(served.url)
    sock = socket.create_connection((where.hostname, where.port), timeout=60)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {total}\r\n{head}\r\n".encode()
    )
    chunk = b"[" + b"1," * (1 << 19)
    sent = 0
    answer = b""
    try:
        while sent < total:
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                break
            piece = chunk[: min(len(chunk), total - sent)]
            try:
                sock.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(piece)
        sock.settimeout(120)
        while b"\r\n\r\n" not in answer:
            data = sock.recv(65536)
            if not data:
                break
            answer += data
    finally:
        sock.close()
    return answer.split(b"\r\n\r\n", 1)[0].decode(), sent


def test_a_large_body_without_a_token_is_refused_before_it_is_read(served: Served) -> None:
    """256 MiB of JSON with no token: answered 401 before the body is read (the client
    has sent only a small part when the answer comes), and the peak RSS stays put."""
    total = 256 << 20
    before = peak_resident(served.pid)
    status, sent = raw_post(served, "/v1/executions", total, {})
    grown = peak_resident(served.pid) - before
    assert status.startswith("HTTP/1.1 401"), status
    assert sent < total // 2, f"the server read {sent >> 20} MiB before answering"
    assert grown < 64 << 20, f"the server's peak RSS grew by {grown >> 20} MB"


def test_a_json_body_past_its_bound_is_refused(served: Served) -> None:
    """With a token: a declared length past the bound is refused at once (413), and so is a
    chunked body (no declared length) once it grows past it."""
    status, sent = raw_post(served, "/v1/executions", 64 << 20, served.session)
    assert status.startswith("HTTP/1.1 413"), status
    assert sent < 32 << 20

    def chunks() -> Iterator[bytes]:
        for _ in range(32):
            yield b" " * (1 << 20)

    response = httpx.post(
        f"{served.url}/v1/executions", content=chunks(), headers=served.session, timeout=120
    )
    assert response.status_code == 413, response.text
    assert error_of(response)["code"] == "too_large"
    small = httpx.post(
        f"{served.url}/v1/executions",
        json={"command": "true"},
        headers=served.session,
        timeout=120,
    )
    assert small.status_code == 200, small.text


def connect(served: Served) -> Any:
    import socket
    from urllib.parse import urlsplit

    where = urlsplit(served.url)
    return socket.create_connection((where.hostname, where.port), timeout=60)


def test_a_client_slow_to_send_its_headers_is_closed(served: Served) -> None:
    """A byte of headers every second never completes a request: the server answers 408
    and closes the socket at its header deadline (10 s), not never. The wait is bounded by
    time, and once the answer begins it is read to its end: reading it a byte per send
    could use every try before the kernel's reset arrived on a loaded machine (CI of
    3ff602d)."""
    from shellyard.api.connections import HEADER_TIMEOUT_S

    sock = connect(served)
    sock.settimeout(1)
    closed = False
    answer = b""
    try:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        give_up = time.monotonic() + HEADER_TIMEOUT_S * 4
        while time.monotonic() < give_up:
            try:
                sock.sendall(b"X")
                answer = sock.recv(1)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            sock.settimeout(HEADER_TIMEOUT_S)
            answer += _head_answer(sock)
            closed = True
            break
    finally:
        sock.close()
    assert closed, "the server kept a connection that never finished its headers"
    # a reset may cut the answer short, never change it
    assert b"HTTP/1.1 408".startswith(answer[:12]), answer[:200]


def _head_answer(sock: Any) -> bytes:
    """What the server sent before it closed ``sock`` (or b"" if it closed at once)."""
    answer = b""
    try:
        while chunk := sock.recv(65536):
            answer += chunk
    except (ConnectionResetError, BrokenPipeError):
        pass
    return answer


def test_a_header_block_past_its_bound_is_refused(served: Served) -> None:
    """Request line and headers past MAX_HEAD_BYTES (16 KiB) are answered 400 and the
    connection is closed, whether they arrive whole in one read (h11 parsed those up to its
    64 KiB read: the bound was only on an incomplete block) or a header that never ends
    trickles in; a block just under the bound is served."""
    from shellyard.api.connections import MAX_HEAD_BYTES

    def request(filler: int) -> bytes:
        return (
            f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Filler: {'a' * filler}\r\n\r\n"
        ).encode()

    sock = connect(served)
    try:
        sock.sendall(request(MAX_HEAD_BYTES - 200))
        assert sock.recv(65536).startswith(b"HTTP/1.1 200"), "a block under the bound"
    finally:
        sock.close()
    for grown in (MAX_HEAD_BYTES + 1, 60 << 10):
        sock = connect(served)
        try:
            sock.sendall(request(grown))
            assert _head_answer(sock).startswith(b"HTTP/1.1 400"), grown
        finally:
            sock.close()
    # A header whose value never ends, 1 KiB at a time: refused once past the bound, long
    # before the header deadline, without waiting for the value's end.
    sock = connect(served)
    sock.settimeout(HEADER_WAIT_S)
    started = time.monotonic()
    try:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Filler: ")
        try:
            for _ in range(64):
                sock.sendall(b"a" * 1024)
                time.sleep(0.01)
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = _head_answer(sock)
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 400"), answer[:100]
    assert time.monotonic() - started < HEADER_WAIT_S


#: Well under the header deadline (10 s): the size bound acts first.
HEADER_WAIT_S = 5.0


def test_connections_from_one_client_are_capped(served: Served) -> None:
    """Past the cap per client address, new connections are closed at once; once they are
    gone the client is served again."""
    from shellyard.api.connections import MAX_CONNECTIONS_PER_CLIENT

    socks = [connect(served) for _ in range(MAX_CONNECTIONS_PER_CLIENT + 20)]
    try:
        last = socks[-1]
        last.settimeout(30)
        try:
            last.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            answer = last.recv(100)
        except (BrokenPipeError, ConnectionResetError):
            answer = b""
        assert answer == b"", f"connection past the cap was served: {answer!r}"
    finally:
        for sock in socks:
            sock.close()
    time.sleep(0.5)
    assert httpx.get(f"{served.url}/healthz", timeout=30).status_code == 200


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "bounds-test", "version": "1"},
    },
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream"}
#: mcp/http.py's MAX_SESSIONS_PER_TOKEN, written out so the test also runs without the cap.
MAX_SESSIONS_PER_TOKEN = 32


def test_mcp_sessions_per_token_are_capped(served: Served) -> None:
    """One token opens sessions and never closes them: past the cap per token a new one is
    refused (429 too_many, saying what to do); closing one makes room; another token is not
    affected."""
    with httpx.Client(base_url=served.url, timeout=60) as client:

        def open_session(auth: dict[str, str]) -> httpx.Response:
            return client.post("/mcp", json=INITIALIZE, headers={**auth, **MCP_HEADERS})

        opened = []
        for _ in range(MAX_SESSIONS_PER_TOKEN):
            response = open_session(served.session)
            assert response.status_code == 200, response.text
            opened.append(response.headers["mcp-session-id"])
        refused = open_session(served.session)
        assert refused.status_code == 429, refused.text
        assert error_of(refused)["code"] == "too_many"
        assert "close one" in error_of(refused)["message"]
        assert open_session(served.admin).status_code == 200
        closed = client.delete(
            "/mcp", headers={**served.session, **MCP_HEADERS, "mcp-session-id": opened[0]}
        )
        assert closed.status_code < 300, closed.text
        assert open_session(served.session).status_code == 200


@pytest.mark.parametrize("route", ["/v1/timers", "/v1/inbox"])
def test_lists_come_in_pages(served: Served, route: str) -> None:
    """N1, N5: GET /v1/timers and /v1/inbox answer one page (``limit``, at most 5000); a
    full page names the next one's start (X-Shellyard-Next-After), and following it gives
    every item once, in order. The SDK takes the same ``after``."""
    from shellyard.sdk.client import Client

    with httpx.Client(base_url=served.url, headers=served.session, timeout=60) as client:
        for i in range(5):
            made = client.post("/v1/timers", json={"text": f"t{i}", "after_ms": 1 + i})
            assert made.status_code == 200, made.text
        if route == "/v1/inbox":  # the timers fire into the inbox: every one of the module's
            for _ in range(300):  # (the other case's too), or the listing grows under the pages
                timers = client.get("/v1/timers").json()
                fired = all(t["state"] != "pending" for t in timers)
                if fired and len(client.get(route).json()) >= 5:
                    break
                time.sleep(0.1)
        everything = client.get(route).json()
        key = "timer_id" if route == "/v1/timers" else "notice_id"
        assert len(everything) >= 5
        seen: list[str] = []
        after: str | None = None
        while True:
            page = client.get(route, params={"limit": 2, **({"after": after} if after else {})})
            assert page.status_code == 200, page.text
            items = page.json()
            assert len(items) <= 2
            seen += [item[key] for item in items]
            after = page.headers.get("x-shellyard-next-after")
            if after is None:
                break
            assert after == items[-1][key]
        assert seen == [item[key] for item in everything]
        assert client.get(route, params={"limit": 5001}).status_code == 400
    sdk = Client(served.url, served.session["Authorization"].split()[1])
    listing = sdk.timer_list(None, None, 2) if route == "/v1/timers" else sdk.inbox(False, None, 2)
    assert len(listing) == 2
