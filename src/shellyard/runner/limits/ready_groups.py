"""The pool of groups waiting for a workspace's next spawn (R2; docs/limits.md "Groups used
again"): each made ahead by the cgroup tree's removal thread, or an ended execution's own with
its counters reset (recycle.py). A spawn takes one (``take_ready``) and makes none; at most
``READY_PER_WORKSPACE`` wait per workspace, each at most ``pool_idle_s`` unused.

This module counts and names the groups; cgroups.py makes, resets and removes them. Its
``lock`` is the one the tree holds where a decision reads the pool and changes it together
(an end's group counted for the pool and kept from the sweep at once, ``remove``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

#: Empty groups made ahead (or used again, recycle.py) per workspace for its next spawns
#: (``take_ready``). Two: an agent's call that comes before its next warm sandbox is ready
#: starts cold while that sandbox holds the group that waited, so a busy workspace has two
#: groups in use; with one slot the second end's groups were removed and the next cold start
#: made its own (16 agents: 20–35 % of spawns, docs/benchmarks.md §69). An empty group waits at
#: most ``pool_idle_s``. Read at each decision (bench/bench_reuse_load.py sets it).
READY_PER_WORKSPACE = 2
#: How long such a group waits unused before it is removed (as long as a warm sandbox does).
POOL_IDLE_S = 60.0
#: The prefix of a group made ahead: never an execution's id (``check_id``), so a restart's
#: sweep removes one left by a killed runner like any group of no live execution.
READY_PREFIX = "ready-"


@dataclass
class ReadyGroups:
    """Per workspace, the groups waiting for its next spawn and those on their way."""

    pool_idle_s: float = POOL_IDLE_S
    #: workspace → names of groups made ahead, empty, for its next cold spawn
    ready: dict[str, list[str]] = field(default_factory=dict)
    #: workspace → groups made ahead or queued to be (at most READY_PER_WORKSPACE)
    ahead: dict[str, int] = field(default_factory=dict)
    #: names of groups made ahead by this process, from before their ``make`` until their
    #: removal (waiting, taken or being spawned into): ``sweep`` keeps them, since its list of
    #: live executions is read before these groups are made or joined
    ours: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: name of a group waiting in ``ready`` → when it began to wait (``POOL_IDLE_S``)
    since: dict[str, float] = field(default_factory=dict)
    #: workspace → callbacks for its group on the way (``when_ready``), called once each
    waiters: dict[str, list[Callable[[], None]]] = field(default_factory=dict)

    def full(self, workspace_id: str) -> bool:
        """As many groups wait or are on their way for the workspace as may (``lock`` held)."""
        return self.ahead.get(workspace_id, 0) >= READY_PER_WORKSPACE

    def take_ready(self, workspace_id: str) -> str | None:
        """The name of an empty group waiting for this workspace (made ahead or used
        again; then ``plan`` it and skip ``make``), or None: none is ready, the caller
        makes its own."""
        with self.lock:
            names = self.ready.get(workspace_id)
            if not names:
                return None
            self.ahead[workspace_id] -= 1
            name = names.pop()
            self.since.pop(name, None)
            return name

    def when_ready(self, workspace_id: str, callback: Callable[[], None]) -> bool:
        """``callback`` (on the removal thread) once the group counted for the workspace's
        next spawn but not ready yet (an execution's that just ended, being reset) is ready
        or given up; False, never called: none is on its way. The next warm sandbox made at
        an end waits for it instead of making a group of its own (warm.py)."""
        with self.lock:
            coming = self.ahead.get(workspace_id, 0) > len(self.ready.get(workspace_id, ()))
            if coming:
                self.waiters.setdefault(workspace_id, []).append(callback)
        return coming

    def notify(self, workspace_id: str) -> None:
        """The workspace's group on its way is pooled or given up: its waiters are called."""
        with self.lock:
            callbacks = self.waiters.pop(workspace_id, [])
        for callback in callbacks:
            callback()

    def pooled(self, workspace_id: str, name: str) -> None:
        """The group waits for the workspace's next spawn from now on."""
        with self.lock:
            self.ready.setdefault(workspace_id, []).append(name)
            self.since[name] = time.monotonic()
        self.notify(workspace_id)

    def expire(self) -> tuple[list[tuple[str, str]], float | None]:
        """Forget the groups that waited ``pool_idle_s`` unused: (workspace, name) of each, for
        the tree to remove, and the seconds to the next one's turn (None: none waits)."""
        now = time.monotonic()
        gone: list[tuple[str, str]] = []
        with self.lock:
            for workspace_id, names in self.ready.items():
                for name in list(names):
                    if now - self.since.get(name, now) >= self.pool_idle_s:
                        names.remove(name)
                        self.since.pop(name, None)
                        self.ahead[workspace_id] -= 1
                        self.ours.discard(name)
                        gone.append((workspace_id, name))
            left = min(self.since.values(), default=None)
        return gone, None if left is None else max(0.01, left + self.pool_idle_s - now)

    def clear(self) -> list[Callable[[], None]]:
        """Forget every group (the runner's close, ``lock`` held); the callbacks still waiting
        are returned, for the caller to call once the lock is let go: none will come."""
        waiting = [w for ws in self.waiters.values() for w in ws]
        self.waiters.clear()
        self.ready.clear()
        self.ahead.clear()
        self.ours.clear()
        self.since.clear()
        return waiting


__all__ = ["POOL_IDLE_S", "READY_PER_WORKSPACE", "READY_PREFIX", "ReadyGroups"]
