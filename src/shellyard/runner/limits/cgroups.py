"""Cgroups per execution inside a group per workspace (R2; docs/limits.md "Tenants").

One module, two backends, one tree::

    <this process's own group>/shellyard-<runner tag>/<workspace id>/<execution id>

- **v2**: a delegated unified subtree (the runner's own cgroup when writable, as systemd gives
  a service with ``Delegate=yes``). One folder per level; controllers enabled through
  ``cgroup.subtree_control``.
- **v1**: one folder per level in each of the ``memory``, ``pids``, ``cpu`` and ``cpuacct``
  hierarchies, each below this process's own group in that hierarchy (never elsewhere,
  host_groups.py); where ``cpu`` is mounted apart from ``cpuacct`` an execution joins its
  workspace's ``cpu`` group (weight and ceiling are the workspace's) and has no ``cpu`` folder
  of its own.

Limits: memory per execution (``memory.max`` / ``memory.limit_in_bytes``), processes per
workspace (``pids.max`` on the workspace's group), CPU weight per workspace (every workspace
group has the same weight, whatever its process count) and an optional CPU ceiling per workspace
(``cpu.max`` / ``cpu.cfs_quota_us``). The sandbox's launcher writes itself into the execution's
groups (``cgroup.procs``) before it drops to the sandbox uid and execs bwrap, so nothing of the
command ever runs outside them. At the end ``finish`` reads what the command used
(group_usage.py: peak memory, CPU seconds), whether the memory limit killed it and whether it
hit the process limit, then hands the execution's groups to a removal thread: an ``rmdir`` takes
the kernel's ``cgroup_mutex``, which a launcher's ``cgroup.procs`` write holds while it waits
for an RCU grace period (v1), so removing inline held each execution's end (and, where it ran on
the event loop, every other) for ms at a time (p90 18 ms under load; docs/benchmarks.md §13). By
then the sandbox's init has been killed and waited for (E8), so the groups are empty; the thread
still ends anything left before it removes them. Likewise ``plan`` names the groups at once and
``make`` creates them where the caller chooses (a warm sandbox: its spawn's worker thread). A
spawn takes a group waiting for its workspace (ready_groups.py): when an execution ends, its
groups go back, counters reset, once nothing of it is left in them (recycle.py; v1 groups
already empty at once in ``finish``, others by the removal thread), or, when they cannot start
clean, the thread removes them and makes one new (``READY_PER_WORKSPACE``), so neither
``mkdir``, ``rmdir`` nor limit writes, which wait on ``cgroup_mutex`` under load, are on the
event loop, and most executions need none (docs/limits.md "Groups used again"). A group that
waited ``pool_idle_s`` unused goes (ready_groups.py counts and names the waiting groups).
``sweep`` at start-up removes the groups of executions that are gone (after a kill -9 of the
runner, E11).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import queue
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from shellyard import settings_env
from shellyard.runner.limits import dynmods, group_usage, host_groups, recycle
from shellyard.runner.limits.cgroup_files import children as _children
from shellyard.runner.limits.cgroup_files import read as _read
from shellyard.runner.limits.cgroup_files import remove as _remove
from shellyard.runner.limits.cgroup_files import write as _write
from shellyard.runner.limits.group_usage import Usage
from shellyard.runner.limits.host_groups import V1_CONTROLLERS
from shellyard.runner.limits.ready_groups import READY_PREFIX, ReadyGroups
from shellyard.runner.limits.weight import RunnerWeight
from shellyard.runner.protocol import SandboxPolicy
from shellyard.runner.reaper import Reaper

log = logging.getLogger(__name__)

Mechanism = Literal["v2", "v1"]
V2_CONTROLLERS = ("memory", "pids", "cpu")
#: The weight every workspace group gets (v2 ``cpu.weight`` default; v1 ``cpu.shares``).
CPU_WEIGHT_V2 = 100
CPU_SHARES_V1 = 1024
CFS_PERIOD_US = 100_000
#: The kernel's largest weight: the runner's folder weighs one unit per workspace up to it.
MOST_SHARES_V1, MOST_WEIGHT_V2 = 262_144, 10_000


class _Stop:
    """The removal thread's wake-up at ``close`` (runner/reaper.py): queued behind the work
    handed over before it, so that work is done before the thread ends."""


_STOP = _Stop()


@dataclass(frozen=True)
class TenantLimits:
    """What every group gets. ``memory_bytes`` per execution; ``processes`` and
    ``cpu_ceiling`` (cores, None: none) per workspace."""

    memory_bytes: int
    processes: int
    cpu_ceiling: float | None = None


@dataclass
class _Started:
    workspace_id: str
    #: A package tool's group (tool_groups.py): a sweep never ends it while it runs.
    held: bool = False


def runner_tag(root: Path) -> str:
    """The runner's folder name: one per runner home, found again after a restart."""
    return "shellyard-" + hashlib.sha256(str(root).encode()).hexdigest()[:12]


