"""A served home (``shellyard serve`` in its own process, as ``ensure_server`` starts it)
whose volume fills: the server keeps answering with clean errors, the lines it cannot write to
``server.log`` are dropped (the process never dies of them), and once space comes back it
records, runs and logs again without a restart.

Contract: R2 (the free-space reserve), E1, E7; docs/limits.md "Full disk, long commands and
bounded records"; docs/operations.md (server.log). The home lives on a small tmpfs
(tests/support/tmpfs_fixture.py), filled from outside, as another program on the volume
would fill it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from tmpfs_fixture import mounted_tmpfs

from shellyard.api.connections import MAX_CONNECTIONS_PER_CLIENT
from shellyard.home import LOG_NAME, ServerInfo, ensure_server, is_served, read_info

pytestmark = pytest.mark.timeout(300)

MIB = 1 << 20


def _fill(path: Path) -> None:
    """Write ``path`` until the volume refuses a single block (unbuffered, so nothing is left
    to flush later)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (MIB, 4096):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, ServerInfo]]:
    with mounted_tmpfs("192M", "shellyard-served-full-") as volume:
        home = volume / "home"
        home.mkdir(mode=0o711)
        # info: every execution's end is a line of server.log (control/executions/state_log.py)
        monkeypatch.setenv("SHELLYARD_LOG_LEVEL", "info")
        # above the database's kept room (store/ballast.py, 32 MiB), which a full volume frees
        monkeypatch.setenv("SHELLYARD_FREE_SPACE_RESERVE", "48M")
        monkeypatch.delenv("SHELLYARD_HOME", raising=False)
        info = ensure_server(home)
        try:
            yield home, info
        finally:
            current = read_info(home)
            if current is not None and is_served(home):
                os.kill(current.pid, signal.SIGTERM)
                for _ in range(100):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(current.pid, 0)
                        time.sleep(0.1)
                        continue
                    break


#: What the server logs for each connection past its per-client cap (api/connections.py).
CAP_LINE = f"more than {MAX_CONNECTIONS_PER_CLIENT}"


def _over_the_connection_cap(info: ServerInfo, extra: int = 20) -> None:
    """Open ``extra`` connections past the per-client cap (each one a warning line of the
    server's log), see the server close them, then close them all."""
    address = urlsplit(info.url)
    opened = []
    try:
        for _ in range(MAX_CONNECTIONS_PER_CLIENT + extra):
            opened.append(socket.create_connection((address.hostname, address.port), timeout=10))
        time.sleep(0.5)  # the server refuses the late ones as they are accepted
        closed = 0
        for connection in opened[-extra:]:
            connection.settimeout(10)
            with contextlib.suppress(OSError):
                if connection.recv(1) == b"":
                    closed += 1
        assert closed == extra, f"{closed} of the {extra} connections past the cap were closed"
    finally:
        for connection in opened:
            connection.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_full_home_volume_keeps_the_server_answering_and_its_log_recovers(
    served: tuple[Path, ServerInfo],
) -> None:
    home, info = served
    log_file = home / LOG_NAME
    client = httpx.Client(
        base_url=info.url, headers={"Authorization": f"Bearer {info.token}"}, timeout=60
    )
    before = client.post("/v1/executions", json={"command": "echo before"})
    assert before.status_code == 200 and before.json()["stdout"] == "before\n", before.text
    earlier = before.json()["execution_id"]

    filler = home.parent / "filler"
    _fill(filler)
    refused_runs = 0
    for _ in range(30):  # each refused run is a record and a log line the volume cannot take
        started = time.monotonic()
        health = client.get("/health")
        assert health.status_code == 200 and time.monotonic() - started < 2.0
        run = client.post("/v1/executions", json={"command": "echo during"})
        assert run.status_code in (503, 507), run.text  # never 500, never a run
        code = run.json()["error"]["code"]
        assert code in ("low_on_space", "store_full"), run.text
        refused_runs += 1
        _fill(filler)  # whatever the service freed (its database's kept room) is taken again
    # Lines the service logs with no record to write (a client over its connection cap):
    # each meets the full volume; the server drops them and keeps answering.
    _over_the_connection_cap(info)
    assert client.get("/health").status_code == 200
    session = client.post("/v1/sessions", json={})
    assert session.status_code == 507, session.text
    assert session.json()["error"]["code"] == "store_full"
    assert "free space" in session.json()["error"]["message"]
    # Reads still answer, and what was recorded before is intact.
    status = client.get(f"/v1/executions/{earlier}")
    assert status.status_code == 200 and status.json()["state"] == "completed", status.text
    assert _alive(info.pid), "the server died on the full volume"
    assert refused_runs == 30

    filler.unlink()  # space comes back; no restart
    logged_at_recovery = log_file.stat().st_size
    session = client.post("/v1/sessions", json={})
    assert session.status_code == 200, session.text
    after = client.post("/v1/executions", json={"command": "echo after"})
    assert after.status_code == 200, after.text
    assert after.json()["state"] == "completed" and after.json()["stdout"] == "after\n"
    assert read_info(home) is not None and read_info(home).pid == info.pid  # type: ignore[union-attr]
    # The log takes lines again: the new execution's end is there.
    deadline = time.monotonic() + 10
    text = ""
    while time.monotonic() < deadline:
        text = log_file.read_bytes()[logged_at_recovery:].decode("utf-8", "replace")
        if after.json()["execution_id"] in text:
            break
        time.sleep(0.1)
    assert f"execution {after.json()['execution_id']} completed" in text, text[-2000:]
    _over_the_connection_cap(info)
    assert CAP_LINE in log_file.read_bytes()[logged_at_recovery:].decode("utf-8", "replace")
    assert earlier in log_file.read_text("utf-8", "replace")
