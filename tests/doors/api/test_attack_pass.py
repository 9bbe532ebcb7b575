"""The second engineer's attack pass on bad input (docs/security.md "Attack pass on bad
input (second engineer)"; R2, T1, T2, W1): one session's token against a real server (its
own process, a fresh home), while a second client probes ``/healthz``; each attack is
refused with a message saying what was wrong, and the probe stays fast.

The server runs with a body deadline of 2 s (``SHELLYARD_BODY_IDLE_S``; 30 s by default)
and a workspace quota of 8 MiB so the bounds are reached quickly."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from served_server import Served, served_server, upload

PROBE_BOUND_S = 2.0
BODY_IDLE_S = 2.0
MIB = 1 << 20


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with served_server(
        {"SHELLYARD_BODY_IDLE_S": str(BODY_IDLE_S), "SHELLYARD_WORKSPACE_QUOTA": "8M"}
    ) as server:
        yield server


def during(served: Served, attack: Callable[[], Any]) -> tuple[Any, float]:
    """Run ``attack`` in a thread while this thread probes /healthz: (its result, the
    probe's worst latency)."""
    result: list[Any] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            result.append(attack())
        except BaseException as exc:  # re-raised below
            failed.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    worst = 0.0
    with httpx.Client(timeout=30) as probe:
        while thread.is_alive():
            started = time.monotonic()
            assert probe.get(f"{served.url}/healthz").status_code == 200
            worst = max(worst, time.monotonic() - started)
            time.sleep(0.05)
    thread.join()
    if failed:
        raise failed[0]
    return result[0], worst


def connect(served: Served) -> socket.socket:
    parts = urlsplit(served.url)
    return socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80))


def files(served: Served) -> list[str]:
    listing = httpx.get(
        f"{served.url}/v1/files",
        params={"path": "", "recursive": "true"},
        headers=served.session,
        timeout=60,
    )
    assert listing.status_code == 200, listing.text
    return [e["path"] for e in listing.json()["entries"]]


def test_a_body_sent_slowly_after_its_headers_is_closed(served: Served) -> None:
    """An upload whose body stops after 10 of its 1,000 declared bytes is closed at the body
    deadline (no progress for BODY_IDLE_S), not held open forever; nothing is written."""
    token = served.session["Authorization"]

    def attack() -> float:
        sock = connect(served)
        sock.settimeout(BODY_IDLE_S * 10)
        started = time.monotonic()
        try:
            sock.sendall(
                b"PUT /v1/files/content?path=slow.bin HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                + f"Authorization: {token}\r\n".encode()
                + b"Content-Length: 1000\r\n\r\n"
                + b"0123456789"
            )
            try:
                while sock.recv(4096):
                    pass  # an answer (if any) then the close
            except TimeoutError:
                return float("inf")
            except ConnectionResetError:
                pass
            return time.monotonic() - started
        finally:
            sock.close()

    waited, worst = during(served, attack)
    assert waited < BODY_IDLE_S * 10, "the server kept a body that never arrived"
    assert waited >= BODY_IDLE_S * 0.9
    assert worst < PROBE_BOUND_S
    assert "slow.bin" not in files(served)


def test_a_body_that_keeps_coming_is_not_cut(served: Served) -> None:
    """A slow but steady upload (a chunk every second, under the deadline) completes."""

    def body() -> Iterator[bytes]:
        for _ in range(4):
            yield b"x" * 1000
            time.sleep(BODY_IDLE_S / 2)

    answer = upload(served, "steady.bin", body(), 60)
    assert answer.status_code == 200, answer.text
    assert "steady.bin" in files(served)


def test_a_file_upload_past_the_quota_answers_413(served: Served) -> None:
    """W1/R2: a streamed upload past the room left under the quota is answered 413
    ``too_large`` with what to do, and leaves no file."""

    def attack() -> httpx.Response:
        def body() -> Iterator[bytes]:
            for _ in range(64):
                yield bytes(MIB)

        return upload(served, "big.bin", body(), 120)

    answer, worst = during(served, attack)
    assert answer.status_code == 413, answer.text
    assert answer.json()["error"]["code"] == "too_large"
    assert "room left under the workspace quota" in answer.json()["error"]["message"]
    assert worst < PROBE_BOUND_S
    assert "big.bin" not in files(served)


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/v1/files/move", '{"source": "\\ud800", "destination": "c"}'),
        ("/v1/executions", '{"command": "echo \\ud800"}'),
        ("/v1/files/delete", '{"path": "a\\udfff"}'),
    ],
)
def test_a_lone_surrogate_in_a_json_body_is_refused_not_a_500(
    served: Served, route: str, body: str
) -> None:
    """A JSON ``\\uD800`` escape (no text can hold it; Python's parser takes it) is refused
    with 400 saying what to send, not a 500 or a dropped connection; the server stays up."""
    answer = httpx.post(
        f"{served.url}{route}",
        content=body,
        headers={**served.session, "Content-Type": "application/json"},
        timeout=60,
    )
    assert answer.status_code == 400, answer.text
    assert "lone surrogate" in answer.json()["error"]["message"]
    assert httpx.get(f"{served.url}/healthz", timeout=10).status_code == 200


def test_an_error_quoting_a_name_that_is_not_utf8_is_not_a_500(served: Served) -> None:
    """A refusal whose message quotes a name's raw bytes (here: nothing to move) answers
    its own status with the ``\\udcNN`` escape, not a 500."""
    answer = httpx.post(
        f"{served.url}/v1/files/move",
        content='{"source": "nope/caf\\udce9", "destination": "c"}',
        headers={**served.session, "Content-Type": "application/json"},
        timeout=60,
    )
    assert answer.status_code == 404, answer.text
    assert answer.json()["error"]["code"] == "not_found"
