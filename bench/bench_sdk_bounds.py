"""The SDK's CPU per JSON call on each of its three paths (the lean client, the async httpx
path, the blocking ``Client``), against a loopback server in another process that answers at
once with a 300-byte JSON body on a kept connection: what the answer bounds of sdk/bounds.py
(a size count, a whole-answer clock per call) cost. Client process CPU per call, in
microseconds. Run old and new alternately (ABBA), an old revision by ``PYTHONPATH``:

    PYTHONPATH=src:bench .venv/bin/python bench/bench_sdk_bounds.py 3000
    PYTHONPATH=/tmp/old/src:bench .venv/bin/python bench/bench_sdk_bounds.py 3000
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from typing import Any

from pydantic import TypeAdapter

import shellyard.sdk.base as sdk_base
from bench_lean_call import SERVER
from shellyard.sdk.base import call
from shellyard.sdk.client import AsyncClient, Client

ANY = TypeAdapter(dict[str, Any])
REQUEST = call("GET", "/v1/executions/ex_1", ANY, {"wait_ms": 0})
WARM = 300


async def _async(url: str, calls: int, lean: bool) -> float:
    async with AsyncClient(url, "x") as client:
        if not lean:
            client._lean = None
        for _ in range(WARM):
            await client._send(REQUEST)
        start = time.process_time()
        for _ in range(calls):
            await client._send(REQUEST)
        return (time.process_time() - start) / calls * 1e6


def _sync(url: str, calls: int) -> float:
    with Client(url, "x") as client:
        for _ in range(WARM):
            client._send(REQUEST)
        start = time.process_time()
        for _ in range(calls):
            client._send(REQUEST)
        return (time.process_time() - start) / calls * 1e6


def main() -> None:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE)
    try:
        assert server.stdout is not None
        url = f"http://127.0.0.1:{int(server.stdout.readline())}"
        result = {
            "module": sdk_base.__file__,
            "calls": calls,
            "lean_us": asyncio.run(_async(url, calls, lean=True)),
            "async_httpx_us": asyncio.run(_async(url, calls, lean=False)),
            "sync_httpx_us": _sync(url, calls),
        }
    finally:
        server.kill()
        server.wait()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
