"""Benchmark: the quota's walk (``runner/limits/quota.tree_usage``) with this tree's charge
(a file with holes is opened and charged what its commit must hash) against a baseline
source tree (another checkout's ``src``: the charge by size and blocks alone), in the same
run, alternating which goes first each round.

Each measurement is a fresh process (the two ``shellyard`` packages never mix) that walks
the same tree ``--walks`` times and reports the CPU time per walk (steadier than wall time on
a loaded machine), the wall time per walk and the charge it found. Trees: ``small``
(--files files, about --total-mb MB, bench_snapshots.make_tree: no holes) and ``sparse``
(the small tree plus --sparse-files files of --sparse-mib MiB with a byte at the end of each
MiB: the attack's shape, each opened and seeked per data range).

    python bench/bench_quota_walk.py --baseline-src /work/main/src [--rounds 7]
        [--walks 5] [--files 10000 --total-mb 40] [--sparse-files 16 --sparse-mib 256]
        [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
THIS_SRC = HERE.parent / "src"
MIB = 1 << 20


def child(tree: Path, walks: int) -> None:
    from shellyard.runner.limits import quota

    quota.tree_usage(tree)  # warm the inode cache: both sides walk a cached tree
    cpu_start, start = time.process_time(), time.perf_counter()
    usage = 0
    for _ in range(walks):
        usage, _entries = quota.tree_usage(tree)
    print(
        json.dumps(
            {
                "cpu_ms": round((time.process_time() - cpu_start) * 1000 / walks, 3),
                "ms": round((time.perf_counter() - start) * 1000 / walks, 3),
                "usage": usage,
            }
        )
    )


def measure(src: Path, tree: Path, walks: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run(
        [sys.executable, __file__, "--child", str(tree), str(walks)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def byte_per_mib(path: Path, mibs: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for i in range(mibs):
            os.pwrite(fd, b"x", (i + 1) * MIB - 1)
    finally:
        os.close(fd)


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(Path(sys.argv[2]), int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-src", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--walks", type=int, default=5)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--total-mb", type=float, default=40.0)
    parser.add_argument("--sparse-files", type=int, default=16)
    parser.add_argument("--sparse-mib", type=int, default=256)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    sys.path.insert(0, str(HERE))
    from bench_snapshots import make_tree

    work = Path(tempfile.mkdtemp(prefix="bench-quota-walk-"))
    results: dict[str, Any] = {"load_before": os.getloadavg(), "args": vars(args) | {}}
    results["args"]["baseline_src"] = str(args.baseline_src)
    results["args"]["out"] = str(args.out)
    try:
        tree = work / "tree"
        tree.mkdir()
        make_tree(tree, args.files, int(args.total_mb * MIB), 100)
        sides = {"baseline": args.baseline_src, "this": THIS_SRC}
        for name in ("small", "sparse"):
            if name == "sparse":
                extra = tree / "sparse"
                extra.mkdir()
                for i in range(args.sparse_files):
                    byte_per_mib(extra / f"s{i}", args.sparse_mib)
            runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "this": []}
            for r in range(args.rounds):
                order = ["baseline", "this"] if r % 2 == 0 else ["this", "baseline"]
                for side in order:
                    runs[side].append(measure(sides[side], tree, args.walks))
            cpu = {side: statistics.median(x["cpu_ms"] for x in runs[side]) for side in runs}
            wall = {side: statistics.median(x["ms"] for x in runs[side]) for side in runs}
            results[name] = {
                "baseline_cpu_ms": cpu["baseline"],
                "this_cpu_ms": cpu["this"],
                "cpu_ratio": round(cpu["this"] / cpu["baseline"], 3),
                "baseline_ms": wall["baseline"],
                "this_ms": wall["this"],
                "baseline_usage": runs["baseline"][0]["usage"],
                "this_usage": runs["this"][0]["usage"],
                "runs": runs,
            }
            print(name, json.dumps({k: v for k, v in results[name].items() if k != "runs"}))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results["load_after"] = os.getloadavg()
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
