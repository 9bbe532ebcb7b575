"""The second engineer's attack pass on "nothing an agent sends runs with more than its
sandbox's rights" (docs/security.md, "Attack pass (second engineer)"; R2 with V2).

Real components: the control plane with its LocalRunner (and the runner daemon), bubblewrap,
uv and an sdist whose in-tree build backend is the attack. The agent puts its files in its own
workspace through ``run_shell``; the one step made deterministic is the moment of its swap (a
link put where a checked folder was, between the runner's check and the tool's start), which
an agent can only aim at by timing.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cran_repo import build_test_repo, r_available
from env_fixtures import backend_sdist
from test_env_tool_rights import _agent, _create, _import, _install, _put, _sh

from conftest import Yard
from shellyard.contract.environments import EnvironmentRevisionsQuery
from shellyard.errors import ChangeFailed, InvalidInput
from shellyard.runner.environments.managers import pip
from shellyard.runner.policy import SandboxPolicy

pytestmark = pytest.mark.timeout(300)

SECRET = "outside-the-sandbox-view-5be1"


@pytest.fixture
def outside() -> Iterator[Path]:
    """A host folder any local user may read, which the sandbox's view hides (/var/tmp is a
    tmpfs inside) and which no allowed package source names."""
    folder = Path(tempfile.mkdtemp(prefix="sy-attack-", dir="/var/tmp"))
    folder.chmod(0o755)
    (folder / "secret.txt").write_text(SECRET)
    (folder / "secret.txt").chmod(0o644)
    yield folder
    shutil.rmtree(folder)


@pytest.mark.parametrize(
    ("uids", "swap"),
    [
        ("per-workspace", True),
        ("per-workspace", False),
        ("off", True),
        ("off", False),
    ],
    ids=["per-workspace-swapped", "per-workspace-kept", "one-uid-swapped", "one-uid-kept"],
)
async def test_a_local_index_swapped_for_a_link_after_the_check_binds_nothing_outside(
    yard_factory: Any, outside: Path, monkeypatch: pytest.MonkeyPatch, swap: bool, uids: str
) -> None:
    """R2 (TOCTOU): ``extra_index_urls`` names ``/workspace/idx``, a real folder when the
    runner checks it; before the tool starts the agent puts a link to a host folder there.
    The tool's sandbox must not show that folder: the build backend (run beside the bind)
    finds no secret, whether the install is then refused or goes on. Kept (no swap): the
    workspace's folder and project directory reach the tool though the workspace belongs to
    another uid than the tools' (R2 tenants), and the install succeeds. ``off``: one uid for
    every workspace (``SHELLYARD_UID_RANGE=off``), the tools' own."""
    yard: Yard = await yard_factory(SandboxPolicy(uid_range=uids if uids == "off" else None))
    agent = await _agent(yard)
    environment_id = await _create(yard, agent, "swap")
    body = """
    RESULT = {}
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    for point in points:
        if point.endswith("/idx"):
            try:
                with open(os.path.join(point, "secret.txt")) as f:
                    RESULT[point] = f.read()
            except OSError as exc:
                RESULT[point] = "error: " + type(exc).__name__
    """
    await _put(yard, agent, {"proj/placeholder": b""}, {})
    # the project, unpacked (a directory requirement is built where it is)
    await _put(
        yard, agent, {"sdist.tar.gz": backend_sdist("sy-swap", "1.0", body), "idx/x": b""}, {}
    )
    await _sh(yard, agent, "tar -xzf sdist.tar.gz -C proj --strip-components=1")
    workspace = Path((await _sh(yard, agent, "pwd")).strip())
    assert workspace == Path("/workspace")

    original = pip._Sources.stash
    swapped: list[Path] = []

    def swap_then_stash(self: Any, ctx: Any, store: Path, requirements: list[Any]) -> Any:
        # the agent's move, landing after the check: idx becomes a link to the host folder
        for local in list(self.local):
            if swap and local.name == "idx" and not local.is_symlink():
                local.rename(local.with_name("idx.was"))
                local.symlink_to(outside)
                swapped.append(local)
        return original(self, ctx, store, requirements)

    monkeypatch.setattr(pip._Sources, "stash", swap_then_stash)
    try:
        change = await _install(
            yard, agent, environment_id, manager="pip", index_url="none",
            extra_index_urls=["/workspace/idx"], specs=["sy-swap @ file:///workspace/proj"],
        )  # fmt: skip
    except (ChangeFailed, InvalidInput) as exc:  # refused: the link met, never followed
        assert SECRET not in str(exc), exc
        change = None
    if not swap:
        assert change is not None and change.state == "succeeded", change
        seen = await _import(yard, agent, environment_id, "sy_swap")
        assert list(seen.values()) == ["error: FileNotFoundError"], seen
        return
    if yard.daemon is None:
        assert swapped, "the swap did not happen: the test proves nothing"
    if change is not None and change.state == "succeeded":
        seen = await _import(yard, agent, environment_id, "sy_swap")
        assert SECRET not in json.dumps(seen), seen
    else:
        assert change is None or SECRET not in json.dumps(change.model_dump(mode="json")), change
    assert os.path.exists(outside / "secret.txt")


async def _listed(yard: Yard, agent: str, environment_id: str, name: str) -> list[Any]:
    """The package ``name`` in every revision's package list, as the agent reads it."""
    revisions = await yard.plane.environments.revisions(
        environment_id, EnvironmentRevisionsQuery(), agent
    )
    packages = [p for r in revisions for p in r.model_dump(mode="json")["packages"]]
    return [p for p in packages if p["name"] == name]


