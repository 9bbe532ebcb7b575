"""What stays charged to a workspace's group used again, by how many times it was used: one
agent, ``--runs`` sequential ``run_shell(true)`` on an in-process plane (docs/benchmarks.md
§69). Per 100 recycle decisions: the mean and largest ``memory.usage_in_bytes`` read just
before the decision, and the groups turned away (recycle.py ``LEFTOVER_BYTES``, set in this
process by ``--bound``).

    PYTHONPATH=src:bench .venv/bin/python bench/bench_reuse_creep.py [--bound 2] [--runs 600]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from bench_reuse_load import MIB, Counts, instrument, the_tree
from common import make_home, remove_home, write_result
from shellyard import loops
from shellyard.config import Settings
from shellyard.contract.executions import RunShellRequest
from shellyard.control.plane import build
from shellyard.runner.limits import recycle


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    home = make_home()
    plane = await build(Settings(home=home / "home"))
    counts = Counts()
    default, recycle.LEFTOVER_BYTES = recycle.LEFTOVER_BYTES, int(args.bound * MIB)
    load_before = os.getloadavg()
    try:
        session, _main = await plane.store.default_owner()
        agent = str((await plane.store.create_agent(str(session.id))).id)
        request = RunShellRequest(command="true")
        await plane.executions.run_shell(request, agent)
        instrument(the_tree(plane), counts)
        for _ in range(args.runs):
            await plane.executions.run_shell(request, agent)
    finally:
        recycle.LEFTOVER_BYTES = default
        await plane.aclose()
        remove_home(home)
    left = [x / MIB for x in counts.leftover]
    chunks = [left[i : i + 100] for i in range(0, len(left), 100)]
    return {
        "name": "reuse_creep",
        "bound_mib": args.bound,
        "runs": args.runs,
        "spawns": dict(counts.spawns),
        "reasons": dict(counts.reasons),
        "leftover_per_100_decisions_mib": [
            {"mean": round(sum(c) / len(c), 3), "max": round(max(c), 3)} for c in chunks
        ],
        "load": {"before": load_before, "after": os.getloadavg()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bound", type=float, default=2.0, help="LEFTOVER_BYTES, MiB")
    parser.add_argument("--runs", type=int, default=600)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    write_result(loops.run(measure(args)), args.out)


if __name__ == "__main__":
    main()
