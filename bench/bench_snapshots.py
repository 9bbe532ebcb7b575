"""Benchmark: SnapshotStore.commit against ``git add -A && git commit`` on the same tree.

Builds a tree of --files files totalling about --total-mb MB (lognormal sizes, half text, half
random bytes, spread over --dirs nested folders) in a temp dir, copies it for git, then
measures in one run, interleaving ours and git's repetitions so both see the same machine:

* first commit: a fresh store vs ``git init && git add -A && git commit -qm x`` on a fresh
  copy (target ratio <= 1.0);
* incremental commit after changing one file: ``store.commit`` (warm: the long-lived store
  object, as the runner holds it; cold: a new SnapshotStore on the same root, loading its
  cache from disk) vs ``git add -A && git commit -qm y`` (target ratio <= 0.75, on warm).

git runs with its own config only (no user/system config), with ``gc.auto=0`` and
``maintenance.auto=false`` so no background repacking skews either side. Medians and
ratios go to stdout as JSON, and to --out when given.

    python bench/bench_snapshots.py [--files 10000] [--total-mb 40] [--dirs 100]
                                    [--repeats 5] [--out results.json] [--formats]

``--formats`` also times candidate encodings of a 10,000-entry manifest (the numbers behind
the choice written in shellyard/runner/snapshots/format.py's docstring).
"""

from __future__ import annotations

import argparse
import json
import marshal
import os
import random
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shellyard.runner.snapshots.store import SnapshotStore

WORDS = (
    b"lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "
    b"incididunt ut labore et dolore magna aliqua def return import class self None"
).split()


def make_tree(root: Path, files: int, total_bytes: int, dirs: int, seed: int = 7) -> int:
    """Write the tree; return its byte count."""
    rng = random.Random(seed)
    folders: list[str] = []
    top = max(1, round(dirs**0.5))
    for i in range(top):
        parent = f"pkg{i:02d}"
        folders.append(parent)
        for j in range(top - 1):
            if len(folders) >= dirs:
                break
            folders.append(f"{parent}/sub{j:02d}/deep" if j % 3 == 2 else f"{parent}/sub{j:02d}")
    folders = folders[:dirs]
    for folder in folders:
        (root / folder).mkdir(parents=True, exist_ok=True)
    weights = [rng.lognormvariate(0, 1.6) for _ in range(files)]
    scale = total_bytes / sum(weights)
    text = b" ".join(rng.choice(WORDS) for _ in range(400_000))
    noise = rng.randbytes(8 << 20)
    written = 0
    for k, weight in enumerate(weights):
        size = int(weight * scale)
        source = text if k % 2 else noise
        if size >= len(source):
            data = (source * (size // len(source) + 1))[:size]
        else:
            start = rng.randrange(0, len(source) - size)
            data = source[start : start + size]
        suffix = "txt" if k % 2 else "bin"
        (root / folders[k % len(folders)] / f"f{k:05d}.{suffix}").write_bytes(data)
        written += len(data)
    return written


def git_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home),
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=str(home / "gitconfig"),
        GIT_AUTHOR_NAME="bench",
        GIT_AUTHOR_EMAIL="bench@example.invalid",
        GIT_COMMITTER_NAME="bench",
        GIT_COMMITTER_EMAIL="bench@example.invalid",
    )
    (home / "gitconfig").write_text(
        "[gc]\n\tauto = 0\n[maintenance]\n\tauto = false\n[init]\n\tdefaultBranch = main\n"
    )
    return env


def run_git(cwd: Path, env: dict[str, str], *argvs: list[str]) -> float:
    started = time.perf_counter()
    for argv in argvs:
        subprocess.run(["git", *argv], cwd=cwd, env=env, check=True)
    return time.perf_counter() - started


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def touch_one(tree: Path, rel: str, round_no: int) -> None:
    with open(tree / rel, "ab") as f:
        f.write(f"change {round_no}\n".encode())


def bench_formats(entries: int = 10_000) -> dict[str, dict[str, float]]:
    """Encode/decode times (ms) of one manifest in candidate formats."""
    rng = random.Random(3)
    paths = sorted(f"pkg{i % 10:02d}/sub{i % 9}/f{i:05d}.txt" for i in range(entries))
    digests = [rng.randbytes(32) for _ in paths]
    modes = [0o644] * entries
    sizes = [rng.randrange(1 << 20) for _ in paths]
    rows = list(zip(paths, modes, sizes, [d.hex() for d in digests], strict=True))
    out: dict[str, dict[str, float]] = {}

    def measure(name: str, enc: Callable[[], bytes], dec: Callable[[bytes], object]) -> None:
        blob = enc()
        e = min(timed(enc) for _ in range(5))
        d = min(timed(lambda: dec(blob)) for _ in range(5))
        out[name] = {"encode_ms": e * 1e3, "decode_ms": d * 1e3, "bytes": len(blob)}

    measure(
        "json_lines",
        lambda: "\n".join(json.dumps(r) for r in rows).encode(),
        lambda b: [json.loads(line) for line in b.split(b"\n")],
    )
    measure("json_one_doc", lambda: json.dumps(rows).encode(), json.loads)
    measure("marshal_tuples", lambda: marshal.dumps(rows), marshal.loads)

    def columns() -> bytes:
        names = "\0".join(paths).encode()
        return b"".join(
            [
                struct.pack("<QQ", entries, len(names)),
                struct.pack(f"<{entries}I", *modes),
                struct.pack(f"<{entries}q", *sizes),
                names,
                b"".join(digests),
            ]
        )

    def uncolumns(blob: bytes) -> object:
        n, plen = struct.unpack_from("<QQ", blob)
        off = 16
        m = struct.unpack_from(f"<{n}I", blob, off)
        off += 4 * n
        s = struct.unpack_from(f"<{n}q", blob, off)
        off += 8 * n
        p = blob[off : off + plen].decode().split("\0")
        off += plen
        return p, m, s, blob[off:]

    measure("columns (chosen)", columns, uncolumns)
    return out


