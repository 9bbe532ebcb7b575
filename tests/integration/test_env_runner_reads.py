"""What the root runner reads and chowns after a package tool ran (docs/security.md, the
"runner reads after a tool" door; V5, T1): ``pip-sources.json``, each dist-info's
``METADATA`` and ``INSTALLER`` read without following a link, and the ownership walk of the
change's cache and scratch (``tools.give_to_tools``: ``lstat`` + ``lchown``).

A build backend (run by uv as the tools' uid in the tool sandbox) leaves in the prefix:
a dist-info whose ``METADATA`` and ``INSTALLER`` are links to a root-only canary, a
dist-info folder that is itself a link to the canary's folder, and ``.shellyard`` (the
runner's ``pip-sources.json`` folder) swapped for a link to that folder. The runner must
read none of it into any record. A hard link to a host file left in the environment's
cache (planted here as root: a build cannot link across its bind mounts, and
``fs.protected_hardlinks`` stops it linking a file not its own) must not be given to the
tools' uid by the next change's walk. Root needed (a root runner's tools' uid), skipped
otherwise."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from env_fixtures import backend_sdist
from test_attack_pass_41 import _agent
from test_env_tool_rights import _create, _install

from conftest import Yard

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.runner_kinds("local"),  # the runner's own files are read here
    pytest.mark.skipif(os.geteuid() != 0, reason="the tools' own uid is a root runner's"),
]

SECRET = "canary-secret-7f3a"

#: The backend's traps, planted in the target prefix while it builds (``PREFIX``, ``CANARY``
#: are filled in: the prefix is bound at its own path in the tool's sandbox, V4).
TRAPS = """
    import glob
    prefix, canary = PREFIX, CANARY
    site = glob.glob(prefix + "/lib/python*/site-packages")[0]
    links = os.path.join(site, "sy_trap_links-6.6.dist-info")
    os.makedirs(links, exist_ok=True)
    for name in ("METADATA", "INSTALLER"):
        os.symlink(os.path.join(canary, name), os.path.join(links, name))
    os.symlink(canary, os.path.join(site, "sy_trap_folder-6.6.dist-info"))
    ours = os.path.join(prefix, ".shellyard")
    if os.path.lexists(ours):
        os.rename(ours, ours + ".old")
    os.symlink(canary, ours)
    RESULT = "built"
"""


def _canary(folder: Path) -> Path:
    """A root-only folder with a METADATA, an INSTALLER and a pip-sources.json that name
    the secret: what the runner (root) could read, the tools' uid not."""
    folder.mkdir(mode=0o700)
    (folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {SECRET}\nVersion: 6.6.6\n\n")
    (folder / "INSTALLER").write_text(f"{SECRET}\n")
    sources = {f"{SECRET}==6.6.6": {"source": f"https://{SECRET}.invalid/", "sha256": None}}
    (folder / "pip-sources.json").write_text(json.dumps(sources))
    for file in folder.iterdir():
        file.chmod(0o600)
    return folder


def _files_naming(root: Path, needle: bytes, skip: Path) -> list[str]:
    """Files under ``root`` (not following links, not below ``skip``) containing ``needle``."""
    found = []
    for folder, dirs, files in os.walk(root):
        if Path(folder) == skip:
            dirs[:] = []
            continue
        for name in files:
            path = os.path.join(folder, name)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue
            with os.fdopen(fd, "rb") as handle:
                try:
                    if needle in handle.read():
                        found.append(path)
                except OSError:
                    pass
    return found


async def test_a_build_that_leaves_links_and_hard_links_gets_no_root_read_or_chown(
    yard: Yard,
) -> None:
    agent = await _agent(yard)
    env_id = await _create(yard, agent, "reads")
    environments = yard.runner._environments
    prefix = environments.prefix(env_id)
    canary = _canary(yard.home / "canary")
    wheels = yard.home / "trap-wheels"
    wheels.mkdir(mode=0o755)
    body = TRAPS.replace("PREFIX", repr(str(prefix))).replace("CANARY", repr(str(canary)))
    sdist = wheels / "sy_trap-1.0.tar.gz"
    sdist.write_bytes(backend_sdist("sy-trap", "1.0", body))
    sdist.chmod(0o644)
    change = await _install(
        yard, agent, env_id, manager="pip", specs=["sy-trap"], index_url="none",
        find_links=[str(wheels)],
    )  # fmt: skip
    view = await yard.plane.environments.show(env_id, agent)
    (site,) = prefix.glob("lib/python*/site-packages")
    assert (site / "sy_trap_folder-6.6.dist-info").is_symlink(), "the trap was not laid"
    assert change.state == "succeeded", change
    # the runner's own folder a build swapped for a link is the runner's folder again
    assert not (prefix / ".shellyard").is_symlink()
    # what the runner recorded: the change, the environment's view, every file it keeps
    assert SECRET not in change.model_dump_json(), change
    assert SECRET not in view.model_dump_json(), view
    assert _files_naming(yard.home, SECRET.encode(), skip=canary) == []

    # A hard link to a host file in the environment's cache: the next change's walk of the
    # cache (``fresh_private``) leaves the host file's owner and mode as they were.
    host_file = yard.home / "host-file"
    host_file.write_text("the host's\n")
    host_file.chmod(0o600)
    os.link(host_file, prefix.parent / "cache" / "left-link")
    again = await _install(
        yard, agent, env_id, manager="pip", specs=["sy-trap"], index_url="none",
        find_links=[str(wheels)],
    )  # fmt: skip
    assert again.state == "succeeded", again  # already installed: no build, no trap
    st = os.stat(host_file)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, 0, 0o600), st
