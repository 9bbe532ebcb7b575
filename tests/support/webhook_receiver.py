"""A real HTTP webhook receiver on 127.0.0.1 (a thread), answering with scripted statuses and
recording every request it got: headers, body, and the status it answered."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    status: int

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class WebhookReceiver:
    #: Statuses to answer, in order; after the last one, ``then`` for every request.
    statuses: list[int] = field(default_factory=list)
    then: int = 200
    received: list[Received] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    @property
    def exception(self) -> str:
        """The operator exception that lets webhooks reach this receiver: it listens on the
        host's loopback, which the address rules refuse (SHELLYARD_WEBHOOK_EXCEPTIONS)."""
        assert self._server is not None
        return f"127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> WebhookReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver._lock:
                    index = len(receiver.received)
                    status = (
                        receiver.statuses[index]
                        if index < len(receiver.statuses)
                        else receiver.then
                    )
                    receiver.received.append(Received(dict(self.headers.items()), body, status))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def wait_for(self, count: int, timeout_s: float = 30.0) -> list[Received]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.received) >= count:
                    return list(self.received)
            time.sleep(0.02)
        raise AssertionError(f"expected {count} webhook requests, got {len(self.received)}")
