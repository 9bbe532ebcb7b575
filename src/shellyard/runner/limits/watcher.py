"""The limits watcher of a runner: workspace quota and retained-log cap while commands run.

One asyncio task for all running executions of the runner (no thread or process per
execution), ticking every ``limit_check_interval_s`` (0.1 s). Each tick costs one
``statvfs`` of the runner's volume (~7 µs); the volume's growth since the last look is an
upper bound of how much any one workspace or log can have grown, so the trees are walked
and the logs looked at only when that growth could have taken one of them over its limit,
plus a periodic look (``PERIODIC_S``) for the case where another writer freed space at the
same time. A walk runs on a thread of its own. Why this and not a per-workspace file system
or project quotas: docs/limits.md.

The free-space reserve while commands run (docs/limits.md "Full disk, long commands and
bounded records"): the same tick's ``statvfs`` shows the volume's free space; below the
reserve, the running execution that wrote the most since it started (its logs plus its
workspace's growth, measured on the walk thread) is stopped with ``limit: "disk"`` when it
wrote at least ``DISK_OFFENDER_MIN`` of it, one per look, until the volume is above the
reserve again. The reserve is what keeps the snapshot commit, the records and the
database writable after such a stop. The same holds for the volume's free inodes: below
their reserve (``reserve.inode_reserve``) the command that made the most files and folders
since it started is stopped, when it made at least ``INODE_OFFENDER_MIN`` of them.

A workspace over its quota: the sandbox is killed (its pid namespace's init, like the last
step of a cancel) and ``limit.json`` written first into the execution's folder, so the
record names the quota also when the runner restarted in between. The workspace's state is
committed as usual (W3): nothing is lost, the next command runs and may delete files.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shellyard.paths import StrPath
from shellyard.runner import processes
from shellyard.runner.limits import logcap, quota, reserve
from shellyard.runner.limits.cgroups import CgroupTree
from shellyard.runner.limits.group_usage import Usage
from shellyard.runner.limits.settings import (
    ended_by,
    format_size,
    memory_note,
    processes_note,
    runner_limits,
)
from shellyard.runner.protocol import RunnerLimits, SandboxPolicy, SnapshotInfo

log = logging.getLogger(__name__)

#: Longest time between two looks at a running command's tree and logs (see module doc).
PERIODIC_S = 10.0
#: Walks of one tree are spaced at least this many times their own duration apart, so a
#: large tree costs at most ~1/WALK_SPACING of a core however fast the volume grows.
WALK_SPACING = 4.0
#: A log is looked at again once the volume grew by this much beyond the log's headroom.
LOG_SLACK = 64 << 10
LIMIT_FILE = "limit.json"
#: The write rate the quota's documented overshoot assumes at least (``margin_bytes``).
MARGIN_RATE = 2e9
#: An execution is stopped for the reserve only if it wrote at least this much (or a quarter
#: of the reserve, if smaller) since it started: a volume another writer filled does not
#: end a command that wrote a few bytes.
DISK_OFFENDER_MIN = 64 << 20
#: The same for inodes: a command is stopped for the inode reserve only if it made at least
#: this many entries (or a quarter of the reserve, if fewer).
INODE_OFFENDER_MIN = 10_000
STREAMS = ("stdout", "stderr")

#: The workspace's head snapshot (its committed usage); called on the walk thread.
BaselineOf = Callable[[str], SnapshotInfo]
#: What one file or folder may hold beyond its size in blocks (the snapshot counts sizes).
BLOCK_SLACK = 4096


@dataclass
class _Watched:
    execution_id: str
    workspace_id: str
    directory: Path
    tree: Path
    pid: int
    marker: bytes = b""
    #: The workspace's usage when the command started (its head snapshot), once known:
    #: a command may run in a workspace already over quota but not grow it further.
    baseline: int | None = None
    usage: int | None = None
    #: The volume's used bytes when ``usage`` was measured (taken before the walk).
    volume_mark: int = 0
    walked_at: float = 0.0
    walk_cost: float = 0.0
    walking: bool = False
    stopped: bool = False
    cuts: dict[str, logcap.Cut | None] = field(default_factory=dict)
    #: Bytes its logs held when it was first watched (a re-attached one had some already).
    logs_at_start: int = 0


@dataclass
class Ending:
    """What the limits say about a finished execution (``RunnerExecution`` fields)."""

    limit: str | None = None
    notes: list[str] = field(default_factory=list)
    logs_cut: dict[str, int] = field(default_factory=dict)

    def error(self, previous: str | None, exit_code: int | None) -> str | None:
        """The record's ``error``: the runner's own (if any) and then what the limits say.
        A sandbox the quota killed before bwrap reported an exit code looks like one that
        could not start; that message is replaced by the quota's."""
        if self.limit in ("quota", "disk") and exit_code is None:
            previous = None
        return "; ".join([*([previous] if previous else []), *self.notes]) or None