@dataclass
class CgroupTree:
    """The runner's groups in one backend. Build with ``probe``."""

    mechanism: Mechanism
    #: v1: controller → the runner's folder in that hierarchy; v2: ``{"": folder}``.
    bases: dict[str, Path]
    limits: TenantLimits
    #: v2: the controllers enabled below the runner's folder (all of V2_CONTROLLERS on a
    #: real delegation; fewer on a test hierarchy).
    controllers: tuple[str, ...] = V2_CONTROLLERS
    _workspaces: set[str] = field(default_factory=set)
    _started: dict[str, _Started] = field(default_factory=dict)
    #: v1: whether ``memory.memsw.limit_in_bytes`` can be written (swap accounting).
    _memsw: bool = True
    #: groups of ended executions, removed by ``_reaper`` (off the execution's end)
    _doomed: queue.Queue[Path | str | tuple[str, str] | _Stop | None] = field(
        default_factory=queue.Queue
    )
    #: those of ``_doomed`` not removed yet (a name made again waits for its removal first)
    _pending: set[Path] = field(default_factory=set)
    #: the removal thread (``cgroup-remove``): started at the first hand-over, ended by
    #: ``close`` (a closed runner left one behind before)
    _reaper: Reaper = field(init=False)
    #: the groups waiting for each workspace's next spawn (``ready.take_ready``)
    ready: ReadyGroups = field(default_factory=ReadyGroups)
    #: False: an ended execution's groups are always removed and fresh ones made ahead (the
    #: behaviour before recycle.py; bench/bench_group_reuse.py's baseline)
    reuse: bool = True
    #: v2, a group used again: its CPU µs when it was reset, and the descriptor its
    #: ``memory.peak`` was reset through (recycle.py), by ``<workspace>/<name>``
    _cpu_base: dict[str, int] = field(default_factory=dict)
    _peak_fds: dict[str, int] = field(default_factory=dict)
    #: groups adopted from an earlier runner process (E11): never used again, their limits
    #: and (v2) baselines were that process's
    _adopted: set[str] = field(default_factory=set)
    #: held while a workspace's groups are made and known, and while ``sweep`` decides to
    #: remove an idle one: the removal thread makes groups ahead while a restart sweeps
    _workspace_lock: threading.Lock = field(default_factory=threading.Lock)
    #: the descriptor that keeps the kernel's ``favordynmods`` on (dynmods.py), or None
    _favor_fd: int | None = None
    #: the runner's folder's own CPU weight at the host's level: one unit per workspace in
    #: use (weight.py; without it the whole tree weighed as one process, §34)
    weight: RunnerWeight = field(init=False)

    def __post_init__(self) -> None:
        self._reaper = Reaper("cgroup-remove", self._reap, lambda: self._doomed.put(_STOP))
        if self.mechanism == "v2":
            path = self.bases[""] / "cpu.weight" if "cpu" in self.controllers else None
            self.weight = RunnerWeight(path, CPU_WEIGHT_V2, MOST_WEIGHT_V2)
        else:
            path = self.bases["cpu"] / "cpu.shares" if "cpu" in self.bases else None
            self.weight = RunnerWeight(path, CPU_SHARES_V1, MOST_SHARES_V1)

    # ------------------------------------------------------------------ set-up

    @classmethod
    def probe(cls, tag: str, limits: TenantLimits, want: str = "auto") -> CgroupTree | None:
        """The backend this host offers (``want``: ``auto``, ``v2``, ``v1``, ``off``), its
        runner folder made; None: rlimits only (no writable hierarchy with the controllers)."""
        if want == "off":
            return None
        mounts, own = host_groups.mounts(), host_groups.own_groups()
        if want in ("auto", "v2") and "" in mounts and "" in own:
            base = host_groups.group_folder(mounts[""], own[""])
            available = (_read(base / "cgroup.controllers") or "").split()
            if set(V2_CONTROLLERS) <= set(available) and os.access(base, os.W_OK):
                tree = cls.v2(base, tag, limits, V2_CONTROLLERS)
                if tree is not None:
                    return tree
        if want in ("auto", "v1"):
            bases: dict[str, Path] = {}
            for name in V1_CONTROLLERS:
                if name in mounts and name in own:
                    folder = host_groups.group_folder(mounts[name], own[name])
                    if os.access(folder, os.W_OK):
                        bases[name] = folder
            if "memory" in bases and "pids" in bases:
                seen: dict[Path, str] = {}
                for name in list(bases):  # cpu,cpuacct mounted together: one folder
                    if bases[name] in seen:
                        del bases[name]
                    else:
                        seen[bases[name]] = name
                made = {name: folder / tag for name, folder in bases.items()}
                try:
                    for folder in made.values():
                        folder.mkdir(exist_ok=True)
                except OSError as exc:
                    log.warning("cgroup v1 present but not usable (%s): rlimits apply", exc)
                    return None
                return cls("v1", made, limits)
        return None

    @classmethod
    def v2(
        cls, base: Path, tag: str, limits: TenantLimits, controllers: tuple[str, ...]
    ) -> CgroupTree | None:
        """The v2 backend over the delegated folder ``base`` (the runner's own group)."""
        enable = " ".join(f"+{c}" for c in controllers)
        try:
            if controllers:
                try:
                    _write(base / "cgroup.subtree_control", enable)
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        raise
                    # "no internal processes": the service itself moves to a leaf first.
                    leaf = base / "service"
                    leaf.mkdir(exist_ok=True)
                    for pid in (_read(base / "cgroup.procs") or "").split():
                        with contextlib.suppress(OSError):
                            _write(leaf / "cgroup.procs", pid)
                    _write(base / "cgroup.subtree_control", enable)
            folder = base / tag
            folder.mkdir(exist_ok=True)
            if controllers:
                _write(folder / "cgroup.subtree_control", enable)
        except OSError as exc:
            log.warning("cgroup v2 at %s not usable (%s)", base, exc)
            return None
        return cls("v2", {"": folder}, limits, controllers)

    def describe(self) -> str:
        return ", ".join(str(p) for p in self.bases.values())

    def favor_dynamic_changes(self) -> bool:
        """Joins that wait only for their own process's forks (dynmods.py), held until
        ``close``; False where the kernel refuses."""
        if self._favor_fd is None:
            self._favor_fd = dynmods.favor_dynamic_changes()
        return self._favor_fd is not None

    @property
    def group_moves(self) -> str:
        """How a join into a group waits, for ``runner show`` (docs/limits.md)."""
        if self._favor_fd is None:
            return "host-wide threadgroup lock"
        return "favordynmods (per-process lock from Linux 6.18)"

    # ------------------------------------------------------------------ per execution

    def _levels(self, *parts: str) -> dict[str, Path]:
        return {name: base.joinpath(*parts) for name, base in self.bases.items()}

    def _workspace(self, workspace_id: str) -> None:
        """The workspace's group in every hierarchy, with its process limit and CPU share."""
        if workspace_id in self._workspaces:
            return
        with self._workspace_lock:
            self._make_workspace(workspace_id)

    def _make_workspace(self, workspace_id: str) -> None:
        if workspace_id in self._workspaces:
            return
        for base in self.bases.values():  # made again if a close took it
            base.mkdir(exist_ok=True)
        ceiling = self.limits.cpu_ceiling
        quota = int(ceiling * CFS_PERIOD_US) if ceiling else None
        for name, folder in self._levels(workspace_id).items():
            folder.mkdir(exist_ok=True)
            if self.mechanism == "v2":
                if self.controllers:
                    _write(
                        folder / "cgroup.subtree_control",
                        " ".join(f"+{c}" for c in self.controllers),
                    )
                if "pids" in self.controllers:
                    _write(folder / "pids.max", str(self.limits.processes))
                if "cpu" in self.controllers:
                    _write(folder / "cpu.weight", str(CPU_WEIGHT_V2))
                    _write(folder / "cpu.max", f"{quota or 'max'} {CFS_PERIOD_US}")
            elif name == "pids":
                _write(folder / "pids.max", str(self.limits.processes))
            elif name == "cpu":
                _write(folder / "cpu.shares", str(CPU_SHARES_V1))
                if (folder / "cpu.cfs_period_us").exists():
                    _write(folder / "cpu.cfs_period_us", str(CFS_PERIOD_US))
                    _write(folder / "cpu.cfs_quota_us", str(quota or -1))
        self._workspaces.add(workspace_id)

    def start(self, workspace_id: str, execution_id: str, *, held: bool = False) -> list[str]:
        """Make the execution's groups; the ``cgroup.procs`` files its launcher joins.
        ``held``: a package tool's group, left alone by ``sweep`` until ``finish``."""
        self.make(workspace_id, execution_id)
        return self.plan(workspace_id, execution_id, held=held)

    def plan(self, workspace_id: str, execution_id: str, *, held: bool = False) -> list[str]:
        """The execution known and its ``cgroup.procs`` files named, nothing made yet: the
        caller runs ``make`` before the launcher starts."""
        joins: list[str] = []
        # f-strings, not Path joins (two per hierarchy): plan runs on the event loop's thread
        # for every execution, and the launcher wants strings (docs/benchmarks.md §72)
        for name, base in self.bases.items():
            if name == "cpu" and "cpuacct" in self.bases:
                # v1 with cpu and cpuacct apart: the weight and ceiling are the workspace's
                # and the execution's CPU seconds are cpuacct's, so the execution joins the
                # workspace's cpu group itself: no group (per-CPU run queues) made and
                # removed per execution, one scheduling level less (docs/benchmarks.md §13).
                joins.append(f"{base}/{workspace_id}/cgroup.procs")
            else:
                joins.append(f"{base}/{workspace_id}/{execution_id}/cgroup.procs")
        if self._started.get(execution_id) is None:
            self.weight.enter(workspace_id)
        self._started[execution_id] = _Started(workspace_id, held)
        return joins

    def make(self, workspace_id: str, execution_id: str) -> None:
        """The execution's groups (and its workspace's, the first time) with their limits."""
        self._workspace(workspace_id)
        memory = str(self.limits.memory_bytes)
        levels = self._levels(workspace_id, execution_id)
        if self._pending and not self._pending.isdisjoint(levels.values()):
            self.drain()  # the same name again (a tool's): the old group's removal goes first
        for name, folder in levels.items():
            if name == "cpu" and "cpuacct" in self.bases:
                continue  # it joins the workspace's (plan)
            folder.mkdir(exist_ok=True)
            if self.mechanism == "v2":
                if "memory" in self.controllers:
                    _write(folder / "memory.max", memory)
                    with contextlib.suppress(OSError):  # no swap to hide in
                        _write(folder / "memory.swap.max", "0")
            elif name == "memory":
                _write(folder / "memory.limit_in_bytes", memory)
                if self._memsw:
                    try:
                        _write(folder / "memory.memsw.limit_in_bytes", memory)
                    except OSError:  # no swap accounting on this kernel: not tried again
                        self._memsw = False

    def adopt(self, workspace_id: str, execution_id: str) -> None:
        """A re-attached execution (E11): its groups exist; know it so ``finish`` reads them."""
        self._workspaces.add(workspace_id)
        self._adopted.add(execution_id)
        if execution_id not in self._started:
            self.weight.enter(workspace_id)
            self._started[execution_id] = _Started(workspace_id)

    def usage(
        self, workspace_id: str, execution_id: str, seen: recycle.Seen | None = None
    ) -> Usage:
        """Peak memory, CPU seconds and what ended it, read from the execution's groups."""
        key = f"{workspace_id}/{execution_id}"
        return group_usage.read(
            self.mechanism == "v2",
            self.bases,
            self.controllers,
            workspace_id,
            execution_id,
            cpu_base=self._cpu_base.get(key, 0),
            peak_fd=self._peak_fds.get(key),
            seen=seen,
        )

    def finish(self, workspace_id: str, execution_id: str, *, ahead: bool = False) -> Usage:
        """The sandbox is gone: read its use; its groups go (``remove``), or, v1, when
        already empty and clean, wait at once for the workspace's next spawn (``ahead``).
        An empty group's use is read after it was seen empty, and its reset checks the same
        reads (an OOM kill, a refused fork) instead of reading them again
        (docs/benchmarks.md §75)."""
        seen: recycle.Seen = {}
        poolable = ahead and self._poolable(workspace_id, execution_id)
        usage = self.usage(workspace_id, execution_id, seen)
        if not (poolable and self._pool(workspace_id, execution_id, seen)):
            self.remove(workspace_id, execution_id, ahead=ahead)
        return usage

    def _poolable(self, workspace_id: str, name: str) -> bool:
        """Whether the group may be reset and pooled here, on the caller's thread: a few reads
        and two writes (tens of µs) instead of a wake-up of the removal thread, whose work
        then contends with the event loop for the interpreter (docs/benchmarks.md §50). v1
        only (v2 keeps a descriptor per group); a group not empty yet goes to the thread,
        which waits."""
        if self.mechanism != "v1" or not self.reuse or name in self._adopted:
            return False
        with self.ready.lock:
            if self.ready.full(workspace_id):
                return False
        pids = f"{self.bases['pids']}/{workspace_id}/{name}"  # not a Path join: on the loop
        if self._pending and Path(pids) in self._pending:
            return False
        procs = _read(f"{pids}/cgroup.procs")
        return procs is not None and not procs.strip()  # else gone, or still exiting

    def _pool(self, workspace_id: str, name: str, seen: recycle.Seen | None = None) -> bool:
        """A ``_poolable`` group's counters reset (``seen``: what its end read of it since it
        was empty) and the group put in its workspace's pool; False: it cannot start clean."""
        try:
            clean = recycle.v1_group_reset(self.bases, workspace_id, name, seen)
        except OSError:
            return False
        if not clean:
            return False
        started = self._started.pop(name, None)
        if started is not None:
            self.weight.leave(started.workspace_id)
        with self.ready.lock:
            self.ready.ahead[workspace_id] = self.ready.ahead.get(workspace_id, 0) + 1
            self.ready.ours.add(name)
            first = not self.ready.since
        self.ready.pooled(workspace_id, name)
        if first:  # the removal thread times the idle removal from now on
            self._wake()
        return True

    def _wake(self) -> None:
        self._doomed.put(None)
        self._reaper.start()

    def _own_folders(self, workspace_id: str, name: str) -> list[Path]:
        """The group's folders of its own (not v1's workspace cpu group, which it joins)."""
        return [
            folder
            for kind, folder in self._levels(workspace_id, name).items()
            if not (kind == "cpu" and "cpuacct" in self.bases)
        ]

    def remove(self, workspace_id: str, execution_id: str, *, ahead: bool = False) -> None:
        """Its groups to the removal thread, which ends any process left in them first;
        ``ahead`` (an execution's end): unless one waits already, the thread instead puts
        them back in the workspace's pool once they are empty, counters reset (recycle.py),
        or, when they cannot start clean, removes them and makes a fresh one for the
        workspace's next spawn (ready_groups.py)."""
        started = self._started.pop(execution_id, None)
        if started is not None:
            self.weight.leave(started.workspace_id)
        self._forget(f"{workspace_id}/{execution_id}")
        adopted = execution_id in self._adopted
        self._adopted.discard(execution_id)
        with self.ready.lock:
            ahead = ahead and not self.ready.full(workspace_id)
            again = ahead and self.reuse and not adopted
            if ahead:
                self.ready.ahead[workspace_id] = self.ready.ahead.get(workspace_id, 0) + 1
            if again:
                self.ready.ours.add(execution_id)  # a sweep meanwhile keeps it
            else:
                self.ready.ours.discard(execution_id)
        folders = self._own_folders(workspace_id, execution_id)
        self._pending.update(folders)
        if again:
            self._doomed.put((workspace_id, execution_id))
        else:
            for folder in folders:
                self._doomed.put(folder)
            if ahead:
                self._doomed.put(workspace_id)
        self._reaper.start()  # after the put: a thread on its way out stays for it

    def _forget(self, key: str) -> None:
        self._cpu_base.pop(key, None)
        fd = self._peak_fds.pop(key, None)
        if fd is not None:
            os.close(fd)

    def _make_ahead(self, workspace_id: str) -> None:
        name = READY_PREFIX + os.urandom(8).hex()
        with self.ready.lock:
            self.ready.ours.add(name)
        try:
            self.make(workspace_id, name)
        except OSError as exc:  # the workspace's next command makes its own
            log.warning("could not make a cgroup ahead for %s: %s", workspace_id, exc)
            with self.ready.lock:
                self.ready.ahead[workspace_id] -= 1
                self.ready.ours.discard(name)
            self.ready.notify(workspace_id)
            return
        self.ready.pooled(workspace_id, name)

    def _reset(self, workspace_id: str, name: str) -> bool:
        """Its counters back to zero once nothing is left in it (recycle.py); False: not
        used again."""
        v2 = self.mechanism == "v2"
        reset = recycle.reset(v2, self.bases, self.controllers, workspace_id, name)
        if reset is None:
            return False
        if v2:
            key = f"{workspace_id}/{name}"
            self._cpu_base[key] = reset[0]
            if reset[1] is not None:
                self._peak_fds[key] = reset[1]
        return True

    def _recycle(self, workspace_id: str, name: str) -> None:
        folders = self._own_folders(workspace_id, name)
        try:
            try:
                again = self._reset(workspace_id, name)
            except OSError as exc:
                log.info("not using the cgroup %s/%s again: %s", workspace_id, name, exc)
                again = False
            if again:
                self.ready.pooled(workspace_id, name)
                return
            self._forget(f"{workspace_id}/{name}")
            with self.ready.lock:
                self.ready.ours.discard(name)
            for folder in folders:
                _remove(folder, self.mechanism)
            self._make_ahead(workspace_id)  # in the slot ``remove`` counted
        finally:
            self._pending.difference_update(folders)

    def _expire(self) -> float | None:
        """Remove the groups that waited ``pool_idle_s`` unused; seconds to the next."""
        gone, wait = self.ready.expire()
        for workspace_id, name in gone:
            self._forget(f"{workspace_id}/{name}")
            for folder in self._own_folders(workspace_id, name):
                _remove(folder, self.mechanism)
        return wait

    def _reap(self, reaper: Reaper) -> None:
        wait: float | None = None
        while True:
            try:
                item = self._doomed.get(timeout=wait)
            except queue.Empty:
                wait = self._expire()
                continue
            if isinstance(item, _Stop):
                self._doomed.task_done()
                if reaper.leaving():  # else a hand-over after the stop keeps it going
                    return
                continue
            try:
                if item is None:  # a group waits: time its idle removal (``_pool``)
                    pass
                elif isinstance(item, tuple):
                    self._recycle(*item)
                elif isinstance(item, str):
                    self._make_ahead(item)
                else:
                    _remove(item, self.mechanism)
            except Exception:  # the next sweep tries again; the thread must not die
                log.exception("could not remove the cgroup %s", item)
            finally:
                if isinstance(item, Path):
                    self._pending.discard(item)
                self._doomed.task_done()
            wait = self._expire()

    def drain(self) -> None:
        """Wait until every group handed to ``remove`` is gone (tests, ``sweep``)."""
        self._doomed.join()

    # ------------------------------------------------------------------ restart

    def sweep(self, live: set[str], *, keep_ours: bool = True) -> list[str]:
        """Remove every execution group not in ``live`` (ended while the runner was down, or
        never started, or made ahead by an earlier process) and every empty workspace group;
        returns the removed execution ids. Groups this process made ahead stay, and the
        workspace groups it uses (``keep_ours``: False at ``close``, which removes them too):
        an execution that ends during a restart's sweep makes one, and the next cold spawn
        takes it and joins it and its workspace's while the sweep runs (E11)."""
        self.drain()
        with self.ready.lock:
            if not keep_ours:
                waiting = self.ready.clear()
                for key in list(self._peak_fds):
                    self._forget(key)
            else:
                waiting = []
        for callback in waiting:  # none will come: the caller makes its own
            callback()

        def kept(name: str) -> bool:
            # Read at each group, not once: a group made ahead after this sweep began is
            # named in ``ready.ours`` before its mkdir.
            if name in live:
                return True
            with self.ready.lock:
                if name in self.ready.ours:
                    return True
            started = self._started.get(name)  # a package tool's, running (``start``)
            return started is not None and started.held

        removed: list[str] = []
        for base in self.bases.values():
            for workspace in _children(base):
                for execution in _children(workspace):
                    if kept(execution.name):
                        self._workspaces.add(workspace.name)
                        continue
                    _remove(execution, self.mechanism)
                    if not execution.name.startswith(READY_PREFIX):
                        removed.append(execution.name)
                with self._workspace_lock:
                    # One this process made or uses stays (until ``close``): a command may
                    # be about to make its group in it or join it (v1's cpu group).
                    idle = not keep_ours or workspace.name not in self._workspaces
                    if idle and not _children(workspace):
                        with contextlib.suppress(OSError):
                            workspace.rmdir()
        # A workspace stays known only while it has its group in every hierarchy: on v1 its
        # cpu group (which executions join directly, so no child keeps it) may go while its
        # memory group holds a running execution, and the next start must make it again.
        with self._workspace_lock:
            self._workspaces = {
                workspace
                for workspace in self._workspaces
                if all((base / workspace).is_dir() for base in self.bases.values())
            }
        return sorted(set(removed))

    def close(self, live: set[str]) -> None:
        """The runner stops: groups of running executions stay (they keep running, E11);
        the rest goes, and the runner's folders when nothing is left in them. Then the
        removal thread ends (runner/reaper.py). Removals queued before are done, not left:
        ``sweep`` waits for them (``drain``) and removes every group of no live execution,
        and one handed over during the sweep is queued ahead of the thread's stop, so it
        runs within ``STOP_WAIT_S``; past that (an ``rmdir`` stuck on the kernel) the group
        stays on disk for the next start's ``sweep`` (E11), as after a kill -9."""
        self.sweep(live, keep_ours=False)
        self._reaper.stop()
        for base in self.bases.values():
            with contextlib.suppress(OSError):
                base.rmdir()
        if self._favor_fd is not None:
            os.close(self._favor_fd)
            self._favor_fd = None

    def groups(self) -> list[Path]:
        """Every group below the runner's folders (tests, and ``runner show``)."""
        found: list[Path] = []
        for base in self.bases.values():
            for workspace in _children(base):
                found += [workspace, *_children(workspace)]
        return found


def for_runner(root: Path, policy: SandboxPolicy) -> CgroupTree | None:
    """The runner's tree (``policy.cgroups`` picks the backend; None: rlimits only), with the
    kernel's favordynmods on unless ``SHELLYARD_CGROUP_FAVORDYNMODS=off`` (dynmods.py)."""
    tree = CgroupTree.probe(
        runner_tag(root),
        TenantLimits(
            memory_bytes=policy.memory_limit_bytes or host_groups.default_memory_bytes(),
            processes=min(policy.process_limit, policy.max_processes),
            cpu_ceiling=policy.cpu_ceiling,
        ),
        policy.cgroups,
    )
    if tree is not None and settings_env.get("SHELLYARD_CGROUP_FAVORDYNMODS") != "off":
        tree.favor_dynamic_changes()  # joins off the host-wide lock under fork load
    return tree
