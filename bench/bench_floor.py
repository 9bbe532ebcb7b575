"""The floor under "server CPU per foreground run_shell(true)": what the pieces every run needs
cost on this machine by themselves, with none of shellyard's code.

Each floor is a server process of its own (uvicorn with h11 and the asyncio loop, as
``shellyard serve`` runs: no uvloop or httptools here), driven over one keep-alive connection
by ``httpx`` (as the SDK does) with a small JSON body; its own CPU (utime + stime) per request.
The servers are driven in alternating batches (``bench_cpu._alternate``), so all see the same
load:

- ``starlette``: a bare Starlette route that reads the JSON body and answers a small JSON;
- ``fastapi``: a FastAPI route with the body as a dict, one header dependency and a pydantic
  response model (what a FastAPI route of the usual shape costs);
- ``fastapi_commit``: the same plus one SQLite ``INSERT`` and commit (WAL, synchronous=NORMAL,
  the store's pragmas) through the ``sqlite3`` module directly;
- ``fastapi_commit3``: three such transactions (shellyard's count per foreground run:
  submit, start, finish);
- ``fastapi_commit3_spawn``: the same and a minimal bwrap spawn (``bench/common.py``
  ``MINIMAL_BWRAP``) started with ``subprocess.Popen`` on the loop and its exit read through a
  pidfd: the parent's side of one sandboxed ``true``. The children's CPU is reported apart.

    PYTHONPATH=src:bench .venv/bin/python bench/bench_floor.py [--quick] [--out PATH]
"""

# No `from __future__ import annotations`: FastAPI reads the route's local types at runtime.

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import httpx

from bench_cpu import _alternate, cpu_split
from common import MINIMAL_BWRAP, PYTHON, cli, make_home, metric, remove_home

MODES = ("starlette", "fastapi", "fastapi_commit", "fastapi_commit3", "fastapi_commit3_spawn")


# ----------------------------------------------------------------------------- the servers


def _database(path: Path) -> Any:
    import sqlite3

    db = sqlite3.connect(path, isolation_level=None)
    for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "foreign_keys=ON"):
        db.execute(f"PRAGMA {pragma}")
    db.execute("CREATE TABLE IF NOT EXISTS runs (id TEXT PRIMARY KEY, command TEXT, state TEXT)")
    return db


def _app(mode: str, folder: Path) -> Any:
    if mode == "starlette":
        import json

        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import Response
        from starlette.routing import Route

        async def bare(request: Request) -> Response:
            body = json.loads(await request.body())
            answer = {"execution_id": "ex_0", "state": "completed", "command": body["command"]}
            return Response(json.dumps(answer), media_type="application/json")

        return Starlette(routes=[Route("/v1/executions", bare, methods=["POST"])])

    from fastapi import Depends, FastAPI, Header
    from pydantic import BaseModel

    class Answer(BaseModel):
        execution_id: str
        state: str
        command: str
        exit_code: int | None = None

    app = FastAPI()
    db = _database(folder / "floor.db") if "commit" in mode else None
    transactions = 3 if "commit3" in mode else 1
    bwrap = [_find_bwrap(), *MINIMAL_BWRAP] if mode.endswith("spawn") else None
    counter = iter(range(1 << 62))

    async def token(authorization: Annotated[str | None, Header()] = None) -> str:
        return authorization or ""

    async def spawn(argv: list[str]) -> int:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        fd = os.pidfd_open(child.pid)
        loop = asyncio.get_running_loop()
        ended = loop.create_future()
        loop.add_reader(fd, ended.set_result, None)
        try:
            await ended
        finally:
            loop.remove_reader(fd)
            os.close(fd)
        return child.wait()

    @app.post("/v1/executions")
    async def run(body: dict[str, object], who: Annotated[str, Depends(token)]) -> Answer:
        key = f"ex_{next(counter)}"
        code = None
        for step in range(transactions):
            if db is not None:
                db.execute("BEGIN")
                db.execute(
                    "INSERT OR REPLACE INTO runs VALUES (?, ?, ?)", (key, str(body), str(step))
                )
                db.execute("COMMIT")
            if step == 0 and bwrap is not None:
                code = await spawn(bwrap)
        return Answer(execution_id=key, state="completed", command=str(body), exit_code=code)

    return app


def _find_bwrap() -> str:
    from shellyard.runner.sandbox import bwrap as sandbox

    return sandbox.find_bwrap()


def serve(mode: str, fd: int, folder: Path) -> None:
    import uvicorn

    sock = socket.socket(fileno=fd)
    config = uvicorn.Config(
        _app(mode, folder), http="h11", loop="asyncio", access_log=False, log_level="warning"
    )
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


# ----------------------------------------------------------------------------- the driver


class Floor:
    def __init__(self, mode: str, folder: Path) -> None:
        self.mode = mode
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.process = subprocess.Popen(
            [PYTHON, __file__, "--serve", mode, str(sock.fileno()), str(folder)],
            pass_fds=[sock.fileno()],
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        sock.close()

    def cpu(self) -> dict[str, float]:
        own, children = cpu_split(self.process.pid)
        return {"server_ms": own, "children_ms": children}

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


async def _drive(runs: int) -> dict[str, Any]:
    home = make_home()
    floors = [Floor(mode, home) for mode in MODES]
    clients = [httpx.AsyncClient(base_url=f.url, timeout=60) for f in floors]
    try:
        for client in clients:
            for _ in range(100):  # up
                try:
                    await client.get("/none")
                    break
                except httpx.TransportError:
                    await asyncio.sleep(0.1)
        sides = []
        for client in clients:

            async def once(client: httpx.AsyncClient = client) -> None:
                answer = await client.post(
                    "/v1/executions", json={"command": "true"}, headers={"Authorization": "x"}
                )
                answer.raise_for_status()

            sides.append(once)
        used = await _alternate(
            [(once, f.cpu) for once, f in zip(sides, floors, strict=True)], runs
        )
        return dict(zip(MODES, used, strict=True))
    finally:
        for client in clients:
            await client.aclose()
        for floor in floors:
            floor.stop()
        remove_home(home)


def run(args: argparse.Namespace) -> dict[str, Any]:
    runs = 200 if args.quick else 1000
    load_before = os.getloadavg()
    began = time.monotonic()
    floors = asyncio.run(_drive(runs))
    spawn = floors["fastapi_commit3_spawn"]["server_ms"] - floors["fastapi_commit3"]["server_ms"]
    metrics = [
        metric(
            f"floor.{mode}",
            f"server CPU per request, {mode.replace('_', ' + ')}, ms",
            side["server_ms"],
            "ms",
            target="info (the floor)",
            kind="info",
        )
        for mode, side in floors.items()
    ]
    return {
        "name": "floor",
        "title": "The floor of one foreground run: bare HTTP, SQLite commits, a spawn's parent",
        "command": "python bench/bench_floor.py" + (" --quick" if args.quick else ""),
        "metrics": metrics,
        "details": {
            "runs": runs,
            "floors": floors,
            "spawn_parent_ms": spawn,
            "seconds": time.monotonic() - began,
            "load_average": [load_before, os.getloadavg()],
        },
    }


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve(sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]))
    else:
        cli("floor", run, __doc__ or "")