class Guard:
    def __init__(self, root: Path, policy: SandboxPolicy, baseline_of: BaselineOf) -> None:
        self.root = root
        self.policy = policy
        self._baseline_of = baseline_of
        self._watched: dict[str, _Watched] = {}
        self._task: asyncio.Task[None] | None = None
        self._walker: ThreadPoolExecutor | None = None
        self._cutter: ThreadPoolExecutor | None = None
        self._cutting = False
        #: Held by whoever cuts a log (the cutter thread, or ``finish`` on the loop).
        self._cut_lock = threading.Lock()
        self._kills: set[asyncio.Future[None]] = set()
        #: R2 tenants: the runner's cgroups (set by the runner once probed; None: rlimits).
        self.cgroups: CgroupTree | None = None
        #: R2 tenants: how uids are given (``per workspace …`` or the one sandbox uid).
        self.uids = "one uid"
        #: How environments made ``--from`` a base get its files (set by the runner).
        self.base_sharing: str | None = None

        self._log_mark = 0
        self._cut_failed = False
        #: workspace id → its usage when its last command ended (see ``watch``).
        self._known: dict[str, int] = {}
        #: Seconds this watcher spent (ticks, walks, watch/finish): what the limits cost.
        self.spent_s = 0.0
        #: Bytes the volume may grow before some watched log could be over the limit.
        self._log_headroom = LOG_SLACK
        self._logs_at = 0.0
        #: Largest write rate seen between a walk and the next (for ``margin_bytes``).
        self.fastest_growth = 0.0
        #: A look at who fills the volume is under way (below the reserve; see module doc).
        self._disk_looking = False

    @property
    def active(self) -> bool:
        return (
            self.policy.workspace_quota_bytes > 0
            or self.policy.log_limit_bytes > 0
            or self._reserve() > 0
        )

    def _reserve(self) -> int:
        try:
            _free, total = reserve.volume(self.root)
        except OSError:
            return 0
        return reserve.reserve_bytes(self.policy, total)

    def watch(
        self,
        execution_id: str,
        workspace_id: str,
        directory: Path,
        tree: Path,
        pid: int,
        marker: bytes | None = None,
    ) -> None:
        """``marker``: what the environment of the sandbox's init holds (a warm sandbox's
        own id, spawn.py ``LiveExecution.marker``); default its execution id."""
        if not self.active:
            return
        started = time.perf_counter()
        w = _Watched(execution_id, workspace_id, directory, tree, pid)
        w.marker = marker or f"SHELLYARD_EXECUTION_ID={execution_id}".encode()
        logs = _log_stats(directory)  # one stat a log, for all three uses below
        for stream in STREAMS:
            w.cuts[stream] = _load_cut(f"{directory}/{stream}", logs[stream])
        w.logs_at_start = sum(info.st_blocks * 512 for info in logs.values() if info)
        known = self._known.get(workspace_id)
        w.baseline = known  # the committed usage, also for the reserve (``_written``)
        if known is not None and self.policy.workspace_quota_bytes > 0:
            # Measured when the last command here ended, and nothing else wrote since
            # (``forget``): no walk until the volume grows enough to matter.
            w.usage = w.baseline = known
            w.volume_mark = reserve.used_bytes(self.root)
            w.walked_at = time.monotonic()
        self._watched[execution_id] = w
        if any(info and info.st_size for info in logs.values()):
            self._logs_at = 0.0  # re-attached with logs already long: look at once
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())
        self.spent_s += time.perf_counter() - started

    def commit_budget(self) -> int | None:
        """Bytes the commit after a command may hash (snapshots/budget.py): the quota plus
        the documented overshoot, so a command the watcher stops within its margin is
        committed whole. Not the allowance: the head's measure counts apparent sizes (the
        manifest keeps no charge), so after a committed ``truncate -s 60G`` it would let the
        next commit hash 60 GiB. Only changed files are hashed, so ``rm`` in a workspace
        over its quota commits. The overshoot is at the floor rate, not the fastest seen: a
        sparse file's charge grows as fast as its writer likes. None without a quota."""
        quota_bytes = self.policy.workspace_quota_bytes
        if quota_bytes <= 0:
            return None
        return quota_bytes + int(MARGIN_RATE * (self.policy.limit_check_interval_s * 2))

    def forget(self, workspace_id: str) -> None:
        """A writer operation changes the tree: its usage must be measured again."""
        self._known.pop(workspace_id, None)

    def finish(
        self,
        execution_id: str,
        directory: Path,
        exit_code: int | None,
        snapshot: SnapshotInfo | None,
        usage: Usage | None = None,
        refused: tuple[int, int] | None = None,
    ) -> Ending:
        """The sandbox is gone and its tree committed (``snapshot``): last cut of its logs;
        what ended it. Stops watching it. ``refused``: the commit stopped at its budget,
        (bytes it needed at least, bytes it could hash), nothing committed."""
        started = time.perf_counter()
        watched = self._watched.pop(execution_id, None)
        if snapshot is not None:
            self._known[snapshot.workspace_id] = _measure(snapshot)
        ending = Ending()
        limit = self.policy.log_limit_bytes
        for stream in STREAMS:
            path = f"{directory}/{stream}"  # a Path only for a log to cut (§72)
            # After a cut in flight on the cutter thread (the lock), from the record on disk.
            with self._cut_lock:
                info = _stat(path)
                cut = _load_cut(path, info)
                if limit > 0 and info is not None and info.st_size > limit:  # else none to do
                    with contextlib.suppress(OSError):
                        cut = logcap.trim(Path(path), limit, info.st_size, cut)
            if cut is not None:
                ending.logs_cut[stream] = cut.dropped
                ending.notes.append(
                    f"{stream} was cut to the retained-log limit of {format_size(limit)}: "
                    f"{cut.dropped} bytes dropped between its head and its tail (marked in "
                    f"execution_logs; the command was not affected)"
                )
        breach = _read_breach(directory)
        if breach is not None and breach["limit"] == "disk" and breach["inodes"]:
            ending.limit = "disk"
            ending.notes.insert(
                0,
                f"stopped by the runner's free-inode reserve: the volume had {breach['free']} "
                f"files (inodes) free, below its reserve of {breach['reserve']}, and this "
                f"command had made {breach['reached']} files and folders, the most of those "
                f"running. Delete files (or pack them into one archive) and run again",
            )
        elif breach is not None and breach["limit"] == "disk":
            ending.limit = "disk"
            ending.notes.insert(
                0,
                f"stopped by the runner's free-space reserve: the volume had "
                f"{format_size(breach['free'])} free, below its reserve of "
                f"{format_size(breach['reserve'])}, and this command had written "
                f"{format_size(breach['reached'])} (logs and workspace), the most of those "
                f"running. Delete files (a delete is allowed below the reserve) and run again",
            )
        elif refused is not None:  # the commit's budget: nothing committed, unlike below
            ending.limit = "quota"
            ending.notes.insert(
                0,
                f"not committed, over the workspace quota of "
                f"{format_size(self.policy.workspace_quota_bytes)}: the files this command "
                f"changed count at least {format_size(refused[0])} to commit, past the "
                f"{format_size(refused[1])} a commit may hash (a sparse file is charged for "
                f"the bytes its commit must read: each MiB holding any data counts whole, a "
                f"hole of a whole MiB is free). Nothing of this command was committed: its "
                f"files stay in the workspace, not in a snapshot; delete files to get under "
                f"the quota (the next command runs)",
            )
        elif breach is not None:
            ending.limit = "quota"
            ending.notes.insert(
                0,
                f"stopped by the workspace quota of {format_size(breach['quota'])}: the "
                f"workspace reached {format_size(breach['reached'])}. What it wrote is "
                f"committed; delete files to get under the quota (the next command runs)",
            )
        elif usage is not None and usage.memory_killed:
            ending.limit = "memory"
            limit_bytes = self.cgroups.limits.memory_bytes if self.cgroups else 0
            ending.notes.insert(0, memory_note(limit_bytes, usage))
        else:
            by_rlimit = ended_by(exit_code, self.policy)
            if by_rlimit is not None:
                ending.limit = by_rlimit[0]
                ending.notes.insert(0, by_rlimit[1])
            elif watched is not None and (exit_code != 0 or snapshot is None):
                self._ended_on_full_volume(watched, snapshot, ending)
        if usage is not None and usage.processes_hit:
            ending.notes.append(processes_note(self.policy))
        self.spent_s += time.perf_counter() - started
        return ending

    def _ended_on_full_volume(
        self, w: _Watched, snapshot: SnapshotInfo | None, ending: Ending
    ) -> None:
        """A writer faster than a tick can meet ENOSPC before the watcher stops it: when it
        failed with the volume below its reserve and wrote enough, the record says so."""
        with contextlib.suppress(OSError):
            free_inodes, total_inodes = reserve.inodes(self.root)
            kept = reserve.inode_reserve(self.policy, total_inodes)
            if snapshot is None and free_inodes < kept:
                ending.limit = "disk"
                ending.notes.insert(
                    0,
                    f"ended while the runner's volume was below its reserve of files "
                    f"({free_inodes} inodes free, reserve {kept}), its files uncommitted: the "
                    f"volume ran out of inodes. Delete files (a delete is allowed below the "
                    f"reserve) and run again",
                )
                return
            free, total = reserve.volume(self.root)
            reserve_bytes = reserve.reserve_bytes(self.policy, total)
            if free >= reserve_bytes:
                return
            written = max(0, _logs_held(w.directory) - w.logs_at_start)
            if snapshot is not None and w.baseline is not None:
                written += max(0, _measure(snapshot) - w.baseline)
            # No snapshot: the commit itself failed for lack of space, so what the command
            # wrote cannot be measured, and the full volume is the likely cause of both.
            if snapshot is not None and written < min(DISK_OFFENDER_MIN, reserve_bytes // 4):
                return
            wrote = f"after writing {format_size(written)}" if snapshot else "its files uncommitted"
            ending.limit = "disk"
            ending.notes.insert(
                0,
                f"ended while the runner's volume was below its free-space reserve "
                f"({format_size(free)} free, reserve {format_size(reserve_bytes)}), {wrote}: a "
                f"write most likely failed for lack of space. "
                f"Delete files (a delete is allowed below the reserve) and run again",
            )

    def margin_bytes(self) -> int:
        """The documented overshoot: how far past the quota a command can get before it is
        stopped, at the fastest growth seen or 2 GB/s, whichever is more, for one tick plus
        the walk. 2 GB/s is a deliberately high write rate (this machine measured 75 MB/s
        writing 1 GB under load, and 1 GiB of stdout in 3.1 s at best: ~350 MB/s)."""
        rate = max(self.fastest_growth, MARGIN_RATE)
        return int(rate * (self.policy.limit_check_interval_s * 2))

    def limits_view(self) -> RunnerLimits:
        """The effective limits, for ``info()`` (``runner show``, REST and MCP views)."""
        free, total = reserve.volume(self.root)
        return runner_limits(
            self.policy,
            reserve.reserve_bytes(self.policy, total),
            free,
            self.margin_bytes() if self.policy.workspace_quota_bytes else 0,
            self.cgroups,
            self.uids,
            self.base_sharing,
        )

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for pool in (self._walker, self._cutter):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
        self._watched.clear()

    # ------------------------------------------------------------------ the tick

    async def _run(self) -> None:
        interval = self.policy.limit_check_interval_s
        while self._watched:
            await asyncio.sleep(interval)
            started = time.perf_counter()
            try:
                self._tick()
            except Exception:  # a failed look must not end the watching of every execution
                log.exception("the limits watcher failed a tick")
            self.spent_s += time.perf_counter() - started

    def _tick(self) -> None:
        now = time.monotonic()
        volume = os.statvfs(self.root)  # one reading for the logs, both reserves and quotas
        used = reserve.used_of(volume)
        limit = self.policy.log_limit_bytes
        logs_due = used - self._log_mark >= self._log_headroom or now - self._logs_at >= PERIODIC_S
        if limit > 0 and logs_due and not self._cutting:
            # Off the event loop: punching 100 MB out of a file took ~100 ms here (the blocks
            # are freed, and discarded on a volume mounted with ``discard``).
            self._log_mark, self._logs_at = used, now
            if self._cutter is None:
                self._cutter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="log-cut")
            self._cutting = True
            future = asyncio.get_running_loop().run_in_executor(
                self._cutter, self._cut_all, list(self._watched.values())
            )
            future.add_done_callback(self._cut_done)
        if not self._disk_looking:
            free, total = reserve.volume_of(volume)
            reserve_bytes = reserve.reserve_bytes(self.policy, total)
            free_inodes, total_inodes = reserve.inodes_of(volume)
            kept_inodes = reserve.inode_reserve(self.policy, total_inodes)
            if free_inodes < kept_inodes:
                self._look_for_filler(free_inodes, kept_inodes, inodes=True)
            elif free < reserve_bytes:
                self._look_for_filler(free, reserve_bytes)
        quota_bytes = self.policy.workspace_quota_bytes
        if quota_bytes <= 0:
            return
        for w in list(self._watched.values()):
            if w.walking or w.stopped:
                continue
            if w.usage is None:
                due = True
            else:
                allowance = max(quota_bytes, w.baseline or 0)
                spaced = now - w.walked_at >= WALK_SPACING * w.walk_cost
                grown = used - w.volume_mark >= allowance - w.usage
                due = (grown and spaced) or now - w.walked_at >= max(PERIODIC_S, 50 * w.walk_cost)
            if due:
                self._start_walk(w, used)

    def _cut_all(self, watched: list[_Watched]) -> tuple[int, float]:
        started = time.perf_counter()
        headroom = self.policy.log_limit_bytes
        with self._cut_lock:
            for w in watched:
                if w.execution_id in self._watched:
                    headroom = min(headroom, self._cut_logs(w))
        return headroom, time.perf_counter() - started

    def _cut_done(self, future: asyncio.Future[tuple[int, float]]) -> None:
        self._cutting = False
        if future.cancelled():
            return
        try:
            headroom, cost = future.result()
        except Exception:
            log.exception("cutting logs failed")
            return
        self._log_headroom = max(headroom, LOG_SLACK)
        self.spent_s += cost

    def _cut_logs(self, w: _Watched) -> int:
        """Cut the execution's logs that are over the limit; return the smallest headroom
        (bytes one of them may still grow before it must be cut again)."""
        limit = self.policy.log_limit_bytes
        # While the command runs a log may pass the limit by an eighth before it is cut:
        # fewer, larger punches (measured: cutting on every tick cost 22% of the loop's time
        # for 1 GiB under a 64 MiB limit). The cut when it ends is exact.
        slack = max(LOG_SLACK, limit // 8)
        headroom = limit + slack
        for stream in STREAMS:
            path = w.directory / stream
            try:
                size = path.stat().st_size
                cut = w.cuts[stream]
                if size - (cut.dropped if cut is not None else 0) > limit + slack:
                    cut = w.cuts[stream] = logcap.trim(path, limit, size, cut)
            except OSError as exc:
                unsupported = exc.errno in (errno.EOPNOTSUPP, errno.ENOSYS)
                if not (unsupported and self._cut_failed):  # say it once, not every tick
                    log.warning("cannot cut %s (the log is kept whole): %s", path, exc)
                self._cut_failed = self._cut_failed or unsupported
                continue
            kept = size - (cut.dropped if cut is not None else 0)
            headroom = min(headroom, limit + slack - kept)
        return headroom

    # ------------------------------------------------------------------ the reserve

    def _look_for_filler(self, free: int, reserve_bytes: int, inodes: bool = False) -> None:
        """Below the reserve: measure what each running command wrote (on the walk thread)
        and stop the one that wrote the most (``_stop_filler``). ``inodes``: the reserve of
        inodes, measured in entries made (``free`` and ``reserve_bytes`` count inodes)."""
        candidates = [w for w in self._watched.values() if not w.stopped]
        if not candidates:
            return
        if self._walker is None:
            self._walker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="quota-walk")
        self._disk_looking = True
        measure = self._made if inodes else self._written
        future = asyncio.get_running_loop().run_in_executor(self._walker, measure, candidates)
        future.add_done_callback(lambda f: self._stop_filler(f, free, reserve_bytes, inodes))

    def _written(self, candidates: list[_Watched]) -> list[tuple[int, _Watched]]:
        found = []
        for w in candidates:
            logs = max(0, _logs_held(w.directory) - w.logs_at_start)
            tree = 0
            if not w.stopped:
                usage, _entries = quota.tree_usage(w.tree)
                baseline = w.baseline
                if baseline is None:
                    try:
                        baseline = _measure(self._baseline_of(w.workspace_id))
                    except Exception:
                        baseline = 0
                tree = max(0, usage - baseline)
            found.append((logs + tree, w))
        return found

    def _made(self, candidates: list[_Watched]) -> list[tuple[int, _Watched]]:
        """Entries each command's tree (and the workspace's home) holds beyond the files of
        its committed head: an upper bound of the inodes it made (its folders count too)."""
        found = []
        for w in candidates:
            entries = quota.tree_usage(w.tree)[1]
            home = self.root / "homes" / w.workspace_id
            if home.is_dir():
                entries += quota.tree_usage(home)[1]
            try:
                committed = self._baseline_of(w.workspace_id).files
            except Exception:
                committed = 0
            found.append((max(0, entries - committed), w))
        return found

    def _stop_filler(
        self,
        future: asyncio.Future[list[tuple[int, _Watched]]],
        free: int,
        reserve_bytes: int,
        inodes: bool = False,
    ) -> None:
        self._disk_looking = False
        if future.cancelled():
            return
        try:
            found = future.result()
        except Exception:
            log.exception("measuring what the running commands wrote failed")
            return
        live = [(n, w) for n, w in found if w.execution_id in self._watched and not w.stopped]
        if not live:
            return
        written, w = max(live, key=lambda item: item[0])
        least = INODE_OFFENDER_MIN if inodes else DISK_OFFENDER_MIN
        unit = "files (inodes)" if inodes else "bytes"
        if written < min(least, reserve_bytes // 4):
            log.warning(
                "the runner's volume has %d %s free, below its reserve of %d, and no "
                "running command made much of it (the most: %d by %s)",
                free,
                unit,
                reserve_bytes,
                written,
                w.execution_id,
            )
            return
        record: dict[str, object] = {
            "limit": "disk",
            "free": free,
            "reserve": reserve_bytes,
            "reached": written,
            "inodes": int(inodes),
        }
        self._stop(w, record)

    # ------------------------------------------------------------------ the quota

    def _start_walk(self, w: _Watched, used: int) -> None:
        if self._walker is None:
            self._walker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="quota-walk")
        w.walking = True
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._walker, self._walk, w)
        future.add_done_callback(lambda f: self._walked(w, used, f))

    def _walk(self, w: _Watched) -> tuple[int, float, int | None]:
        started = time.monotonic()
        usage, _entries = quota.tree_usage(w.tree)
        home = self.root / "homes" / w.workspace_id  # counted in the quota (local.py home)
        if home.is_dir():
            usage += quota.tree_usage(home)[0]
        baseline = w.baseline
        if baseline is None:
            # The committed tree in the walk's measure: sizes plus a block per file for the
            # rounding up to blocks and a MiB for folders (a command may run in a workspace
            # already over quota, and delete, but not grow it).
            try:
                baseline = _measure(self._baseline_of(w.workspace_id))
            except Exception:
                baseline = 0
        return usage, time.monotonic() - started, baseline

    def _walked(
        self, w: _Watched, used: int, future: asyncio.Future[tuple[int, float, int | None]]
    ) -> None:
        w.walking = False
        if future.cancelled() or w.execution_id not in self._watched:
            return
        try:
            usage, cost, baseline = future.result()
        except Exception:
            log.exception("walking the tree of %s failed", w.execution_id)
            return
        now = time.monotonic()
        if w.usage is not None and now > w.walked_at:
            self.fastest_growth = max(self.fastest_growth, (usage - w.usage) / (now - w.walked_at))
        w.usage, w.walk_cost, w.walked_at, w.volume_mark = usage, cost, now, used
        self.spent_s += cost
        w.baseline = baseline
        allowance = max(self.policy.workspace_quota_bytes, baseline or 0)
        if usage > allowance and not w.stopped:
            quota_bytes = self.policy.workspace_quota_bytes
            self._stop(w, {"limit": "quota", "quota": quota_bytes, "reached": usage})

    def _stop(self, w: _Watched, record: dict[str, object]) -> None:
        w.stopped = True
        tmp = w.directory / (LIMIT_FILE + ".tmp")
        try:
            tmp.write_text(json.dumps(record))
            os.replace(tmp, w.directory / LIMIT_FILE)
        except OSError:  # a full volume: stop it all the same (the record says less)
            log.exception("cannot record why %s is stopped", w.execution_id)
        log.warning(
            "execution %s stopped by the %s limit (%s bytes reached)",
            w.execution_id,
            record["limit"],
            record["reached"],
            extra={"action": "limit", "limit": record["limit"], "execution_id": w.execution_id},
        )
        self._kills.add(task := asyncio.ensure_future(self._kill(w)))
        task.add_done_callback(self._kills.discard)

    async def _kill(self, w: _Watched) -> None:
        status = processes.read_bwrap_status(w.directory / "status")
        init_pid = status.get("child-pid")
        if isinstance(init_pid, int):
            await processes.kill_and_wait(init_pid, w.marker)
        else:
            processes.signal_group(w.pid, signal.SIGKILL)


