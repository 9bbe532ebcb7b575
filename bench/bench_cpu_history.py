"""Server CPU per foreground ``run_shell(true)`` (SQLite, local runner) in a home that has
served a while: HISTORY ended executions in its database first (records are kept 90 days),
this tree's ``src`` against another's, driven in alternating batches (bench_cpu.py's
``--against``), so both see the same load. The server's own CPU (utime + stime) per run.

    PYTHONPATH=src:bench .venv/bin/python bench/bench_cpu_history.py --against SRC \
        [--history N] [--runs N] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from bench_cpu import _alternate, server_side
from bench_server_instructions import _history
from common import make_home, remove_home, start_server, stop_server
from shellyard import loops
from shellyard.home import read_info
from shellyard.sdk.client import AsyncClient


async def measure(src: Path, history: int, runs: int) -> dict[str, Any]:
    homes = [make_home(), make_home()]
    clients: list[AsyncClient] = []
    try:
        sides = []
        for home, env in zip(homes, [None, {"PYTHONPATH": str(src)}], strict=True):
            pid = start_server(home, env)
            info = read_info(home)
            assert info is not None
            client = AsyncClient(info.url, info.token)
            clients.append(client)
            first = await client.run("true")
            if history:
                _history(home, first.agent_id, first.workspace_id, history)

            sides.append(server_side(client, pid))
        load_before = os.getloadavg()
        after, before = await _alternate(sides, runs)
        return {
            "history": history,
            "runs": runs,
            "after": after,
            "before": before,
            "load_before": load_before,
            "load_after": os.getloadavg(),
        }
    finally:
        for client in clients:
            await client.aclose()
        for home in homes:
            stop_server(home)
            remove_home(home)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--against", type=Path, required=True, help="the other tree's src")
    parser.add_argument("--history", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = {"name": "cpu_history", "against": str(args.against),
              **loops.run(measure(args.against, args.history, args.runs))}  # fmt: skip
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
