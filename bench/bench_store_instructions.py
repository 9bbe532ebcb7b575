"""Instructions per execution's store work on SQLite (submit with the writer, start, finish
with the notice and the writer's release: the three transactions of a foreground
``run_shell``), this tree's ``src`` against another's, under callgrind: the store's CPU
without a server, a runner or the load of a shared machine.

Each side runs CYCLES warm-up cycles uninstrumented, then ``callgrind_control -i on`` counts
CYCLES more (``--instr-atstart=no``). The lease is passed as the control plane passes it:
no lease row on SQLite where the tree's ``LeaseKeeper.terms`` gives none.

    PYTHONPATH=src:bench .venv/bin/python bench/bench_store_instructions.py --against SRC \
        [--cycles N] [--pairs P] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from common import PYTHON, write_result

CYCLE_SCRIPT = """
import asyncio, sys, tempfile, time
from shellyard.store import Store
from shellyard.store.db import new_id
from shellyard.store.leases import LeaseTerms

async def main(cycles):
    folder = tempfile.mkdtemp(dir="/tmp")
    store = await Store.open(f"sqlite:///{folder}/records.db")
    await store.upsert_runner("local", "local", "", None)
    _session, agent = await store.create_session()
    workspace, _ = await store.workspace_for(agent.id, "local")
    try:  # the tree's own choice: a lease row on SQLite or none
        from shellyard.control.replicas.leases import LeaseKeeper
        keeper = LeaseKeeper(store, "scope", "local")
        terms = keeper.terms("local")
    except Exception:
        terms = LeaseTerms("rep_bench", "scope", 10.0)
    holder = None if terms is None else terms.holder
    ended = {"state": "completed", "exit_code": 0, "snapshot_seq": None, "error": None,
             "sandbox_policy": None, "ended_by_limit": None, "peak_memory_bytes": None,
             "cpu_seconds": None}

    async def once():
        values = {"id": new_id("ex"), "agent_id": agent.id, "workspace_id": workspace.id,
                  "runner_id": "local", "environment_id": None, "command": "true",
                  "script_path": None, "background": False, "idempotency_key": None,
                  "read_only": False, "run_options": None}
        row, held = await store.submit_execution(values, queue=False, lease=terms)
        assert held is None
        fresh = await store.start_execution(row.id, time.time(), {})
        final, _queued, _read = await store.finish_execution(
            fresh, {**ended, "finished_at": time.time()}, "done", True,
            ("queued", "running", "unknown"), lease_holder=holder)
        assert final is not None and final.state == "completed"

    for _ in range(cycles):
        await once()
    print("ready", flush=True)
    sys.stdin.readline()
    for _ in range(cycles):
        await once()
    print("done", flush=True)
    await store.close()

asyncio.run(main(int(sys.argv[1])))
"""


def side(src: Path, out: Path, cycles: int) -> int:
    env = {**os.environ, "PYTHONPATH": str(src)}
    argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
            f"--callgrind-out-file={out}", PYTHON, "-c", CYCLE_SCRIPT, str(cycles)]  # fmt: skip
    with subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True) as child:  # fmt: skip
        assert child.stdin is not None and child.stdout is not None
        if child.stdout.readline().strip() != "ready":
            raise RuntimeError("the store side did not start")
        subprocess.run(["callgrind_control", "-i", "on", str(child.pid)], check=True,
                       capture_output=True)  # fmt: skip
        child.stdin.write("go\n")
        child.stdin.flush()
        if child.stdout.readline().strip() != "done":
            raise RuntimeError("the store side did not finish")
        subprocess.run(["callgrind_control", "-i", "off", str(child.pid)], check=True,
                       capture_output=True)  # fmt: skip
        child.stdin.close()
        child.wait(timeout=300)
    for line in out.read_text().splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1]) // cycles
    raise RuntimeError(f"no totals in {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--against", type=Path, required=True, help="the other tree's src")
    parser.add_argument("--cycles", type=int, default=300)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    this = Path(__file__).resolve().parent.parent / "src"
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="shellyard-callgrind-") as folder:
        for pair in range(args.pairs):
            order = [("this", this), ("against", args.against)]
            for name, src in order if pair % 2 == 0 else order[::-1]:
                counted = side(src, Path(folder) / f"{name}-{pair}.out", args.cycles)
                runs.append({"side": name, "pair": pair, "instructions_per_execution": counted})
                print(json.dumps(runs[-1]), flush=True)
    mean = {
        name: sum(r["instructions_per_execution"] for r in runs if r["side"] == name)
        / max(1, sum(1 for r in runs if r["side"] == name))
        for name in ("this", "against")
    }
    result = {"name": "store_instructions", "against": str(args.against),
              "cycles": args.cycles, "runs": runs, "mean_instructions_per_execution": mean,
              "ratio_this_to_against": mean["this"] / mean["against"]}  # fmt: skip
    write_result(result, args.out, indent=2)


if __name__ == "__main__":
    main()
