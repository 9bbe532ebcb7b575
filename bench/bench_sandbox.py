"""Benchmark: what the sandbox's defenses cost per spawn (issue 11).

Bare ``bwrap … true`` spawns, no control plane, interleaved one of each per round so the
machine's noise falls on all alike:

- ``default``: the runner's argv under the default policy (network off, seccomp, --cap-drop
  ALL, --disable-userns, the allow-listed host view);
- ``no_seccomp``: the same without ``--seccomp`` (the filter's cost is the difference);
- ``host``: the same with ``--share-net`` (the cost of network ``off``, a namespace of its
  own, is the difference);
- ``egress``: network ``egress``: the in-sandbox relay (socat) started and waited for;
- ``before``: the argv before issue 11 (``/`` bound read-only whole, host network, no seccomp,
  no --cap-drop), for reference;
- ``minimal``: issue 13's floor, ``bwrap --ro-bind / / --dev /dev --proc /proc --unshare-all
  true`` as root, and ``minimal_uid``: the same as the sandbox uid (bwrap then makes a user
  namespace): what the default policy costs over the floor splits into dropping root
  (``minimal_uid`` − ``minimal``) and the policy itself (``default`` − ``minimal_uid``).

Targets: the seccomp filter and the network mode ``off`` each cost ≤ 0.5 ms per spawn: the
median of the per-round differences of CPU time (the whole process tree's, from wait4), which a
busy host does not inflate; the wall-time differences are reported beside them.

    .venv/bin/python bench/bench_sandbox.py [--quick] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common import BareBwrap, make_home, metric, remove_home, summary_ms
from shellyard.runner import processes
from shellyard.runner.sandbox import launch

COMMAND = "python bench/bench_sandbox.py"


class BeforeIssue11(BareBwrap):
    """The argv the runner built before issue 11, for reference."""

    drops_itself = False

    def argv(self, command: Sequence[str], status_fd: int, seccomp_fd: int | None) -> list[str]:
        sandbox = self._sandbox
        limits = sandbox.sandbox_limits(self.policy)
        front = launch.prefix(None, network=None, ids=None, limits=limits)  # prlimit
        argv = [*front, self.bwrap, "--unshare-all", "--share-net"]
        argv += ["--new-session", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        for private in ("/tmp", "/var/tmp", "/run"):
            argv += ["--tmpfs", private]
        for path in self.hidden:
            argv += ["--tmpfs", str(path)]
        ws = str(self.workspace)
        argv += ["--bind", ws, ws, "--chdir", ws, "--hostname", "shellyard"]
        return [*argv, "--json-status-fd", str(status_fd), "--", *command]


class Minimal(BareBwrap):
    """Issue 13's floor: the minimal spawn, as root (``as_root``) or as the sandbox uid."""

    drops_itself = False

    def __init__(self, root: Path, *, as_root: bool) -> None:
        super().__init__(root, seccomp=False)
        if as_root:
            self.ids = None

    def argv(self, command: Sequence[str], status_fd: int, seccomp_fd: int | None) -> list[str]:
        argv = [self.bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        return [*argv, "--unshare-all", "--json-status-fd", str(status_fd), "--", *command]


def _with_chain(bare: BareBwrap) -> BareBwrap:
    """The default argv with nsenter/setpriv/prlimit in front instead of the launcher."""
    bare.launcher = None
    return bare


def timed_spawn(bare: BareBwrap, tag: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one ``bwrap … true``: the CPU time is the whole tree's
    (setpriv, prlimit, bwrap, its init, the command: each waited for by its parent), so it
    counts the work a defense adds, not the time spent waiting for a core on a busy host."""
    start = time.perf_counter()
    popen = bare.spawn(tag=tag)
    _pid, status, usage = os.wait4(popen.pid, 0)
    wall = time.perf_counter() - start
    popen.returncode = os.waitstatus_to_exitcode(status)
    end_namespace(bare.logs / f"status-{tag}")
    if popen.returncode != 0:
        raise RuntimeError(f"bare bwrap ({tag}) exited {popen.returncode}: {bare.stderr(tag)}")
    return wall, usage.ru_utime + usage.ru_stime


def end_namespace(status_file: Path) -> None:
    """What the runner does when a sandbox's command ends (E8): bwrap's monitor has exited,
    but the namespace's init lives on while anything inside does (the egress relay always
    does), so SIGKILL the init and wait until it is gone."""
    init_pid = processes.read_bwrap_status(status_file).get("child-pid")
    if not isinstance(init_pid, int):
        return
    started = processes.start_time(init_pid)
    if started is None:
        return
    processes.signal_process(init_pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while processes.is_same_process(init_pid, started) and time.monotonic() < deadline:
        time.sleep(0.001)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    rounds = 60 if args.quick else 300
    warmup = 10 if args.quick else 30
    home = make_home()
    sock_path = home / "egress.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(sock_path))
    sock_path.chmod(0o666)
    try:
        variants: dict[str, BareBwrap] = {
            "default": BareBwrap(home),
            "chain": _with_chain(BareBwrap(home)),
            "no_seccomp": BareBwrap(home, seccomp=False),
            "host": BareBwrap(home, network="host"),
            "egress": BareBwrap(home, network="egress", egress_socket=sock_path),
            "before": BeforeIssue11(home, seccomp=False, network="host"),
            "minimal": Minimal(home, as_root=True),
            "minimal_uid": Minimal(home, as_root=False),
        }
        samples: dict[str, list[float]] = {name: [] for name in variants}
        cpu: dict[str, list[float]] = {name: [] for name in variants}
        names = list(variants)
        for _ in range(warmup):
            for name in names:
                timed_spawn(variants[name], name)
        for index in range(rounds):
            shift = index % len(names)
            for name in names[shift:] + names[:shift]:
                wall, used = timed_spawn(variants[name], name)
                samples[name].append(wall)
                cpu[name].append(used)
    finally:
        listener.close()
        remove_home(home)
    stats = {name: summary_ms(values) for name, values in samples.items()}
    p50 = {name: stats[name]["p50"] for name in stats}

    def paired(a: str, b: str, of: dict[str, list[float]]) -> float:
        """Median of the per-round differences a − b (ms): each round spawns every variant
        back to back, so the machine's slow drifts cancel out of each difference."""
        diffs = sorted((x - y) * 1000 for x, y in zip(of[a], of[b], strict=True))
        return round(diffs[len(diffs) // 2], 3)

    pairs = {
        "seccomp": ("default", "no_seccomp"),
        "network_off": ("default", "host"),
        "egress": ("egress", "default"),
        "before": ("default", "before"),
        "drop_root": ("minimal_uid", "minimal"),
        "policy": ("default", "minimal_uid"),
        "chain": ("chain", "default"),
    }
    deltas = {key: paired(a, b, samples) for key, (a, b) in pairs.items()}
    cpu_deltas = {key: paired(a, b, cpu) for key, (a, b) in pairs.items()}
    cpu_stats = {name: summary_ms(values) for name, values in cpu.items()}
    metrics = [
        metric(
            "sandbox.seccomp_cost_ms",
            "seccomp filter: CPU per spawn, median per-round difference with it − without",
            cpu_deltas["seccomp"],
            "ms",
            target="≤ 0.5 ms",
            kind="abs_max",
            limit=0.5,
            baseline_label="CPU per spawn without --seccomp (p50 ms)",
            baseline_value=cpu_stats["no_seccomp"]["p50"],
        ),
        metric(
            "sandbox.network_off_cost_ms",
            "network off: CPU per spawn, median per-round difference own netns − --share-net",
            cpu_deltas["network_off"],
            "ms",
            target="≤ 0.5 ms",
            kind="abs_max",
            limit=0.5,
            baseline_label="CPU per spawn with --share-net (p50 ms)",
            baseline_value=cpu_stats["host"]["p50"],
        ),
        metric(
            "sandbox.seccomp_wall_ms",
            "seccomp filter: wall time per spawn, median per-round difference",
            deltas["seccomp"],
            "ms",
            target="reported (noise of a busy host dominates)",
            kind="info",
            baseline_label="bare bwrap without --seccomp (p50 ms)",
            baseline_value=p50["no_seccomp"],
        ),
        metric(
            "sandbox.network_off_wall_ms",
            "network off: wall time per spawn, median per-round difference",
            deltas["network_off"],
            "ms",
            target="reported (noise of a busy host dominates)",
            kind="info",
            baseline_label="bare bwrap with --share-net (p50 ms)",
            baseline_value=p50["host"],
        ),
        metric(
            "sandbox.egress_cost_ms",
            "network egress: median per-round spawn difference, the relay − network off",
            deltas["egress"],
            "ms",
            target="reported (only egress runners pay it)",
            kind="info",
            baseline_label="bare bwrap, default policy (p50 ms)",
            baseline_value=p50["default"],
        ),
        metric(
            "sandbox.launcher_saving_ms",
            "launch.c in front of bwrap instead of setpriv + prlimit: wall time saved per "
            "spawn, median per-round difference",
            deltas["chain"],
            "ms",
            target="reported",
            kind="info",
            baseline_label="default policy spawn through the chain (p50 ms)",
            baseline_value=p50["chain"],
        ),
        metric(
            "sandbox.default_vs_before",
            "default policy spawn, p50 ms (ratio: ÷ the pre-issue-11 argv)",
            p50["default"],
            "ms",
            target="reported",
            kind="info",
            baseline_label="pre-issue-11 argv (p50 ms)",
            baseline_value=p50["before"],
        ),
        metric(
            "sandbox.default_vs_minimal",
            "default policy spawn, p50 ms (ratio: ÷ the minimal bwrap spawn as root)",
            p50["default"],
            "ms",
            target="reported (issue 13's floor)",
            kind="info",
            baseline_label="minimal bwrap as root (p50 ms)",
            baseline_value=p50["minimal"],
        ),
        metric(
            "sandbox.drop_root_ms",
            "dropping root: wall per spawn, median per-round difference minimal as the "
            "sandbox uid − as root",
            deltas["drop_root"],
            "ms",
            target="reported",
            kind="info",
        ),
        metric(
            "sandbox.policy_ms",
            "the policy (view, hidden files, seccomp, rlimits): wall per spawn, median "
            "per-round difference default − minimal as the sandbox uid",
            deltas["policy"],
            "ms",
            target="reported",
            kind="info",
        ),
    ]
    return {
        "name": "sandbox",
        "title": "Sandbox defenses per spawn",
        "command": COMMAND,
        "metrics": metrics,
        "details": {
            "spawn_ms": stats,
            "cpu_ms": cpu_stats,
            "paired_ms": deltas,
            "paired_cpu_ms": cpu_deltas,
            "rounds": rounds,
            "at": time.time(),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--profile", type=Path, default=None)  # accepted like the others
    args = parser.parse_args()
    result = measure(args)
    text = json.dumps(result, indent=2)
    if args.out is not None:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
