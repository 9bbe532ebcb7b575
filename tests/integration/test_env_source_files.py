"""A file of the workspace named as a pip source (``find_links`` naming an HTML page of
links, ``index_url`` or ``extra_index_urls`` naming a file) is read by the workspace's
reader like a folder source (``wheels.FolderCopies``: its folder, for the page's relative
links), never bound live from the workspace (docs/security.md "Attack pass (session 44)";
R2 with V2).

Real components: the control plane with its LocalRunner, bubblewrap, uv and an sdist whose
in-tree build backend reports what the build sees. The one step made deterministic is the
agent's swap (the folder replaced by a link to a host folder), placed right after the runner
opened the sources it binds: the last moment before bwrap walks them again.
"""

from __future__ import annotations

import json
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
from shellyard.runner.environments import tools
from shellyard.runner.policy import SandboxPolicy

pytestmark = [pytest.mark.timeout(300), pytest.mark.runner_kinds("local")]

SECRET = "outside-the-workspace-3c9d"
PAGE = b'<html><body><a href="sy_page-1.0.tar.gz">sy_page-1.0.tar.gz</a></body></html>\n'


@pytest.fixture
def outside() -> Iterator[Path]:
    """A host folder any local user may read, hidden by the sandbox's view (/var/tmp), that
    holds a page of links too (so uv, reading it where the workspace's page was, goes on)."""
    folder = Path(tempfile.mkdtemp(prefix="sy-file-src-", dir="/var/tmp"))
    folder.chmod(0o755)
    for name, text in (("secret.txt", SECRET), ("links.html", "<html></html>\n")):
        (folder / name).write_text(text)
        (folder / name).chmod(0o644)
    yield folder
    shutil.rmtree(folder)


@pytest.mark.parametrize(
    ("uids", "swap"),
    [("per-workspace", False), ("off", True)],
    ids=["per-workspace-kept", "one-uid-swapped"],
)
async def test_a_workspace_page_named_as_find_links_is_read_never_bound(
    yard_factory: Any, outside: Path, monkeypatch: pytest.MonkeyPatch, uids: str, swap: bool
) -> None:
    """``find_links=/workspace/idx/links.html`` (a page linking the sdist beside it). Kept,
    with a uid per workspace: the install succeeds from the reader's copy, shown at
    ``/workspace/idx`` (a live bind of the 0700 workspace failed: bwrap, as the tools' uid,
    cannot walk it). Swapped, one uid for all: the agent puts a link to a host folder where
    ``idx`` was after the runner opened what it binds; the build backend finds no secret
    under any ``…/idx`` mount, and no mount point names the home."""
    yard: Yard = await yard_factory(SandboxPolicy(uid_range=uids if uids == "off" else None))
    agent = await _agent(yard)
    environment_id = await _create(yard, agent, "page")
    body = """
    RESULT = {}
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    RESULT["points"] = points
    for point in points:
        if point.endswith("/idx"):
            try:
                with open(os.path.join(point, "secret.txt")) as f:
                    RESULT[point] = f.read()
            except OSError as exc:
                RESULT[point] = "error: " + type(exc).__name__
    """
    files = {
        "idx/links.html": PAGE,
        "idx/sy_page-1.0.tar.gz": backend_sdist("sy-page", "1.0", body),
    }
    await _put(yard, agent, files, {})
    workspace = Path((await _sh(yard, agent, "pwd")).strip())
    assert workspace == Path("/workspace")

    original = tools.open_without_links
    swapped: list[Path] = []

    def open_then_swap(path: Path) -> int:
        fd = original(path)
        # the agent's move, after the runner's walk, before bwrap's own walk of the path
        if swap and path.name == "idx" and not path.is_symlink():
            path.rename(path.with_name("idx.was"))
            path.symlink_to(outside)
            swapped.append(path)
        return fd

    monkeypatch.setattr(tools, "open_without_links", open_then_swap)
    try:
        change = await _install(
            yard, agent, environment_id, manager="pip", index_url="none",
            find_links=["/workspace/idx/links.html"], specs=["sy-page"],
        )  # fmt: skip
    except (ChangeFailed, InvalidInput) as exc:
        assert SECRET not in str(exc), exc
        change = None
    assert change is not None and change.state == "succeeded", change
    seen = await _import(yard, agent, environment_id, "sy_page")
    assert SECRET not in json.dumps(seen), seen
    assert "/workspace/idx" in seen["points"], seen["points"]
    home = str(yard.home.resolve())
    assert not [p for p in seen["points"] if p.startswith(home)], seen["points"]
    assert not swapped, f"the workspace's {swapped} was bound live"
