"""The bytes one commit may hash: a command's commit is bounded by its workspace's quota.

The quota's walk (``limits/quota.py``) counts what a file's commit must hash, but a command
can write and end between two walks, and the commit after it (W3) would then hash whatever
it left: files with a byte in every MiB take 4 KiB of disk per MiB hashed, so a workspace
within its quota could cost each commit hours of a runner's CPU. A command's commit is
given the quota (and the watcher's overshoot) as a budget (``Guard.commit_budget``); each
file is charged before it is read (``workspace_paths.hash_cost``), and the first that does
not fit ends the commit: nothing of it becomes the head. The record's words are the watcher's
(``Guard.finish``)."""

from __future__ import annotations

import threading


class HashBudgetExceeded(Exception):
    """A commit refused: what it had to hash passed its budget."""

    def __init__(self, needed: int, limit: int) -> None:
        self.needed, self.limit = needed, limit
        super().__init__(f"the commit needs at least {needed} bytes hashed, past its {limit}")


class HashBudget:
    """Bytes a commit may still hash; shared by the commit's walk and its hashing threads."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.taken = 0
        self._lock = threading.Lock()

    def take(self, cost: int) -> None:
        """Charge a file about to be read; raise if it does not fit (nothing is charged)."""
        with self._lock:
            if self.taken + cost > self.limit:
                raise HashBudgetExceeded(self.taken + cost, self.limit)
            self.taken += cost
