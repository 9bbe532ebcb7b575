"""Run every shellyard benchmark, write ``bench/results/latest.json`` and regenerate
``docs/benchmarks.md``.

    .venv/bin/python bench/run_all.py            # the full suite
    .venv/bin/python bench/run_all.py --quick    # fewer samples, smaller phases (a smoke run)
    .venv/bin/python bench/run_all.py --only roundtrip   # run one again, replace its section

Each benchmark runs as its own process (``bench/bench_*.py --out …``), exactly as when it is
run alone, so one benchmark's memory, threads and leftovers never touch the next one's
figures. Every ratio is against a baseline measured inside the same benchmark process, in the
same run (interleaved or bracketing), because this machine (2 cores) is noisy.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import REPO, bench_sandbox_processes, metric
from report import render

BENCH = REPO / "bench"
RESULTS = BENCH / "results"
DOC = REPO / "docs" / "benchmarks.md"

#: (name, script, timeout in seconds for the full run), in the document's order
SUITE = [
    ("roundtrip", "bench_roundtrip.py", 300),
    ("throughput", "bench_throughput.py", 300),
    ("snapshots", "bench_snapshots.py", 600),
    ("change_hints", "bench_change_hints.py", 1500),
    ("output", "bench_output.py", 300),
    ("many", "bench_many.py", 600),
    ("transfer", "bench_transfer.py", 900),
    ("env", "bench_env.py", 900),
    ("base_env", "bench_base_env.py", 1500),
    ("cli_startup", "bench_cli_startup.py", 600),
    ("sandbox", "bench_sandbox.py", 300),
    ("limits", "bench_limits.py", 600),
    ("tenants", "bench_tenants.py", 600),
    ("read_only", "bench_read_only.py", 300),
    ("interactive", "bench_interactive.py", 300),
    ("runners", "bench_runners.py", 600),
    ("replicas", "bench_replicas.py", 900),
    ("cpu", "bench_cpu.py", 900),
    ("soak", "bench_soak.py", 900),
    ("warm", "bench_warm.py", 900),
]

#: Always run small in the suite: the full soak takes hours (run it alone for that).
ALWAYS_QUICK = {"soak"}


def git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def run_one(name: str, script: str, timeout: int, args: argparse.Namespace) -> dict[str, Any]:
    out = RESULTS / "runs" / f"{name}.json"
    log = RESULTS / "logs" / f"{name}.log"
    out.unlink(missing_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    path = BENCH / script
    if not path.exists():
        return {
            "name": name,
            "error": f"bench/{script} is not there yet: this benchmark was skipped",
            "metrics": [],
        }
    argv = [sys.executable, str(path), "--out", str(out)]
    if name == "snapshots":
        # bench_snapshots.py has its own options (the tree is always 10,000 files, ~40 MB).
        argv += ["--repeats", "2" if args.quick else "5"]
    else:
        if args.quick or name in ALWAYS_QUICK:
            argv.append("--quick")
        if not args.no_profile:
            argv += ["--profile", str(RESULTS / "profiles")]
    load_before = [round(x, 2) for x in os.getloadavg()]
    started = time.perf_counter()
    with log.open("w") as handle:
        try:
            code = subprocess.run(
                argv, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT, timeout=timeout
            ).returncode
        except subprocess.TimeoutExpired:
            code = -1
    elapsed = round(time.perf_counter() - started, 1)
    if code != 0 or not out.exists():
        tail = log.read_text(errors="replace")[-1500:]
        return stamped(
            {
                "name": name,
                "error": f"exit {code} after {elapsed} s; last output:\n{tail}",
                "metrics": [],
                "elapsed_s": elapsed,
            }
        )
    result: dict[str, Any] = json.loads(out.read_text())
    if name == "snapshots":
        result = adapt_snapshots(result, args)
        missed = any(m["pass"] is False for m in result["metrics"])
        if missed and not args.no_profile:
            result["profiles"] = profile_snapshots()
    result["elapsed_s"] = elapsed
    leftovers = bench_sandbox_processes()
    if leftovers:
        result.setdefault("warnings", []).append(
            f"{len(leftovers)} sandbox processes of this benchmark's homes were still alive "
            f"after it ended: {sorted(leftovers.items())[:5]}"
        )
    result["loadavg_before"] = load_before
    return stamped(result)


def stamped(result: dict[str, Any]) -> dict[str, Any]:
    """When and at which commit: a section may come from a later run than the rest."""
    result["date"] = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    result["git_commit"] = git("rev-parse", "HEAD")
    return result


def profile_snapshots() -> dict[str, Any]:
    """cProfile of warm one-changed-file commits (bench/profile_snapshots.py), on a miss."""
    out = RESULTS / "runs" / "snapshots_profile.json"
    log = RESULTS / "logs" / "snapshots_profile.log"
    with log.open("w") as handle:
        code = subprocess.run(
            [sys.executable, str(BENCH / "profile_snapshots.py"), "--out", str(out)],
            cwd=REPO, stdout=handle, stderr=subprocess.STDOUT, timeout=300,
        ).returncode  # fmt: skip
    if code != 0 or not out.exists():
        return {"error": f"profile_snapshots.py exited {code}; see {log}"}
    return {"commit_cprofile": json.loads(out.read_text())}


def adapt_snapshots(raw: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """bench_snapshots.py (its own format) → the suite's metric rows."""
    first = raw.get("first_commit", {})
    one = raw.get("one_file_changed", {})
    metrics = []
    if "ours_ms" in one and "git_ms" in one:
        metrics.append(
            metric(
                "snapshots.one_changed", "commit after one changed file (warm store), ms",
                one["ours_ms"], "ms", baseline_label="git add -A && git commit, ms",
                baseline_value=one["git_ms"], target="≤ 0.75× git", kind="ratio_max",
                limit=0.75,
            )
        )  # fmt: skip
    if "ours_cold_ms" in one and "git_ms" in one:
        metrics.append(
            metric(
                "snapshots.one_changed_cold",
                "commit after one changed file (new store object, cache from disk), ms",
                one["ours_cold_ms"], "ms", baseline_label="git add -A && git commit, ms",
                baseline_value=one["git_ms"], target="— (info)", kind="info",
            )
        )  # fmt: skip
    if "ours_ms" in first and "git_ms" in first:
        metrics.append(
            metric(
                "snapshots.first", "first commit, ms", first["ours_ms"], "ms",
                baseline_label="git init && git add -A && git commit, ms",
                baseline_value=first["git_ms"], target="≤ 1.0× git", kind="ratio_max",
                limit=1.0,
            )
        )  # fmt: skip
    repeats = "2" if args.quick else "5"
    return {
        "name": "snapshots",
        "title": "3. Snapshot commit of 10,000 files (~40 MB) beside git",
        "command": f"python bench/bench_snapshots.py --repeats {repeats}",
        "metrics": metrics,
        "details": raw,
        "profiles": {},
        **({} if metrics else {"error": "bench_snapshots.py's output has no figures we know"}),
    }


