"""The package tools of an operator's build (``shellyard env prepare``), sandboxed like an
agent's.

A base is built by the operator on the runner's host, outside any runner process, but what
its tools run is not the operator's code: uv runs build backends of the sdists it resolves,
R loads the packages' own code. So they run through the very ``SandboxedTools`` an agent's
environment change uses (runner/environments/tools.py): the sandbox uid (never the host's
root), the executions' seccomp filter and host view (no /etc secrets, no home, no token), none
of the operator's variables but the proxy and CA ones, and the network of the package tools
(``SHELLYARD_TOOL_NETWORK``; ``egress``: this process starts an egress proxy of its own with
the runner's rules, so the tools reach the package registries and nothing private). Only
the prefix, the build's cache and a scratch folder are writable to them.

What stays privileged is the store's side (docs/security.md, "Operator builds"): making the
revision's folder, handing it to the sandbox uid before the tools run and sealing it
afterwards (every file to ``BASE_OWNER``, every folder to root, read-only, set-id bits
gone), the revision record and ``current``. The sealing walks the prefix without following
a link, after every tool's sandbox is gone (``--die-with-parent`` and the pid namespace).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from shellyard.errors import InvalidInput
from shellyard.runner import own_mounts
from shellyard.runner.environments.tools import SandboxedTools, give_to_tools
from shellyard.runner.network.egress_proxy import EgressProxy
from shellyard.runner.policy import SandboxPolicy, policy_from_env
from shellyard.runner.sandbox import bwrap as sandbox
from shellyard.runner.sandbox import folder_access, launch
from shellyard.runner.sandbox.seccomp import SeccompProfile
from shellyard.runner.sandbox.spawn import Sandboxes
from shellyard.runner.tool_mounts import ToolMounts

#: How long one tool of a base build may run (a first build downloads ~100 MB of wheels).
TOOL_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class OperatorBuild:
    """The tools of one build and the folders they were given."""

    run_tool: SandboxedTools
    scratch: Path
    cache: Path
    ids: tuple[int, int] | None


def sandbox_group(policy: SandboxPolicy | None = None) -> int | None:
    """The sandbox group every workspace uid and the tools' uid have (a root runner's), the
    one group the bases root lets pass (bases._make_traversable); None when not root."""
    ids = sandbox.sandbox_ids(policy or policy_from_env(SandboxPolicy()))
    return None if ids is None else ids[1]


def check_reachable(folders: list[Path], policy: SandboxPolicy | None = None) -> None:
    """Refuse, saying what to do, a local source folder of the operator's that the tools'
    uid cannot walk to: the tools read it as that uid, never through root's rights."""
    ids = sandbox.sandbox_ids(policy or policy_from_env(SandboxPolicy()))
    if ids is None:
        return
    for folder in folders:
        for step in [folder, *folder.parents]:
            if not folder_access.can_search(step, *ids):
                raise InvalidInput(
                    f"--find-links {folder}: the package tools run as uid {ids[0]}, which "
                    f"cannot enter {step}; name a folder they can read (e.g. under /srv, "
                    f"with its parents searchable: chmod o+x) or copy the files there"
                )


@contextlib.asynccontextmanager
async def sandboxed_build(
    prefix: Path,
    cache: Path,
    log_path: Path,
    policy: SandboxPolicy | None = None,
    seen: Path | None = None,
) -> AsyncIterator[OperatorBuild]:
    """Tools that may write ``prefix`` (made here, empty), ``cache`` (the bases' own, given
    to the tools for this build and taken back after it, 0700) and a scratch folder. The
    sandbox's own files (seccomp filter, launcher, egress socket, scratch) live in a private
    temporary folder outside the bases (whose folder executions may see: none reaches the
    build's proxy), removed afterwards. ``policy``: the sandbox settings (default: the
    environment's). ``seen``: where the tools see ``prefix``, the path its files will name
    (V4: a base's neutral path, ``bases.SEEN``; default its host path)."""
    policy = policy or policy_from_env(SandboxPolicy())
    ids = sandbox.sandbox_ids(policy)
    work = Path(tempfile.mkdtemp(prefix="shellyard-build-"))  # 0700, the operator's
    scratch = work / "scratch"
    scratch.mkdir(mode=0o700)
    cache.mkdir(parents=True, exist_ok=True)
    prefix.mkdir(mode=0o755)
    for path in (prefix, cache, scratch):
        give_to_tools(path, ids)
    box = Sandboxes(
        policy=policy,
        ids=ids,
        bwrap=sandbox.find_bwrap(),
        view=sandbox.HostView((), ()),
        seccomp=SeccompProfile(work / "seccomp.bpf"),
        disable_userns=False,
    )
    # R2: the build's prefix, cache and scratch as overlays of their own (tool_mounts.py)
    mounts = ToolMounts(work / "mounts")
    proxy: EgressProxy | None = None
    try:
        await asyncio.to_thread(mounts.startup, own_mounts.allowed())
        box.tool_mounts = mounts if mounts.enabled else None
        if ids is not None:  # bwrap, as the sandbox uid, walks to what it binds
            for folder in (work, cache.parent):
                folder_access.grant_folder(folder, *ids)
        box.disable_userns = await asyncio.to_thread(
            sandbox.bwrap_supports, box.bwrap, "--disable-userns"
        )
        box.view = await asyncio.to_thread(
            sandbox.HostView.build, policy.host_paths, [work], work / "empty", True
        )
        await asyncio.to_thread(box.seccomp.write)
        box.launcher = await asyncio.to_thread(launch.build, work / "bin")
        if policy.tools_network == "egress":
            box.socat = sandbox.find_socat()
            proxy = EgressProxy(work / "egress.sock", policy.egress_rules())
            await proxy.start()
            box.egress_socket = proxy.socket_path
        tools = SandboxedTools(
            sandboxes=box,
            prefix=prefix,
            cache=cache,
            scratch=scratch,
            log_path=log_path,
            base_env={},
            on_spawn=lambda _pid, _started: None,  # --die-with-parent: none outlives us
            timeout_s=TOOL_TIMEOUT_S,
            seen=seen,
        )
        try:
            yield OperatorBuild(tools, scratch, cache, ids)
        finally:
            tools.kill_all()
    finally:
        if proxy is not None:
            await proxy.close()
        box.view.close()
        await asyncio.to_thread(mounts.close)  # before the walk that removes ``work``
        # The cache is the operator's again between builds: no sandbox uid process reads
        # or changes what the next build trusts.
        if ids is not None:
            await asyncio.to_thread(give_to_tools, cache, (os.geteuid(), os.getegid()))
        cache.chmod(0o700)
        await asyncio.to_thread(shutil.rmtree, work, True)
