"""Package tools inside the requesting workspace's cgroups (R2; docs/limits.md "Tenants").

A package change's tools (uv, Rscript, conda's child) run the agent's code: a build backend
of an sdist it put in its workspace, an R package's ``configure``. Each tool runs in a group
of its own below the workspace's group, ``<workspace>/<change id>-toolN``, made like an
execution's (``CgroupTree.start``): the execution memory bound (``SHELLYARD_MEMORY_LIMIT``),
and, through the workspace's group, its process limit (``SHELLYARD_PROCESS_LIMIT``) and CPU
weight. So a build that allocates or forks past the limit is stopped, the host and the other
workspaces keep working, and the change's error says which limit (``limit: memory``).

An operator's change with no workspace runs in ``environment-<env id>``, a group of the same
limits. The tool's group is marked held while the tool runs, so a sweep (a runner closing
beside a running change) never ends the tool under it; it goes when the tool has ended.
"""

from __future__ import annotations

from dataclasses import dataclass

from shellyard.runner.limits.cgroups import CgroupTree
from shellyard.runner.limits.group_usage import Usage
from shellyard.runner.protocol import EnvironmentChangeRequest

#: What a change's error starts with when a limit stopped one of its tools.
MEMORY = "memory"
PROCESSES = "processes"


@dataclass
class ToolGroups:
    """The groups of one change's tools. ``tree`` None: no cgroups (rlimits only)."""

    tree: CgroupTree | None
    #: The requesting workspace (its groups hold the tools), or ``environment-<env id>``.
    workspace: str
    change_id: str
    started: int = 0
    #: The first limit that stopped a tool of this change (``MEMORY``, ``PROCESSES``).
    limit: str | None = None
    #: Says it in words, with the limit's value and the setting that gives it.
    note: str | None = None

    @classmethod
    def of(cls, tree: CgroupTree | None, request: EnvironmentChangeRequest) -> ToolGroups:
        """The groups of ``request``'s tools: in its workspace's, or its environment's."""
        held_by = request.workspace_id or f"environment-{request.environment_id}"
        return cls(tree, held_by, request.change_id)

    def explain(self, message: str) -> str:
        """A failed change's error, led by the limit that stopped one of its tools."""
        return message if self.note is None else f"{self.note}; {message}"

    def start(self) -> tuple[str | None, list[str]]:
        """A new tool's group: its name and the ``cgroup.procs`` files its launcher joins."""
        if self.tree is None:
            return None, []
        self.started += 1
        name = f"{self.change_id}-tool{self.started}"
        return name, self.tree.start(self.workspace, name, held=True)

    def remove(self, name: str | None) -> None:
        """The tool never started: its group goes."""
        if self.tree is not None and name is not None:
            self.tree.remove(self.workspace, name)

    def finish(self, name: str | None) -> str | None:
        """The tool has ended: read what stopped it, remove its group; the note, if a
        limit did (written to the change's log by the caller)."""
        if self.tree is None or name is None:
            return None
        return self._judge(self.tree.finish(self.workspace, name))

    def _judge(self, usage: Usage) -> str | None:
        assert self.tree is not None
        limits = self.tree.limits
        if usage.memory_killed:
            found = MEMORY
            words = (
                f"the tool was stopped at its memory limit of "
                f"{limits.memory_bytes / (1 << 20):.0f} MiB (SHELLYARD_MEMORY_LIMIT)"
            )
        elif usage.processes_hit:
            found = PROCESSES
            words = (
                f"the tool's workspace reached its process limit of {limits.processes} "
                f"(SHELLYARD_PROCESS_LIMIT): a fork failed"
            )
        else:
            return None
        note = f"limit: {found}: {words}"
        if self.limit is None:
            self.limit, self.note = found, note
        return note
