"""Helpers of the web page's tests (issue 14): a real ``shellyard serve`` on a fixed port (so
that a restart keeps the page's origin), how Debian's Chromium is launched, and admin calls
of the REST API that set the scene."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from shellyard.home import read_info

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def make_home() -> Path:
    """A home the sandbox uid can traverse (as tests/conftest.py makes them)."""
    path = Path(tempfile.mkdtemp(prefix="shellyard-web-", dir="/tmp"))
    path.chmod(0o711)
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Served:
    """A ``shellyard serve`` subprocess on ``port`` of ``home``."""

    home: Path
    port: int
    process: subprocess.Popen[bytes] | None = None
    token: str = ""
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.home / "serve.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "shellyard", "serve", "--port", str(self.port)],
                env={**os.environ, "SHELLYARD_HOME": str(self.home)},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            info = read_info(self.home)
            if info is not None and info.pid == self.process.pid:
                self.token = info.token
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"shellyard serve did not start:\n{self.log.read_text()}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.process = None

    def admin(self, agent: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token}"}
        if agent:
            headers["X-Shellyard-Agent"] = agent
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)

    def call(self, method: str, path: str, agent: str | None = None, **kw: Any) -> Any:
        with self.admin(agent) as client:
            response = client.request(method, path, **kw)
        assert response.status_code < 400, f"{method} {path}: {response.text}"
        return response.json()

    def login_url(self, session_id: str | None = None, token: str | None = None) -> str:
        """What ``shellyard ui --print-url`` prints (the CLI test checks that it does)."""
        body = {"session_id": session_id} if session_id else {}
        headers = {"Authorization": f"Bearer {token or self.token}"}
        response = httpx.post(f"{self.url}/v1/auth/codes", json=body, headers=headers)
        assert response.status_code == 200, response.text
        return f"{self.url}{response.json()['path']}"


def new_session(served: Served) -> dict[str, Any]:
    session: dict[str, Any] = served.call("POST", "/v1/sessions")
    return session


def run(served: Served, agent: str, command: str, **options: Any) -> dict[str, Any]:
    result: dict[str, Any] = served.call(
        "POST", "/v1/executions", agent, json={"command": command, **options}
    )
    return result


def png(width: int, height: int) -> bytes:
    """A real PNG (RGB, red/blue stripes) made with zlib, as an image library would."""
    rows = b"".join(
        b"\x00"
        + b"".join(b"\xff\x00\x00" if (x // 4) % 2 else b"\x00\x00\xff" for x in range(width))
        for _ in range(height)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def pdf(pages: int) -> bytes:
    """A real PDF of ``pages`` A6 pages, each a filled black square (what a plotting library
    writes, in miniature), with a correct cross-reference table."""
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>"]
    kids = " ".join(f"{3 + 2 * n} 0 R" for n in range(pages))
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {pages} >>".encode())
    square = b"0 0 0 rg 40 40 200 200 re f"
    for n in range(pages):
        page = f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 298 420] /Contents {4 + 2 * n} 0 R >>"
        objects.append(page.encode())
        objects.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(square), square))
    out = b"%PDF-1.4\n"
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return out


def upload(served: Served, agent: str, path: str, data: bytes) -> dict[str, Any]:
    with served.admin(agent) as client:
        answer = client.put("/v1/files/content", params={"path": path}, content=data)
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result
