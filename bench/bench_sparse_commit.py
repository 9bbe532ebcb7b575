"""Benchmark: a first snapshot commit with this tree's object writer against a baseline source
tree (another checkout's ``src``), in the same run, alternating which goes first.

Each measurement is a fresh process (so the two ``shellyard`` packages never mix) that commits
the same tree into a fresh store and reports the commit's wall time, its CPU time (the
process's threads and its scan helper: steadier than wall time on a loaded machine) and the
blocks the store took. Trees: ``small`` (--files files, about --total-mb MB,
bench_snapshots.make_tree), ``big`` (--big-files files of about --big-mb MB in total: most
go through the streaming writer) and ``sparse`` (one file of --sparse-gib GiB with a MiB of
data at its end).

    python bench/bench_sparse_commit.py --baseline-src /work/main/src [--rounds 5]
        [--files 10000 --total-mb 40] [--big-files 200 --big-mb 400] [--sparse-gib 1]
        [--trees small,big,sparse] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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


def child(tree: Path, store_root: Path) -> None:
    from shellyard.runner.snapshots.store import SnapshotStore

    store = SnapshotStore(store_root)
    os.sync()

    def cpu() -> float:
        own, helper = (
            resource.getrusage(resource.RUSAGE_SELF),
            resource.getrusage(resource.RUSAGE_CHILDREN),
        )
        return own.ru_utime + own.ru_stime + helper.ru_utime + helper.ru_stime

    start, cpu_start = time.perf_counter(), cpu()
    store.commit("ws", tree)
    elapsed = time.perf_counter() - start
    stats = store.last_commit_stats
    hashed = stats.bytes_hashed if stats is not None else -1
    store.close()  # the scan helper ends: its CPU time counts (RUSAGE_CHILDREN)
    cpu_used = cpu() - cpu_start
    blocks = 0
    for folder, _dirs, files in os.walk(store_root / "objects"):
        for name in files:
            blocks += os.lstat(os.path.join(folder, name)).st_blocks * 512
    print(
        json.dumps(
            {
                "ms": round(elapsed * 1000, 2),
                "cpu_ms": round(cpu_used * 1000, 2),
                "store_bytes": blocks,
                "bytes_hashed": hashed,
            }
        )
    )


def measure(src: Path, tree: Path, work: Path) -> dict[str, Any]:
    store = work / "store"
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run(
        [sys.executable, __file__, "--child", str(tree), str(store)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    shutil.rmtree(store)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def make_sparse(path: Path, gib: float) -> None:
    path.mkdir()
    with open(path / "sparse.bin", "wb") as f:
        f.truncate(int(gib * (1 << 30)))
        f.write(os.urandom(1 << 20))


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(Path(sys.argv[2]), Path(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-src", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--total-mb", type=float, default=40.0)
    parser.add_argument("--big-files", type=int, default=200)
    parser.add_argument("--big-mb", type=float, default=400.0)
    parser.add_argument("--sparse-gib", type=float, default=1.0)
    parser.add_argument("--trees", default="small,big,sparse", help="which trees, by name")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    sys.path.insert(0, str(HERE))
    from bench_snapshots import make_tree

    work = Path(tempfile.mkdtemp(prefix="bench-sparse-"))
    results: dict[str, Any] = {"load_before": os.getloadavg()}
    try:
        trees = {"small": work / "small", "big": work / "big", "sparse": work / "sparse"}
        for name, files, mb in (
            ("small", args.files, args.total_mb),
            ("big", args.big_files, args.big_mb),
        ):
            trees[name].mkdir()
            make_tree(trees[name], files, int(mb * (1 << 20)), 100)
        make_sparse(trees["sparse"], args.sparse_gib)
        sides = {"baseline": args.baseline_src, "this": THIS_SRC}
        for name, tree in trees.items():
            if name not in args.trees.split(","):
                continue
            runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "this": []}
            for r in range(args.rounds):
                order = ["baseline", "this"] if r % 2 == 0 else ["this", "baseline"]
                for side in order:
                    runs[side].append(measure(sides[side], tree, work))
            medians = {side: statistics.median(x["ms"] for x in runs[side]) for side in runs}
            cpu = {side: statistics.median(x["cpu_ms"] for x in runs[side]) for side in runs}
            results[name] = {
                "baseline_ms": medians["baseline"],
                "this_ms": medians["this"],
                "ratio": round(medians["this"] / medians["baseline"], 3),
                "baseline_cpu_ms": cpu["baseline"],
                "this_cpu_ms": cpu["this"],
                "cpu_ratio": round(cpu["this"] / cpu["baseline"], 3),
                "baseline_bytes_hashed": runs["baseline"][0]["bytes_hashed"],
                "this_bytes_hashed": runs["this"][0]["bytes_hashed"],
                "baseline_all_cpu_ms": [x["cpu_ms"] for x in runs["baseline"]],
                "this_all_cpu_ms": [x["cpu_ms"] for x in runs["this"]],
                "baseline_store_bytes": runs["baseline"][0]["store_bytes"],
                "this_store_bytes": runs["this"][0]["store_bytes"],
                "baseline_all_ms": [x["ms"] for x in runs["baseline"]],
                "this_all_ms": [x["ms"] for x in runs["this"]],
            }
            print(name, json.dumps(results[name]), flush=True)
        results["load_after"] = os.getloadavg()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(results, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