def median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1e3, 2)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--total-mb", type=float, default=40.0)
    parser.add_argument("--dirs", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--formats", action="store_true", help="also time manifest encodings")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="bench-snapshots-"))
    try:
        tree = work / "tree"
        tree.mkdir()
        total = make_tree(tree, args.files, int(args.total_mb * (1 << 20)), args.dirs)
        env = git_env(work)
        files = sorted(str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file())

        # (a) first commit, interleaved (who goes first alternates); nothing is deleted
        # until the end, so no round pays for the previous round's deletions
        ours_first: list[float] = []
        git_first: list[float] = []
        stores: list[SnapshotStore] = []
        for r in range(args.repeats):
            gtree = work / f"git{r}"
            shutil.copytree(tree, gtree, symlinks=True)
            store = SnapshotStore(work / f"store{r}")
            stores.append(store)
            steps: list[tuple[list[float], Callable[[], object]]] = [
                (
                    git_first,
                    lambda g=gtree: run_git(
                        g, env, ["init", "-q"], ["add", "-A"], ["commit", "-qm", "x"]
                    ),  # type: ignore[misc]
                ),
                (ours_first, lambda s=store: s.commit("ws", tree)),  # type: ignore[misc]
            ]
            for into, step in steps if r % 2 == 0 else steps[::-1]:
                os.sync()
                into.append(timed(step))
        store = stores[-1]
        for extra in stores[:-1]:
            extra.close()
        gtree = work / f"git{args.repeats - 1}"

        # (b) one changed file, interleaved; a different file each round, same in all trees.
        # warm: the long-lived store (as the runner holds it); cold: a new store object on
        # the same root, as after a runner restart (cache loaded from disk, no scan helper
        # up yet); no_helper: a long-lived store that scans in the committing thread only.
        plain_tree = work / "plain-tree"
        shutil.copytree(tree, plain_tree, symlinks=True)
        plain = SnapshotStore(work / "plain-store", scan_helper=False)
        plain.commit("ws", plain_tree)
        os.sync()
        time.sleep(0.1)
        rng = random.Random(11)
        ours_inc: list[float] = []
        ours_cold: list[float] = []
        ours_plain: list[float] = []
        git_inc: list[float] = []
        hashed: list[int] = []
        for r in range(args.repeats * 2):
            rel = rng.choice(files)
            for t in (gtree, tree, plain_tree):
                touch_one(t, rel, r)
            time.sleep(0.01)
            git_inc.append(run_git(gtree, env, ["add", "-A"], ["commit", "-qm", "y"]))
            if r % 2 == 0:
                ours_inc.append(timed(lambda: store.commit("ws", tree)))
                stats = store.last_commit_stats
                hashed.append(stats.files_hashed if stats else -1)
            else:
                cold = SnapshotStore(store.root, scan_helper=False)
                ours_cold.append(timed(lambda s=cold: s.commit("ws", tree)))  # type: ignore[misc]
                cold.close()
                store.commit("ws", tree)  # untimed: the long-lived store picks up the new head
            ours_plain.append(timed(lambda: plain.commit("ws", plain_tree)))
        store.close()
        plain.close()

        result: dict[str, Any] = {
            "tree": {"files": len(files), "bytes": total, "dirs": args.dirs},
            "repeats": args.repeats,
            "python": sys.version.split()[0],
            "cpus": os.cpu_count(),
            "first_commit": {
                "ours_ms": median_ms(ours_first),
                "git_ms": median_ms(git_first),
                "ratio": round(statistics.median(ours_first) / statistics.median(git_first), 3),
                "target": 1.0,
                "ours_all_ms": [round(x * 1e3, 1) for x in ours_first],
                "git_all_ms": [round(x * 1e3, 1) for x in git_first],
            },
            "one_file_changed": {
                "ours_ms": median_ms(ours_inc),
                "ours_cold_ms": median_ms(ours_cold),
                "ours_no_helper_ms": median_ms(ours_plain),
                "git_ms": median_ms(git_inc),
                "ratio": round(statistics.median(ours_inc) / statistics.median(git_inc), 3),
                "ratio_cold": round(statistics.median(ours_cold) / statistics.median(git_inc), 3),
                "ratio_no_helper": round(
                    statistics.median(ours_plain) / statistics.median(git_inc), 3
                ),
                "target": 0.75,
                "files_hashed": hashed,
                "ours_all_ms": [round(x * 1e3, 1) for x in ours_inc],
                "ours_cold_all_ms": [round(x * 1e3, 1) for x in ours_cold],
                "ours_no_helper_all_ms": [round(x * 1e3, 1) for x in ours_plain],
                "git_all_ms": [round(x * 1e3, 1) for x in git_inc],
            },
        }
        if args.formats:
            result["manifest_formats_10k"] = bench_formats()
        text = json.dumps(result, indent=2)
        print(text)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text + "\n")
        return result
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
