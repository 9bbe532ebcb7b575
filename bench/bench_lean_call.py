"""The lean SDK client's CPU per JSON call (sdk/lean.py ``LeanHttp.call``), against a
loopback server in another process that answers each request at once with a 300-byte JSON
body on a kept connection: the client's process CPU per call, in microseconds. Run old and
new alternately (ABBA); an old revision by ``PYTHONPATH`` (docs/benchmarks.md's rules):

    .venv/bin/python bench/bench_lean_call.py 5000
    PYTHONPATH=/tmp/old/src .venv/bin/python bench/bench_lean_call.py 5000
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

from shellyard.sdk import lean

SERVER = r"""
import asyncio
body = b'{"execution_id":"ex_0123456789abcdef","state":"completed","stdout":"' + b"x" * 200
body += b'"}'
head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
answer = head % len(body) + body

class Answers(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.buffer = transport, b""

    def data_received(self, data):
        self.buffer += data
        while b"\r\n\r\n" in self.buffer:
            _, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
            self.transport.write(answer)

async def main():
    server = await asyncio.get_running_loop().create_server(Answers, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


async def measure(calls: int) -> float:
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        client = lean.LeanHttp.for_url(f"http://127.0.0.1:{port}", {"Authorization": "Bearer x"})
        assert client is not None
        for _ in range(500):  # warm: the connection, the parser, the interpreter's caches
            await client.call("GET", "/v1/executions/ex_1", {"wait_ms": 0}, None, 30)
        start = time.process_time()
        for _ in range(calls):
            await client.call("GET", "/v1/executions/ex_1", {"wait_ms": 0}, None, 30)
        cpu = time.process_time() - start
        await client.aclose()
    finally:
        server.kill()
        server.wait()
    return cpu / calls * 1e6


def main() -> None:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    per_call = asyncio.run(measure(calls))
    print(json.dumps({"module": lean.__file__, "calls": calls, "cpu_us_per_call": per_call}))


if __name__ == "__main__":
    main()