async def test_a_workspace_index_named_only_in_extra_index_urls_installs_as_named(
    yard: Yard,
) -> None:
    """R2 with V2: a local index in the workspace named only by ``extra_index_urls`` (a
    uid per workspace, the default of a root runner). The control plane sends the caller's
    workspace for it (its test is the runner's, ``contract.sources.names_workspace``; a
    substring test skipped this field and the runner refused the change as naming no
    workspace); the tool reads the reader's copy at ``/workspace/idx`` (bwrap as the tools'
    uid could not bind a folder of the 0700 workspace); the build runs there, and the
    package list names the index as the request did, never the home's host path."""
    agent = await _agent(yard)
    environment_id = await _create(yard, agent, "extra")
    body = """
    RESULT = {"cwd": os.getcwd(), "mounts": open("/proc/self/mountinfo").read()}
    """
    sdist = backend_sdist("sy-extra", "1.0", body)
    page = b'<a href="sy_extra-1.0.tar.gz">sy_extra-1.0.tar.gz</a>\n'
    await _put(
        yard,
        agent,
        {"idx/sy-extra/sy_extra-1.0.tar.gz": sdist, "idx/sy-extra/index.html": page},
        {},
    )
    change = await _install(
        yard, agent, environment_id, manager="pip", specs=["sy-extra"],
        extra_index_urls=["/workspace/idx"],
    )  # fmt: skip
    assert change.state == "succeeded", change
    seen = await _import(yard, agent, environment_id, "sy_extra")
    points = [line.split()[4] for line in seen["mounts"].splitlines()]
    assert "/workspace/idx" in points, points
    listed = await _listed(yard, agent, environment_id, "sy-extra")
    # every index the install could use, as the request named it
    assert listed and all("/workspace/idx" in p["source"].split() for p in listed), listed
    home = str(yard.home.resolve())
    assert home not in json.dumps(seen["cwd"]) and home not in json.dumps(listed)


@pytest.mark.runner_kinds("local")  # the agent's move is made in this process (stash)
@pytest.mark.parametrize("uids", ["per-workspace", "off"])
async def test_a_project_folder_changed_after_it_was_read_builds_what_was_read(
    yard_factory: Any, monkeypatch: pytest.MonkeyPatch, uids: str
) -> None:
    """R2 (TOCTOU) with V2: ``name @ file:///workspace/proj`` is read once, as the change
    starts; the agent's command that rewrites a file of the project after that (here: right
    after the runner read its sources, before uv starts) changes nothing the build sees: the
    tool builds the runner's copy, not a live bind of the workspace's folder."""
    yard: Yard = await yard_factory(SandboxPolicy(uid_range=uids if uids == "off" else None))
    agent = await _agent(yard)
    environment_id = await _create(yard, agent, "late")
    body = """
    with open("note.txt") as f:
        RESULT = f.read()
    """
    await _put(yard, agent, {"sdist.tar.gz": backend_sdist("sy-late", "1.0", body)}, {})
    await _sh(yard, agent, "mkdir proj && tar -xzf sdist.tar.gz -C proj --strip-components=1")
    await _sh(yard, agent, "echo read > proj/note.txt")
    original = pip._Sources.stash
    changed: list[Path] = []

    def stash_then_change(self: Any, ctx: Any, store: Path, requirements: list[Any]) -> Any:
        out = original(self, ctx, store, requirements)
        for requirement in requirements:  # the runner paths of the request's folders
            note = Path(str(requirement.url)) / "note.txt"
            note.write_text("changed\n")
            changed.append(note)
        return out

    monkeypatch.setattr(pip._Sources, "stash", stash_then_change)
    change = await _install(
        yard, agent, environment_id, manager="pip", index_url="none",
        specs=["sy-late @ file:///workspace/proj"],
    )  # fmt: skip
    assert change.state == "succeeded", change
    assert changed, "the change did not happen: the test proves nothing"
    assert await _import(yard, agent, environment_id, "sy_late") == "read\n"
    assert (await _sh(yard, agent, "cat proj/note.txt")) == "changed\n"


@pytest.mark.skipif(not r_available(), reason="R (Rscript) is not installed on this machine")
async def test_a_cran_repository_of_the_workspace_installs_and_is_recorded_as_named(
    yard: Yard, tmp_path: Path
) -> None:
    """R2 with V2, V4: ``repos=["/workspace/repo"]`` with a uid per workspace (the default
    of a root runner): R reads the runner's copy where the request named it (bwrap, as the
    tools' uid, could not bind a folder of the 0700 workspace), and the package list names
    the repository so, never the home's host path."""
    built = build_test_repo(tmp_path / "cran")
    files = {
        f"repo/{path.relative_to(built)}": path.read_bytes()
        for path in sorted(built.rglob("*"))
        if path.is_file()
    }
    agent = await _agent(yard)
    environment_id = await _create(yard, agent, "cranws")
    await _put(yard, agent, files, {})
    change = await _install(
        yard, agent, environment_id, manager="cran", specs=["shellyardhello"],
        repos=["/workspace/repo"],
    )  # fmt: skip
    assert change.state == "succeeded", change
    listed = await _listed(yard, agent, environment_id, "shellyardhello")
    assert listed and all("/workspace/repo" in str(p["source"]) for p in listed), listed
    assert str(yard.home.resolve()) not in json.dumps(listed)
