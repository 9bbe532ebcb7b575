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
from env_fixtures import backend_sdist
from test_env_tool_rights import _agent, _create, _import, _install, _put, _sh

from conftest import Yard
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
