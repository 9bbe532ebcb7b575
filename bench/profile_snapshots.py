"""Profile of ``SnapshotStore.commit`` after one changed file, on the tree of
``bench_snapshots.py`` (10,000 files, ~40 MB): ``run_all.py`` runs it when a snapshot target is
missed, to say where a commit's time goes. cProfile, since a commit is synchronous code.

``--hinted-files N`` profiles instead the commits of ``bench_change_hints.py``: a tree of N
small files (folders of 100) on tmpfs, a store with change hints, one file appended to before
each commit (what a one-file command costs with hints on).

    .venv/bin/python bench/profile_snapshots.py [--out PATH] [--commits 20] [--hinted-files N]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_snapshots import make_tree, touch_one
from shellyard.runner.snapshots.store import SnapshotStore


def short(file: str) -> str:
    for marker in ("/site-packages/", "/src/", "/lib/python3"):
        if marker in file:
            file = file.split(marker, 1)[1]
    return file


def profile_hinted(files: int, commits: int) -> cProfile.Profile:
    from bench_change_hints import make_tree as make_small_tree

    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    work = Path(tempfile.mkdtemp(prefix="shellyard-bench-snapprof-", dir=shm))
    profiler = cProfile.Profile()
    try:
        tree = work / "tree"
        make_small_tree(tree, files)
        store = SnapshotStore(work / "store", scan_helper=False)
        store.commit("ws", tree)
        store.commit("ws", tree)  # the first commit set the watches up
        target = tree / "p0000" / "d0" / "f0.txt"
        for round_no in range(commits):
            with open(target, "ab") as f:
                f.write(b"change %d\n" % round_no)
            profiler.enable()
            store.commit("ws", tree)
            profiler.disable()
        store.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return profiler


def profile(commits: int, hinted_files: int | None = None) -> dict[str, Any]:
    if hinted_files:
        return summary(profile_hinted(hinted_files, commits), commits, [])
    work = Path(tempfile.mkdtemp(prefix="shellyard-bench-snapprof-"))
    try:
        tree = work / "tree"
        tree.mkdir()
        make_tree(tree, 10_000, 40 << 20, 100)
        files = sorted(str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file())
        store = SnapshotStore(work / "store")
        store.commit("ws", tree)
        rng = random.Random(5)
        for round_no in range(3):  # warm: caches loaded, as in the long-lived runner
            touch_one(tree, rng.choice(files), round_no)
            store.commit("ws", tree)
        profiler = cProfile.Profile()
        times = []
        for round_no in range(commits):
            touch_one(tree, rng.choice(files), 100 + round_no)
            start = time.perf_counter()
            profiler.enable()
            store.commit("ws", tree)
            profiler.disable()
            times.append(time.perf_counter() - start)
        store.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return summary(profiler, commits, times)


def summary(profiler: cProfile.Profile, commits: int, times: list[float]) -> dict[str, Any]:
    stats = pstats.Stats(profiler)
    entries = stats.stats  # type: ignore[attr-defined]
    total = sum(tt for (_cc, _nc, tt, _ct, _callers) in entries.values())
    rows = [
        (
            f"{short(file)}:{line}:{func}" if func.startswith("<") else f"{short(file)}:{func}",
            tt,
            ct,
        )
        for (file, line, func), (_c, _n, tt, ct, _r) in entries.items()
    ]
    own = sorted(rows, key=lambda r: -r[1])[:14]
    cumulative = sorted((r for r in rows if "shellyard" in r[0]), key=lambda r: -r[2])[:14]
    times.sort()
    total_s = sum(ct for name, _, ct in rows if name.endswith("store.py:commit"))
    return {
        "commits": commits,
        "commit_ms_p50_profiled": round(1000 * times[len(times) // 2], 2)
        if times
        else round(1000 * total_s / commits, 2),
        "own_pct": [[name, round(100 * tt / total, 1)] for name, tt, _ in own],
        "cumulative_pct": [[name, round(100 * ct / total, 1)] for name, _, ct in cumulative],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--commits", type=int, default=20)
    parser.add_argument("--hinted-files", type=int)
    args = parser.parse_args()
    result = profile(args.commits, args.hinted_files)
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    os.environ.pop("SHELLYARD_HOME", None)
    main()
