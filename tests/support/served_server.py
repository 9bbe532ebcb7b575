"""A real ``shellyard serve`` of its own (a fresh home, its own process) with an admin and a
session token, for the door tests that attack a server from outside (docs/security.md)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from conftest import make_home
from shellyard.home import ensure_server, read_info


@dataclass
class Served:
    url: str
    pid: int
    admin: dict[str, str]
    session: dict[str, str]
    home: Path


@contextlib.contextmanager
def served_server(env: Mapping[str, str] | None = None) -> Iterator[Served]:
    """The server runs with ``env`` set while it starts (the test process's own environment is
    put back after); it is stopped at the end, SIGKILL after 10 s for one stuck under the GIL."""
    home = make_home()
    saved = {key: os.environ.get(key) for key in env or {}}
    os.environ.update(env or {})
    try:
        info = ensure_server(home)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    admin = {"Authorization": f"Bearer {info.token}"}
    made = httpx.post(f"{info.url}/v1/sessions", headers=admin, timeout=60).json()
    token = httpx.post(
        f"{info.url}/v1/tokens",
        json={"kind": "session", "session_id": made["session_id"]},
        headers=admin,
        timeout=60,
    ).json()["token"]
    try:
        yield Served(info.url, info.pid, admin, {"Authorization": f"Bearer {token}"}, home)
    finally:
        current = read_info(home)
        pid = current.pid if current is not None else info.pid
        try:
            os.kill(pid, signal.SIGTERM)
            for _ in range(100):
                os.kill(pid, 0)
                time.sleep(0.1)
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def upload(
    served: Served, path: str, content: bytes | Iterable[bytes], timeout: float
) -> httpx.Response:
    """``PUT /v1/files/content`` of ``content`` (bytes, or an iterable streamed as it is
    made: chunked) to ``path`` in the session's workspace, with the session's token."""
    return httpx.put(
        f"{served.url}/v1/files/content",
        params={"path": path},
        content=content,
        headers=served.session,
        timeout=timeout,
    )
