"""The interface every package manager implements, and what it is handed.

``runner/environments/store.py`` owns the prefix and the journal (recovery.py the rollback); a
manager only changes the prefix it is given and reports the packages it sees there. A manager raises
``ManagerError`` with a message that says what was wrong and what to do (V8); the caller rolls
the prefix back, so a manager never needs to clean up after itself.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from shellyard.runner.environments.managers.readers import Readers
from shellyard.runner.protocol import EnvErrorKind, EnvironmentChangeRequest, PackageRecord

#: Called with a short progress line ("solving", "downloading 3/10", "linking") for displays.
Progress = Callable[[str], None]


class ManagerError(Exception):
    def __init__(self, kind: EnvErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind: EnvErrorKind = kind
        self.message = message


@dataclass
class ManagerContext:
    """Everything a manager may use for one change."""

    #: The environment's prefix on the host (the sandboxes see it at ``seen.built_at``).
    prefix: Path
    #: A private scratch folder for this change, removed afterwards.
    scratch: Path
    #: The environment's own package caches (uv's, rattler's), reused by its later changes and
    #: by no other environment's (docs/environments.md, "Caches").
    cache: Path
    progress: Progress
    #: Runs a tool's process (uv, Rscript) with the prefix writable and the rest of the host
    #: read-only; ``binds`` adds local folders (file:// channels, wheel folders) read-only.
    #: Returns (exit code, combined output tail). Set by the environment store. ``stdin``:
    #: bytes written to the tool's stdin; ``lines``: gets each line of its stdout, which then
    #: does not go to the log (how conda's child answers); ``mounts``: {path the tool sees:
    #: the runner's copy shown there}.
    run_tool: ToolRunner
    #: Variables describing the prefix (VIRTUAL_ENV, CONDA_PREFIX, R_LIBS …).
    env: dict[str, str] = field(default_factory=dict)
    #: Local sources as the runner resolved them → as the request named them (the name a
    #: revision records; ``/workspace/…`` stays ``/workspace/…``).
    origins: dict[str, str] = field(default_factory=dict)
    #: The content-addressed store local wheels are copied into before they are installed
    #: (``<sha256>`` files), so a revision names bytes that cannot change under it.
    wheels: Path | None = None
    #: Path lists of conda archives already checked, by sha256, out of every tool's reach.
    verified: Path | None = None
    #: The readers of local sources the caller named, run as the workspace's uid
    #: (``front``: ``launch.prefix``; empty on a non-root runner), never as root; bounded
    #: by their progress and killed with the change (readers.py).
    read_as: Readers = field(default_factory=Readers)
    #: A host path of the prefix, cache or scratch as the tools' sandbox shows it (V4,
    #: ``seen.Places.inside``): for what a tool reads other than its arguments and
    #: variables (which ``run_tool`` translates itself), e.g. a script's text or stdin.
    inside: Callable[[str], str] = str
    #: Raises LowOnSpace when the runner's volume is below the free-space reserve (with what
    #: was being done): the runner's own copies of local sources check it as they write.
    room: Callable[[str], None] = field(default=lambda what: None)


def tools_folder(path: Path, prefix: Path) -> None:
    """``mkdir -p path`` inside ``prefix``, each folder it makes owned like the prefix (the
    tools' uid on a root runner: docs/environments.md), so the tool can write in it."""
    st = prefix.lstat()
    folder = prefix
    for part in path.relative_to(prefix).parts:
        folder = folder / part
        # no tool runs now, and a link a build left is never entered by root (R2)
        if os.path.islink(folder):
            raise ManagerError(
                "failed",
                f"{folder.relative_to(prefix)} in the environment's prefix is a symbolic "
                f"link (left by a package build); recreate the environment",
            )
        if not os.path.lexists(folder):
            os.mkdir(folder, 0o755)
            os.lchown(folder, st.st_uid, st.st_gid)


class ToolRunner(Protocol):
    async def __call__(
        self,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        binds: list[Path] | None = None,
        network: bool = True,
        stdin: bytes | None = None,
        lines: Callable[[str], None] | None = None,
        mounts: dict[Path, Path] | None = None,
    ) -> tuple[int, str]: ...


class PackageManager(Protocol):
    """One manager, working on a prefix other managers may also have changed (V2)."""

    name: str

    async def apply(self, ctx: ManagerContext, request: EnvironmentChangeRequest) -> None:
        """Install or uninstall ``request.specs`` into ``ctx.prefix``; raise ManagerError."""
        ...

    async def packages(self, ctx: ManagerContext) -> list[PackageRecord]:
        """Every package this manager sees installed in the prefix now."""
        ...
