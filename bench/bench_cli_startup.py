"""CLI start-up: ``shellyard --help`` and ``shellyard run -- true`` with the home's server up,
each a fresh process (``python -m shellyard``), p50 of interleaved runs.

Targets: ``run -- true`` p50 ≤ 150 ms, ``--help`` and ``run --help`` ≤ 150 ms. A help page is
printed from the copy kept the first time it was rendered (cli/helppage/cache.py): the warm rows
are that, the "first time" row renders it into an empty cache folder each run. Baselines
measured in the same rounds: ``python -c pass``, ``git --help`` (another CLI's help page), and
for ``run`` a minimal client (``MINIMAL_CLIENT``: the
standard library's ``http.client`` posting the same request to the same server and printing
the answer's output), so the ratio says how much is the CLI's own on a machine whose absolute
figures move with its load. Bytecode is compiled
into a private cache first (``PYTHONPYCACHEPREFIX``), as an installed package has it: a run
with ``PYTHONDONTWRITEBYTECODE=1`` and no ``__pycache__`` would measure the compiler instead.
CPU time (user + system of the child) is reported beside wall time: it moves less with load.

``--baseline-src DIR`` also measures another checkout's ``src`` (e.g. the commit before a
change) in the same rounds, with the same interpreter and packages.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import REPO, cli, make_home, metric, remove_home, start_server, stop_server

COMMAND = "python bench/bench_cli_startup.py"
#: The floor of a client of the home's server: read server.json and the token, one POST of
#: run_shell(true), print the output, exit with the code. No shellyard import.
MINIMAL_CLIENT = """
import http.client, json, os, sys
home = os.environ["SHELLYARD_HOME"]
info = json.load(open(os.path.join(home, "server.json")))
token = open(info["token_file"]).read().strip() if info.get("token_file") else info["token"]
host, port = info["url"].split("//")[1].split(":")
connection = http.client.HTTPConnection(host, int(port))
connection.request("POST", "/v1/executions", json.dumps({"command": "true"}),
                   {"Authorization": "Bearer " + token, "Content-Type": "application/json"})
