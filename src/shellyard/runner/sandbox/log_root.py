"""The files a sandbox inherits as descriptors (its stdout, stderr and status; an environment
tool's log), opened through one detached copy of the runner root's mount (R2,
docs/security.md "Host paths").

The kernel prints an open file's path, in ``/proc/<pid>/fd/N``, up to the root of the mount
it was opened through: opened by path, a sandbox's ``readlink /proc/self/fd/1`` read
``<home>/runners/local/executions/ex_…/stdout``. Through a detached copy rooted at the
runner's root it reads ``/executions/ex_…/stdout``: no path of the home. One copy for the
runner's life, made at start-up and closed at stop, not one per spawn: making and dissolving
a copy per execution was 15 % of ``serve``'s busy samples (docs/benchmarks.md §24, §28).

Rooted at the runner's root, not at ``executions/``: a warm sandbox's files are opened in
``sandbox/warm/<id>/`` and its folder is renamed into ``executions/`` when a command takes it
(warm.py); a copy of ``executions/`` would print the warm folder's host path, a copy of the
root prints ``/sandbox/warm/<id>/stdout`` before the rename and ``/executions/ex_…/stdout``
after. The copy is not recursive: the mounts the runner makes below its root (the overlays of
``workspaces/``, ``homes/`` and ``views/``, the egress tmpfs ``sandbox/egress/``, the network
namespaces' files in ``sandbox/netns/``) are not in it, and nothing is opened through them;
``executions/``, ``sandbox/warm/`` and ``environments/`` are never below one of them.

Not root (the kernel refuses the copy): by path, and the link shows the host path as before
(docs/security.md, Known limits). A folder outside the root, or a runner that has not made
its copy (an operator's base build, environments/operator_tools.py): a copy per call
(``own_mounts.open_unnamed``), as before.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from shellyard.runner.own_mounts import detached_copy, open_names, open_unnamed

_O_FOLDER = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class LogRoot:
    """One runner's detached copy of its root (``open`` at start-up, ``close`` at stop)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root
        self._tree: int | None = None
        #: the kernel refused the copy (not root): files are opened by path
        self.refused = False

    def open(self) -> None:
        """Make the copy, once (a second call keeps the first)."""
        if self.root is not None and self._tree is None and not self.refused:
            self._tree = detached_copy(self.root)
            self.refused = self._tree is None

    def close(self) -> None:
        """The runner stops; descriptors opened through the copy keep it alive in the
        sandboxes that run on (E11) and it goes with the last of them."""
        tree, self._tree = self._tree, None
        if tree is not None:
            os.close(tree)

    def open_files(self, directory: Path, names: Sequence[str], flags: int, mode: int) -> list[int]:
        """``names`` in ``directory`` opened with ``flags``/``mode``, through the copy when
        ``directory`` is below the root."""
        relative = self._relative(directory)
        if relative is None:
            if not self.refused:
                return open_unnamed(directory, names, flags, mode)
            relative = os.fspath(directory)  # not root: by path, as open_unnamed would
        folder = os.open(relative, _O_FOLDER, dir_fd=self._tree)
        try:
            return open_names(folder, names, flags, mode)
        finally:
            os.close(folder)

    def _relative(self, directory: Path) -> str | None:
        """``directory`` relative to the root, when the copy is there and it is below it."""
        if self._tree is None or self.root is None:
            return None
        try:
            return os.fspath(directory.relative_to(self.root))
        except ValueError:
            return None
