"""The CPU weight of the runner's own folder, at the host's level (R2; docs/limits.md
"Tenants", docs/benchmarks.md §34).

Every workspace group has the same weight inside the runner's folder (cgroups.py), so
workspaces share the runner's CPU equally. But that folder is itself one entity among the
host's others (the control plane, PostgreSQL, every other process of the host's root group):
at the kernel's default weight (v1 ``cpu.shares`` 1024, v2 ``cpu.weight`` 100) all the
runner's commands together weighed as much as one process. Without cgroups each process of a
command weighs that much, so on a busy host tenants-on starved the sandboxes' own start-up
(bwrap, the namespaces, the launcher's exec) against the host's other work: 16 agents ran
0.59-0.72x as fast as with tenants off, and the control plane spent more CPU per run waiting
for them (§34).

The runner's folder now weighs one unit per workspace in use: a workspace with groups
started (a command, a warm sandbox, a package tool), at least one unit, at most the
kernel's maximum. At the host's level each workspace in use then weighs as one process does,
whatever its process count: a workspace's 8 busy loops no longer get 8 shares, and 16
workspaces running one command each get what 16 commands got without tenants. The weight is
raised at once when a workspace comes into use, but lowered at most once per
``LOWER_AFTER_S``: agents running commands back to back take workspaces in and out of use at
every end (between a command's end and its next warm sandbox), and a write at each was 3-4%
of the event loop's thread with 16 agents (docs/benchmarks.md §58). Meanwhile it may weigh
more than its workspaces in use (never less), until the next change after that second.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from pathlib import Path

from shellyard.runner.limits.cgroup_files import write

log = logging.getLogger(__name__)

#: The weight is lowered at most this often (seconds); raised at once.
LOWER_AFTER_S = 1.0


class RunnerWeight:
    """``unit`` per workspace in use, written to ``path`` (None: no cpu controller)."""

    def __init__(self, path: Path | None, unit: int, most: int) -> None:
        self.path = path
        self.unit, self.most = unit, most
        self._uses: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._written = unit  # the kernel's default for a new group
        #: when it was last lowered (``LOWER_AFTER_S``)
        self._lowered_at = -math.inf
        self.lower_after_s = LOWER_AFTER_S
        self._failed = False

    @property
    def value(self) -> int:
        return self._written

    def enter(self, workspace_id: str) -> None:
        """A group of the workspace is started (``CgroupTree.plan`` / ``adopt``)."""
        with self._lock:
            self._uses[workspace_id] += 1
            if self._uses[workspace_id] == 1:
                self._apply()

    def leave(self, workspace_id: str) -> None:
        """One of its groups goes (``CgroupTree.remove``)."""
        with self._lock:
            left = self._uses[workspace_id] - 1
            if left > 0:
                self._uses[workspace_id] = left
                return
            self._uses.pop(workspace_id, None)
            self._apply()

    def _apply(self) -> None:
        value = min(self.most, self.unit * max(1, len(self._uses)))
        if self.path is None or value == self._written or self._failed:
            return
        now = time.monotonic()
        if value < self._written and now - self._lowered_at < self.lower_after_s:
            return  # the workspaces that left are likely back at once
        if value < self._written:
            self._lowered_at = now
        try:
            write(self.path, str(value))
        except OSError as exc:  # the runner's folder gone (a close) or not ours to weigh
            if not self.path.parent.is_dir():
                self._written = self.unit  # made again later, at the kernel's default
                return
            log.warning("could not set the runner's CPU weight in %s: %s", self.path, exc)
            self._failed = True
            return
        self._written = value
