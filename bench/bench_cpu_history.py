"""Server CPU per foreground ``run_shell(true)`` (SQLite, local runner) in a home that has
served a while: HISTORY ended executions in its database first (records are kept 90 days),
this tree's ``src`` against another's, driven in alternating batches (bench_cpu.py's
``--against``), so both see the same load. The server's own CPU (utime + stime) per run.

    PYTHONPATH=src:bench .venv/bin/python bench/bench_cpu_history.py --against SRC \
        [--history N] [--runs N] [--out PATH]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from bench_cpu import _alternate, server_side, servers_against
from bench_server_instructions import _history
from common import write_result
from shellyard import loops


async def measure(src: Path, history: int, runs: int) -> dict[str, Any]:
    async with servers_against(src) as servers:
        sides = []
        for home, client, pid in servers:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--against", type=Path, required=True, help="the other tree's src")
    parser.add_argument("--history", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = {"name": "cpu_history", "against": str(args.against),
              **loops.run(measure(args.against, args.history, args.runs))}  # fmt: skip
    write_result(result, args.out, indent=2)


if __name__ == "__main__":
    main()
