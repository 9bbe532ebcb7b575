"""Benchmark: what a workspace's overlay of its own costs (runner/own_mounts.py; R2,
docs/security.md "A mount of its own per workspace").

The same tree twice: one a plain folder (as a runner that is not root keeps it), one under
its overlay (as a root runner keeps it). In one run, interleaved, both see the same machine:

* first commit of the tree into a fresh snapshot store, and an incremental commit after one
  file changed (``SnapshotStore.commit``: the runner's commit goes through the overlay);
* a walk that stats every entry and reads every file (what a command's ``grep -r`` or a test
  run does), as a child process: ``find -type f -exec cat {} +``.

Ratios are overlay / plain (target: ≤ 1.1×). Needs root (the overlay is a root runner's).

    .venv/bin/python bench/bench_own_mounts.py [--files 5000] [--total-mb 20] [--repeats 5]
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
from pathlib import Path
from typing import Any

from bench_snapshots import make_tree, timed, touch_one
from shellyard.runner.own_mounts import OwnMounts
from shellyard.runner.snapshots.store import SnapshotStore

COMMAND = "python bench/bench_own_mounts.py"


def walk(tree: Path) -> float:
    return timed(
        lambda: subprocess.run(
            ["find", str(tree), "-type", "f", "-exec", "cat", "{}", "+"],
            stdout=subprocess.DEVNULL,
            check=True,
        )
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--total-mb", type=int, default=20)
    parser.add_argument("--dirs", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("bench_own_mounts needs root: the overlay is a root runner's")
    work = Path(tempfile.mkdtemp(prefix="shellyard-bench-mounts-"))
    mounts = OwnMounts(work / "overlays", ())
    samples: dict[str, list[float]] = {}
    try:
        plain = work / "workspaces" / "plain"
        over = work / "workspaces" / "over"
        plain.mkdir(parents=True)
        make_tree(plain, args.files, args.total_mb << 20, args.dirs)
        shutil.copytree(plain, over, symlinks=True, dirs_exist_ok=True)
        if not mounts.startup():
            sys.exit("the kernel refused the overlay here (see the log)")
        mounts.mount(over)
        stores = {name: SnapshotStore(work / f"store-{name}-0") for name in ("plain", "over")}
        trees = {"plain": plain, "over": over}
        for tree in trees.values():  # warm: the page cache holds both trees
            walk(tree)
        for r in range(args.repeats):
            for name in ("plain", "over") if r % 2 == 0 else ("over", "plain"):
                tree = trees[name]
                fresh = SnapshotStore(work / f"store-{name}-{r + 1}")
                samples.setdefault(f"first_{name}", []).append(
                    timed(lambda s=fresh, t=tree: s.commit("ws", t))  # type: ignore[misc]
                )
                fresh.close()
                stores[name].commit("ws", tree)
                touch_one(tree, "f0", r)
                samples.setdefault(f"incremental_{name}", []).append(
                    timed(lambda s=stores[name], t=tree: s.commit("ws", t))  # type: ignore[misc]
                )
                samples.setdefault(f"walk_{name}", []).append(walk(tree))
        for store in stores.values():
            store.close()
    finally:
        mounts.unmount(work / "workspaces" / "over")
        shutil.rmtree(work, ignore_errors=True)
    medians = {k: round(1000 * statistics.median(v), 2) for k, v in samples.items()}
    result = {
        "command": COMMAND,
        "files": args.files,
        "total_mb": args.total_mb,
        "median_ms": medians,
        "ratios": {
            part: round(medians[f"{part}_over"] / medians[f"{part}_plain"], 3)
            for part in ("first", "incremental", "walk")
        },
    }
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