answer = json.loads(connection.getresponse().read())
sys.stdout.write(answer["stdout"])
sys.exit(answer["exit_code"])
"""
CASES = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "minimal http.client run(true)": [sys.executable, "-c", MINIMAL_CLIENT],
    # ``-m shellyard`` (what the console script runs), so a --baseline-src tree whose
    # entry point differs is measured through its own.
    "shellyard --help": [sys.executable, "-m", "shellyard", "--help"],
    "shellyard run --help": [sys.executable, "-m", "shellyard", "run", "--help"],
    "shellyard --help, first time": [sys.executable, "-m", "shellyard", "--help"],
    "git --help": ["git", "--help"],
    "shellyard run -- true": [sys.executable, "-m", "shellyard", "run", "--", "true"],
}


def once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall ms, cpu ms) of one process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, timeout=120)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[2:]} failed: {done.stderr.decode()[-500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall * 1000, cpu * 1000


def measure(args: argparse.Namespace) -> dict[str, Any]:
    rounds = 5 if args.quick else 25
    home = make_home()
    cache = tempfile.mkdtemp(prefix="shellyard-pyc-")
    help_cache = tempfile.mkdtemp(prefix="shellyard-help-")  # the warm help pages' folder
    trees = {"tree": str(REPO / "src")}
    if args.baseline_src:
        trees["baseline"] = str(Path(args.baseline_src).absolute())
    env = {**os.environ, "SHELLYARD_HOME": str(home), "PYTHONPYCACHEPREFIX": cache}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    samples: dict[str, dict[str, list[tuple[float, float]]]] = {
        tree: {case: [] for case in CASES} for tree in trees
    }
    try:
        start_server(home)
        for index in range(rounds + 1):
            for tree, src in trees.items():
                for case, argv in CASES.items():
                    fresh = tempfile.mkdtemp(prefix="shellyard-help-") if "first" in case else ""
                    where = {"XDG_CACHE_HOME": fresh or help_cache}
                    took = once(argv, {**env, "PYTHONPATH": src, **where})
                    if fresh:
                        remove_home(Path(fresh))
                    if index:  # round 0 writes the bytecode cache and warms the page cache
                        samples[tree][case].append(took)
    finally:
        stop_server(home)
        remove_home(home)
        remove_home(Path(cache))
        remove_home(Path(help_cache))

    def p50(tree: str, case: str, which: int) -> float:
        return statistics.median(s[which] for s in samples[tree][case])

    base = p50("tree", "python -c pass", 0)
    floor = p50("tree", "minimal http.client run(true)", 0)
    run_p50 = p50("tree", "shellyard run -- true", 0)
    metrics = [
        metric(
            "cli.run", "shellyard run -- true (server up), wall p50, ms", run_p50, "ms",
            baseline_label="python -c pass, wall p50, ms", baseline_value=base,
            target="≤ 150 ms", kind="abs_max", limit=150.0,
        ),
        metric(
            "cli.run.minimal", "shellyard run -- true (server up), wall p50, ms", run_p50,
            "ms", baseline_label="minimal http.client client of run(true), wall p50, ms",
            baseline_value=floor, target="—", kind="info",
        ),
        metric(
            "cli.run.cpu", "shellyard run -- true, CPU p50, ms",
            p50("tree", "shellyard run -- true", 1), "ms",
            baseline_label="minimal http.client client, CPU p50, ms",
            baseline_value=p50("tree", "minimal http.client run(true)", 1), target="—",
            kind="info",
        ),
        metric(
            "cli.help", "shellyard --help, wall p50, ms", p50("tree", "shellyard --help", 0),
            "ms", baseline_label="python -c pass, wall p50, ms", baseline_value=base,
            target="≤ 150 ms", kind="abs_max", limit=150.0,
        ),
        metric(
            "cli.help.run", "shellyard run --help, wall p50, ms",
            p50("tree", "shellyard run --help", 0), "ms",
            baseline_label="python -c pass, wall p50, ms", baseline_value=base,
            target="≤ 150 ms", kind="abs_max", limit=150.0,
        ),
        metric(
            "cli.help.git", "shellyard --help, wall p50, ms", p50("tree", "shellyard --help", 0),
            "ms", baseline_label="git --help, wall p50, ms",
            baseline_value=p50("tree", "git --help", 0), target="—", kind="info",
        ),
        metric(
            "cli.help.first", "shellyard --help the first time (no kept page), wall p50, ms",
            p50("tree", "shellyard --help, first time", 0), "ms",
            baseline_label="python -c pass, wall p50, ms", baseline_value=base, target="—",
            kind="info",
        ),
        metric(
            "cli.help.cpu", "shellyard --help, CPU p50, ms", p50("tree", "shellyard --help", 1),
            "ms", baseline_label="python -c pass, CPU p50, ms",
            baseline_value=p50("tree", "python -c pass", 1), target="—", kind="info",
        ),
    ]  # fmt: skip
    details: dict[str, Any] = {"rounds": rounds}
    for tree in trees:
        for case in CASES:
            details[f"{tree}: {case}"] = {
                "wall_p50_ms": round(p50(tree, case, 0), 1),
                "cpu_p50_ms": round(p50(tree, case, 1), 1),
            }
    return {
        "name": "cli_startup",
        "title": "7. CLI start-up",
        "command": COMMAND + (" --quick" if args.quick else ""),
        "metrics": metrics,
        "details": details,
    }


if __name__ == "__main__":
    os.environ.pop("SHELLYARD_HOME", None)
    baseline = argparse.ArgumentParser(add_help=False)
    baseline.add_argument("--baseline-src")
    known, rest = baseline.parse_known_args()
    sys.argv = [sys.argv[0], *rest]

    def run(args: argparse.Namespace) -> dict[str, Any]:
        args.baseline_src = known.baseline_src
        return measure(args)

    cli("cli_startup", run, __doc__ or "")