# ----------------------------------------------------------------------------- main


def with_placeholders(report: dict[str, Any]) -> dict[str, Any]:
    """The report with a section for every benchmark of the suite, so one that has not run in
    the suite yet still shows how to run it (and its hand-written notes)."""
    ran = {b["name"] for b in report["benchmarks"]}
    missing = [
        {
            "name": name,
            "title": name.replace("_", " ").capitalize(),
            "command": f"python bench/{script}",
            "error": "not measured by bench/run_all.py yet: run it alone (command above)",
            "metrics": [],
        }
        for name, script, _ in SUITE
        if name not in ran
    ]
    return replace_benchmarks(dict(report), missing)


def replace_benchmarks(report: dict[str, Any], fresh: list[dict[str, Any]]) -> dict[str, Any]:
    """``report`` with ``fresh`` results in place of the same names, in the suite's order."""
    by_name = {b["name"]: b for b in report["benchmarks"]}
    by_name.update({b["name"]: b for b in fresh})
    order = [name for name, _, _ in SUITE]
    report["benchmarks"] = sorted(
        by_name.values(), key=lambda b: order.index(b["name"]) if b["name"] in order else 99
    )
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer samples (smoke run)")
    parser.add_argument("--no-profile", action="store_true", help="skip the profiling passes")
    parser.add_argument("--only", nargs="*", help="run only these (roundtrip, throughput, …)")
    parser.add_argument("--doc", type=Path, default=DOC, help="where to write the Markdown")
    parser.add_argument(
        "--render-only",
        action="store_true",
        help="only regenerate the Markdown from bench/results/latest.json",
    )
    args = parser.parse_args()
    if args.render_only:
        args.doc.write_text(
            render(with_placeholders(json.loads((RESULTS / "latest.json").read_text())))
        )
        print(f"[run_all] wrote {args.doc} from {RESULTS / 'latest.json'}")
        return

    started = time.perf_counter()
    benchmarks = []
    for name, script, timeout in SUITE:
        if args.only and name not in args.only:
            continue
        print(f"[run_all] {name} …", flush=True)
        result = run_one(name, script, timeout, args)
        status = (
            "error"
            if result.get("error")
            else ", ".join(
                f"{m['id']}={'PASS' if m['pass'] else 'MISS'}"
                for m in result["metrics"]
                if m["pass"] is not None
            )
        )
        print(f"[run_all] {name}: {status} ({result.get('elapsed_s')} s)", flush=True)
        benchmarks.append(result)

    bwrap = subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout.strip()
    report = {
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": len(os.sched_getaffinity(0)),
        "machine": f"{platform.system()} {platform.release()} {platform.machine()}",
        "python": platform.python_version(),
        "bwrap": bwrap,
        "quick": args.quick,
        "total_s": round(time.perf_counter() - started, 1),
        "benchmarks": benchmarks,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    latest = RESULTS / "latest.json"
    if args.only and latest.exists():
        # A partial run replaces its benchmarks' sections; the header still describes the
        # last full run, and every section carries its own date and commit.
        report = replace_benchmarks(json.loads(latest.read_text()), benchmarks)
    latest.write_text(json.dumps(report, indent=2) + "\n")
    args.doc.write_text(render(with_placeholders(report)))
    print(f"[run_all] wrote {latest} and {args.doc} ({round(time.perf_counter() - started, 1)} s)")
    misses = [m["id"] for b in benchmarks for m in b.get("metrics", []) if m["pass"] is False]
    if misses:
        print(f"[run_all] targets missed: {', '.join(misses)}")


if __name__ == "__main__":
    main()