def _measure(snapshot: SnapshotInfo) -> int:
    """A committed tree in the walk's measure, rounded up: its sizes plus a block per file
    (the walk counts blocks) and a MiB for its folders."""
    return snapshot.bytes + snapshot.files * BLOCK_SLACK + (1 << 20)


def _read_breach(directory: Path) -> dict[str, Any] | None:
    # a str path, bytes: absent at nearly every end, where Path.read_text cost most (§72)
    try:
        with open(f"{directory}/{LIMIT_FILE}", "rb") as file:
            data = json.loads(file.read())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("limit") not in ("quota", "disk"):
        return None
    keys = ("quota", "reached", "free", "reserve", "inodes")
    return {"limit": data["limit"], **{key: int(data.get(key, 0)) for key in keys}}


def _stat(path: StrPath) -> os.stat_result | None:
    with contextlib.suppress(OSError):
        return os.stat(path)
    return None


def _log_stats(directory: Path) -> dict[str, os.stat_result | None]:  # f-strings: §72
    return {stream: _stat(f"{directory}/{stream}") for stream in STREAMS}


def _load_cut(log: StrPath, info: os.stat_result | None) -> logcap.Cut | None:
    """The log's cut in force. A cut needs bytes past its end (a log's size stays the bytes
    written, logcap.py): an empty log has none, and no ``.cut`` file is opened for it (two
    opens of an absent file at every start and every end, docs/benchmarks.md §36)."""
    if info is not None and info.st_size == 0:
        return None
    return logcap.load_cut(Path(log))


def _logs_held(directory: Path) -> int:
    """Bytes the execution's logs hold on the volume (a cut's hole holds none)."""
    held = 0
    for stream in STREAMS:
        with contextlib.suppress(OSError):
            held += (directory / stream).stat().st_blocks * 512
    return held
