"""The conda manager: py-rattler solves against the prefix's installed records and links
packages into the prefix (V2), in a child process the environment's tool sandbox runs.

The runner never runs rattler itself: it reads channels (which may be folders of an agent's
workspace) and unpacks archives, so it runs where every package tool runs, as the sandbox uid
under bubblewrap and the commands' seccomp filter, seeing the prefix, the environment's own
cache, the change's scratch and the local channels the request names, read-only
(docs/environments.md, "Package tools run as the sandbox uid"). ``conda_child.py`` is that
child: the request goes to it as JSON on stdin, progress lines and the prefix's conda records
come back as JSON lines on stdout. The runner itself opens nothing in the prefix for conda.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import platform
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from shellyard.runner.environments.managers import wheels
from shellyard.runner.environments.managers.base import ManagerContext, ManagerError
from shellyard.runner.protocol import EnvErrorKind, EnvironmentChangeRequest, PackageRecord

#: Channels used when a request names none (conda's own default community channel).
DEFAULT_CHANNELS = ("conda-forge",)
#: The child's script, run by path (``python -I``): it imports nothing of shellyard.
CHILD = Path(__file__).with_name("conda_child.py")
#: What the runner copies of a local channel's folders (repodata and package archives).
CHANNEL_SUFFIXES = (".json", ".conda", ".tar.bz2")
_KINDS: frozenset[str] = frozenset(
    {"invalid_spec", "not_found", "conflict", "unreachable", "failed"}
)


class CondaManager:
    name = "conda"

    def __init__(self) -> None:
        #: The records the last change's child reported, by prefix: ``packages`` right after
        #: a conda change needs no second child.
        self._listed: dict[Path, list[PackageRecord]] = {}

    async def apply(self, ctx: ManagerContext, request: EnvironmentChangeRequest) -> None:
        self._listed.pop(ctx.prefix, None)
        if request.action == "uninstall":
            if not request.specs:
                raise ManagerError("invalid_spec", "Name at least one conda package to uninstall.")
            payload = {"action": "uninstall", "specs": list(request.specs), "channels": []}
            network = False
        else:
            # ``create`` may use conda for the interpreter: it is an install into an empty
            # prefix.
            if not request.specs:
                raise ManagerError(
                    "invalid_spec", "Name at least one conda package spec to install."
                )
            channels = [c.strip() for c in (request.channels or list(DEFAULT_CHANNELS))]
            for text in channels:
                if text.startswith((".", "~")) or not text:
                    raise ManagerError(
                        "invalid_spec",
                        f"The conda channel '{text}' is neither a name, a URL nor an absolute "
                        "path; give a channel name (conda-forge), a URL or an absolute folder "
                        "path.",
                    )
            network = any(not is_local(c) for c in channels)
            payload = {"action": "install", "specs": list(request.specs), "channels": channels}
            local = {local_folder(c): c for c in channels if is_local(c)}
            if local:
                # R2: each shown where the request named it (/workspace/…), so the records
                # (url, channel) name no host path of the workspace (docs/security.md)
                named = {f: local_folder(ctx.origins.get(c, c)) for f, c in local.items()}
                shown = {f: Path(os.path.normpath(p)) for f, p in named.items()}
                payload["channels"] = [
                    str(shown[local_folder(c)]) if is_local(c) else c for c in channels
                ]
                ctx.progress("copying the local channels")
                with tempfile.TemporaryDirectory(dir=ctx.scratch.parent, prefix=".read-") as tmp:
                    copies = await asyncio.to_thread(copy_channels, ctx, local, Path(tmp))
                    mounts = {shown[folder]: copy for folder, copy in copies.items()}
                self._listed[ctx.prefix] = await self._child(ctx, payload, mounts, network)
                return
        self._listed[ctx.prefix] = await self._child(ctx, payload, {}, network)

    async def packages(self, ctx: ManagerContext) -> list[PackageRecord]:
        listed = self._listed.pop(ctx.prefix, None)
        if listed is not None:
            return listed
        # no conda here (a venv, an R library): no child; a link there is the child's to read
        if not os.path.lexists(ctx.prefix / "conda-meta"):
            return []
        return await self._child(ctx, {"action": "list", "specs": [], "channels": []}, {}, False)

    async def _child(
        self,
        ctx: ManagerContext,
        payload: dict[str, Any],
        mounts: dict[Path, Path],
        network: bool,
    ) -> list[PackageRecord]:
        rattler = rattler_folder()
        request = {
            **payload,
            # V4: the target prefix as the sandbox shows it: what conda writes into files
            "prefix": ctx.inside(str(ctx.prefix)),
            "cache": ctx.inside(str(ctx.cache)),
            "path": [str(rattler.parent)],
        }
        answers: list[dict[str, Any]] = []
        junk: list[str] = []

        def line(text: str) -> None:
            try:
                answer = json.loads(text)
            except ValueError:
                junk.append(text.strip())
                return
            if isinstance(answer, dict) and isinstance(answer.get("progress"), str):
                ctx.progress(answer["progress"])
            elif isinstance(answer, dict):
                answers.append(answer)

        argv = [wheels._interpreter(os.geteuid() == 0), "-I", str(CHILD)]
        # A cancelled change must not be rolled back while rattler is still writing the
        # prefix, so the child runs to its end even when the caller gives up (the store kills
        # it, and waits for its end, when it abandons the change).
        task = asyncio.ensure_future(
            ctx.run_tool(
                argv,
                # The child and rattler are the runner's own files, not agent-named sources:
                # bound by path (the tools' descriptor walk is for what a request names).
                mounts={**{CHILD: CHILD, rattler: rattler}, **(mounts or {})},
                network=network,
                stdin=json.dumps(request).encode(),
                lines=line,
            )
        )
        try:
            code, tail = await asyncio.shield(task)
        except asyncio.CancelledError:
            await asyncio.wait([task])
            if not task.cancelled():
                task.exception()  # retrieved: its failure no longer matters
            raise
        if answers and isinstance(answers[-1].get("error"), dict):
            error = answers[-1]["error"]
            kind = str(error.get("kind"))
            return_kind: EnvErrorKind = kind if kind in _KINDS else "failed"  # type: ignore[assignment]
            raise ManagerError(return_kind, str(error.get("message")))
        result = answers[-1].get("result") if answers else None
        if code != 0 or not isinstance(result, dict):
            detail = " ".join((tail or " ".join(junk[-3:])).split())[-600:]
            raise ManagerError(
                "failed",
                f"conda's installer stopped without an answer (exit code {code}): "
                f"{detail or 'no output'}",
            )
        try:
            return [PackageRecord(manager="conda", **package) for package in result["packages"]]
        except (TypeError, ValueError, KeyError) as exc:
            raise ManagerError("failed", f"conda's installer answered nonsense ({exc})") from exc


def copy_channels(ctx: ManagerContext, folders: dict[Path, str], store: Path) -> dict[Path, Path]:
    """Copy each local channel's ``noarch`` and platform folders (repodata and archives) into
    the change's scratch, read as the uid of the workspace that asked (``ctx.read_as``) by
    the wheels reader: no link is followed, and a folder only root could read stays unread.
    ``folders``: {channel folder: as the request named it}. Returns {channel path: its
    copy}, for the child's sandbox to show the copy at the channel's own path (the records
    name the channel where it is, not the copy)."""
    mounts: dict[Path, Path] = {}
    budget = wheels.TreeBudget.fresh(ctx.room)  # every channel's copies together
    for number, (folder, named) in enumerate(folders.items()):
        copy = ctx.scratch / "channels" / str(number)
        for subdir in ("noarch", platform_subdir()):
            try:
                wheels.stash_folder(
                    folder / subdir, store, copy / subdir, ctx.read_as, CHANNEL_SUFFIXES, budget
                )
            except ManagerError as exc:
                if exc.kind != "not_found":
                    raise
                if subdir == "noarch":
                    raise ManagerError(
                        "unreachable",
                        f"The conda channel {named} cannot be read: it holds no noarch "
                        "folder the sandbox user can read. Check the path, and index the "
                        "folder (rattler-index or conda index) if it holds packages.",
                    ) from exc
        mounts[folder] = copy
    return mounts


def platform_subdir() -> str:
    machine = platform.machine()
    return {"x86_64": "linux-64", "aarch64": "linux-aarch64"}.get(machine, f"linux-{machine}")


def is_local(channel: str) -> bool:
    return channel.startswith(("/", "file://"))


def local_folder(channel: str) -> Path:
    """The folder a local channel names (``file://`` percent-escapes decoded), bound into
    the child's sandbox at its own path: bubblewrap, as the sandbox uid, resolves it."""
    if channel.startswith("file://"):
        return Path(unquote(urlparse(channel).path))
    return Path(channel)


def rattler_folder() -> Path:
    """Where py-rattler is installed, found without importing it (~20 MiB)."""
    spec = importlib.util.find_spec("rattler")
    if spec is None or not spec.submodule_search_locations:
        raise ManagerError("failed", "py-rattler is not installed with this runner")
    return Path(next(iter(spec.submodule_search_locations)))
