"""Where an environment is seen inside a sandbox (V4, R2; docs/security.md "Host paths").

An environment's prefix lives under the runner's home (``<home>/…/environments/<id>/prefix``),
but no sandbox sees that path: the command sandbox and the package tools' sandbox both bind
the prefix at ``ENV`` (/env), and the tools' cache and scratch folder at ``ENV_CACHE`` and
``ENV_SCRATCH`` (the sandbox's own paths, beside /workspace, in ``sandbox/bwrap.py``; bwrap's
root is a tmpfs: any path can be a mount point, and the host view shows none of these).
Everything the prefix's files name (shebangs, conda's relocated files, R's library path) is
then the neutral path, and so are PATH, the tools' arguments and the mount point in
``/proc/self/mountinfo``; a command's line there names no host folder either on a root
runner, which binds an overlay of the prefix of its own (``runner/prefix_mounts.py``).
Runner-side code keeps reading the prefix at its host path; only what runs inside a sandbox
sees the neutral one.

A prefix is not relocatable, so the path its files were built for is recorded beside it
(``BUILT_AT``, written before any tool runs). An environment built before this file existed
has none: its files name its host path, and it keeps being bound there until it is recreated.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from shellyard.runner.sandbox.bwrap import ENV, ENV_CACHE, ENV_SCRATCH
from shellyard.runner.sandbox.bwrap import Mount as Mount

#: Beside the prefix: the path its files were built for (absent: the host path, legacy).
BUILT_AT = "built-at"
#: Where a prefix keeps its R library (an ``r`` environment's, and a conda R's own).
R_LIBRARY = Path("lib/R/library")


def prefix_variables(prefix: Path, seen: Path | None = None) -> dict[str, str]:
    """What a command using the prefix gets (V4), from what the prefix holds now: PATH's
    first entry, VIRTUAL_ENV for a venv, CONDA_PREFIX once conda has put packages in, and
    R_LIBS (R_LIBS_USER too, so ``install.packages`` in a command aims at the read-only
    library, V7) once there is an R library. Each names ``seen``, where the sandbox shows
    the prefix (``seen.py``; default: its host path)."""
    shown = seen if seen is not None else prefix
    env = {"PATH": str(shown / "bin")}
    if (prefix / "pyvenv.cfg").is_file():
        env["VIRTUAL_ENV"] = str(shown)
    if (prefix / "conda-meta").is_dir():
        env["CONDA_PREFIX"] = str(shown)
    if (prefix / R_LIBRARY).is_dir():
        env["R_LIBS"] = str(shown / R_LIBRARY)
        env["R_LIBS_USER"] = str(shown / R_LIBRARY)
    return env


def mount(prefix: Path) -> Mount:
    """``prefix`` for an execution: bound where its files say it is, variables naming that."""
    shown = built_at(prefix)
    return Mount(prefix, prefix_variables(prefix, shown), shown)


def built_at(prefix: Path) -> Path:
    """Where ``prefix``'s files say they are: the recorded path, else the host path."""
    try:
        text = (prefix.parent / BUILT_AT).read_text().strip()
    except FileNotFoundError:
        return prefix
    return Path(text) if text.startswith("/") else prefix


def settle(prefix: Path, fresh: bool) -> Path:
    """Where the tools of a change see ``prefix``: a ``fresh`` one (a create) is built for
    ``ENV``, recorded before any tool runs (``<env_id>/built-at``); an existing one keeps
    the path its files name."""
    if fresh:
        record_built_at(prefix, ENV)
    return built_at(prefix)


def record_built_at(prefix: Path, seen: Path) -> None:
    """Record, before a tool builds ``prefix``, the path its files will name."""
    path = prefix.parent / BUILT_AT
    temp = path.with_name(f".{BUILT_AT}.tmp")
    temp.write_text(f"{seen}\n")
    os.chmod(temp, 0o644)
    os.replace(temp, path)


class Places:
    """The host folders of one change's tools and where its sandbox binds them: the prefix
    (at the path its files were built for), the cache and the scratch folder."""

    def __init__(self, prefix: Path, cache: Path, scratch: Path, seen: Path | None = None):
        self.binds: tuple[tuple[Path, Path], ...] = (
            (prefix, seen if seen is not None else prefix),
            (cache, ENV_CACHE),
            (scratch, ENV_SCRATCH),
        )
        moved = [(str(host), str(shown)) for host, shown in self.binds if host != shown]
        moved.sort(key=lambda pair: -len(pair[0]))  # the longest first, if one holds another
        self._shown = dict(moved)
        # a host path, whole: followed by the end, a separator or a character no path
        # component of ours has (``--python=/…/prefix/bin/python``, ``PATH=/…/bin:/usr/bin``)
        self._pattern = (
            re.compile("(?:" + "|".join(re.escape(h) for h, _ in moved) + r")(?=$|[/:;,'\" =])")
            if moved
            else None
        )

    def inside(self, text: str) -> str:
        """``text`` (an argument, a variable, a script) with each host path of these
        folders replaced by the path the tool's sandbox shows it at."""
        if self._pattern is None:
            return text
        return self._pattern.sub(lambda match: self._shown[match.group(0)], text)

    def inside_env(self, env: Mapping[str, str]) -> dict[str, str]:
        return {name: self.inside(value) for name, value in env.items()}

    def shown(self, host: Path) -> Path:
        return Path(self.inside(str(host)))
