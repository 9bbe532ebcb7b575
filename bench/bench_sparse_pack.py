"""Benchmark: an object pack of version 2 (data extents) against version 1 (every byte) for
one sparse file moved between two snapshot stores, in the same run, alternating which goes
first: bytes on the wire (the pack stream's length) and the CPU time of export plus import.

    python bench/bench_sparse_pack.py [--gib 1] [--data-mib 3] [--rounds 5] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from shellyard.runner.snapshots import objects
from shellyard.runner.snapshots.store import SnapshotStore


def move(store: SnapshotStore, sha: str, version: int, target_root: Path) -> dict[str, Any]:
    target = SnapshotStore(target_root, scan_helper=False)
    try:
        cpu = time.process_time()
        importer = objects.PackImporter(target)
        wire = 0
        for chunk in objects.pack_chunks(store, [sha], version):
            wire += len(chunk)
            importer.feed(chunk)
        [result] = importer.close()
        used = time.process_time() - cpu
        assert result.ok, result
        blocks = os.stat(target.blobs.object_path(sha)).st_blocks * 512
    finally:
        target.close()
        shutil.rmtree(target_root)
    return {"cpu_ms": round(used * 1000, 2), "wire_bytes": wire, "target_blocks": blocks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--data-mib", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-pack-"))
    results: dict[str, Any] = {"load_before": os.getloadavg()}
    try:
        tree = work / "tree"
        tree.mkdir()
        with open(tree / "sparse.bin", "wb") as f:
            f.truncate(int(args.gib * (1 << 30)))
            f.seek(int(args.gib * (1 << 30)) // 3)
            f.write(os.urandom(args.data_mib << 20))
        store = SnapshotStore(work / "store", scan_helper=False)
        try:
            store.commit("ws", tree)
            entry = store.stat("ws", None, "sparse.bin")
            assert entry is not None and entry.sha256 is not None
            runs: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
            for r in range(args.rounds):
                for version in (1, 2) if r % 2 == 0 else (2, 1):
                    runs[version].append(move(store, entry.sha256, version, work / "target"))
        finally:
            store.close()
        for version, rows in runs.items():
            results[f"v{version}"] = {
                "cpu_ms": statistics.median(x["cpu_ms"] for x in rows),
                "all_cpu_ms": [x["cpu_ms"] for x in rows],
                "wire_bytes": rows[0]["wire_bytes"],
                "target_blocks": rows[0]["target_blocks"],
            }
        results["cpu_ratio_v2_v1"] = round(results["v2"]["cpu_ms"] / results["v1"]["cpu_ms"], 4)
        results["load_after"] = os.getloadavg()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(results, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
