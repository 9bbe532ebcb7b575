"""An environment change that reads the asking workspace's files (``find_links`` under
``/workspace/``) holds that workspace's folders (runner/own_mounts.py) from its check to its
end, so its tools read the overlay's view, never the bare folder under it, and no linger
unmount pulls the overlay from under them mid-build (R2, docs/security.md "Host paths").

A real uv build on the in-process local runner (its holds are read directly); root needed
(the overlays are a root runner's), skipped with the reason otherwise."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
from pathlib import Path

import pytest
from env_fixtures import backend_sdist, make_wheel

from conftest import Yard
from shellyard.contract.environments import (
    EnvironmentChangeBody,
    EnvironmentCreateRequest,
    EnvironmentView,
)

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.runner_kinds("local"),
    pytest.mark.skipif(os.geteuid() != 0, reason="a workspace's own overlay is a root runner's"),
]


@pytest.fixture(autouse=True)
def own_mounts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Overlays on whatever the CI sets; no warm sandbox, whose hold would hide the change's."""
    monkeypatch.setenv("SHELLYARD_OWN_MOUNTS", "on")
    monkeypatch.setenv("SHELLYARD_WARM_SANDBOXES", "0")


#: The build backend says it runs (``building`` in its HOME, the change's scratch) and waits
#: for the test's ``go`` there before it builds: the test looks at the holds meanwhile.
WAIT_FOR_GO = """
    home = os.environ["HOME"]
    open(os.path.join(home, "building"), "w").close()
    import time
    for _ in range(2400):
        # listed, not looked up: HOME is an overlay whose upper layer is the folder the test
        # writes ``go`` into; a lookup's miss stays cached there, a listing reads it anew
        if "go" in os.listdir(home):
            break
        time.sleep(0.05)
    RESULT = "built"
"""


async def _until(check: object, what: str) -> None:
    for _ in range(2400):
        if callable(check) and check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never: {what}")


async def _python_environment(yard: Yard, name: str) -> EnvironmentView:
    """A python environment of the yard's runner, ready."""
    created = await yard.plane.environments.create(
        EnvironmentCreateRequest(
            name=name, language="python", runner_id=yard.runner_id, wait_ms=30_000
        )
    )
    if created.state != "ready":
        assert created.change_id is not None, created
        await yard.plane.environments.wait(created.change_id, 120)
    return created


async def _build_started(environments: Path) -> list[Path]:
    """The ``scratch/building`` marker the waiting build backend left (WAIT_FOR_GO)."""
    building: list[Path] = []

    def started() -> bool:
        building[:] = list(environments.glob("*/scratch/building"))
        return bool(building)

    await _until(started, "the build backend ran")
    return building


async def test_a_find_links_install_holds_the_workspace_while_its_tools_run(yard: Yard) -> None:
    sdist = base64.b64encode(backend_sdist("sy-held", "1.0", WAIT_FOR_GO)).decode()
    put = await yard.run(f"mkdir dist && echo {sdist} | base64 -d > dist/sy_held-1.0.tar.gz")
    assert put.exit_code == 0, put
    runner = yard.runner
    workspace = runner.workspace_path(put.workspace_id)
    mounts = runner._mounts
    # no command runs now and no overlay lingers: the change alone must mount and hold it
    await _until(lambda: mounts.holds(put.workspace_id) == [0, 0], "the command let go")
    mounts.linger_s = 0  # a let-go unmounts at once: only a hold keeps the overlay
    await asyncio.to_thread(mounts.unmount_unheld)
    assert not os.path.ismount(workspace)
    created = await _python_environment(yard, "held")
    body = EnvironmentChangeBody(
        manager="pip", specs=["sy-held"], index_url="none", find_links=["/workspace/dist"]
    )
    change = await yard.plane.environments.install(created.environment_id, body)
    building = await _build_started(runner._environments.root)
    # mid-build: the workspace is held once (the change's) and seen through its overlay
    assert mounts.holds(put.workspace_id) == [1, 1]
    assert os.path.ismount(workspace)
    (building[0].parent / "go").touch()
    done = await yard.plane.environments.wait(change.change_id, 120)
    assert done.state == "succeeded", done
    await _until(lambda: mounts.holds(put.workspace_id) == [0, 0], "the change let go")
    assert not os.path.ismount(workspace)  # linger 0: the last hold's end unmounted it
    seen = await yard.run(
        "python -c 'import sy_held; print(sy_held.RESULT)'",
        environment_id=created.environment_id,
    )
    assert seen.stdout.strip() == '"built"', seen


async def test_an_install_naming_no_workspace_source_does_not_hold_the_workspace(
    yard: Yard,
) -> None:
    """R2: the hold is for a change that reads its workspace; one whose only source is a
    folder outside it (here in the operator's allowed /tmp, no index) holds nothing of the
    workspace mid-build, so its overlay is not mounted for it and a file write to it lands
    while the build still waits (a write waiting on the change would never come back
    before the ``go``). The folder's path contains ``/workspace`` (``…/workspace-wheels``),
    so the control plane's loose test sends the change with the caller's workspace: the
    runner's own test of the sources decides."""
    wheels = yard.home / "workspace-wheels"
    wheels.mkdir(mode=0o755)
    (wheels / "sy_free-1.0.tar.gz").write_bytes(backend_sdist("sy-free", "1.0", WAIT_FOR_GO))
    (wheels / "sy_free-1.0.tar.gz").chmod(0o644)
    put = await yard.run("echo start > a.txt")
    assert put.exit_code == 0, put
    runner = yard.runner
    workspace = runner.workspace_path(put.workspace_id)
    mounts = runner._mounts
    await _until(lambda: mounts.holds(put.workspace_id) == [0, 0], "the command let go")
    mounts.linger_s = 0
    await asyncio.to_thread(mounts.unmount_unheld)
    created = await _python_environment(yard, "free")
    body = EnvironmentChangeBody(
        manager="pip", specs=["sy-free"], index_url="none", find_links=[str(wheels)]
    )
    change = await yard.plane.environments.install(created.environment_id, body)
    building = await _build_started(runner._environments.root)
    try:
        assert mounts.holds(put.workspace_id) == [0, 0]  # mid-build: no hold of the change's
        assert not os.path.ismount(workspace)
        written = await asyncio.wait_for(
            yard.plane.files.write("b.txt", b"mid-build\n", workspace_id=put.workspace_id),
            timeout=60,
        )
        assert written is not None
        assert (await yard.run("cat b.txt")).stdout == "mid-build\n"
    finally:
        (building[0].parent / "go").touch()
    done = await yard.plane.environments.wait(change.change_id, 120)
    assert done.state == "succeeded", done


async def test_a_find_links_folder_swapped_for_a_link_mid_build_changes_nothing_installed(
    yard: Yard,
) -> None:
    """R2, V5 (docs/security.md, "the workspace an environment change reads"): the hold does
    not make the workspace busy, so a command may move the ``find_links`` folder away and put
    a link to another folder (with another build of the same package) in its place while the
    change builds. The decided behaviour: the change works on what it read at its start (the
    folder's files copied by the workspace's reader, no link followed, into the change's
    scratch; wheels.py): the command runs at once, and what gets installed and recorded is
    the original files, byte for byte (a wheel of the folder too, installed after the build,
    whose bytes the command also overwrote in the moved folder), never the swapped-in ones."""
    original = backend_sdist("sy-mid", "1.0", WAIT_FOR_GO.replace('"built"', '"original"'))
    other = backend_sdist("sy-mid", "1.0", 'RESULT = "swapped-in"\n')
    wheel = "sy_wheelmid-1.0-py3-none-any.whl"
    kept = make_wheel(yard.home / "w1", "sy-wheelmid", "1.0", {"sy_wheelmid.py": "WHO = 1\n"})
    later = make_wheel(yard.home / "w2", "sy-wheelmid", "1.0", {"sy_wheelmid.py": "WHO = 2\n"})
    files = {
        f"dist/{wheel}": kept.read_bytes(),
        "dist/sy_mid-1.0.tar.gz": original,
        f"other/{wheel}": later.read_bytes(),
        "other/sy_mid-1.0.tar.gz": other,
    }
    put = await yard.run(
        "mkdir dist other && "
        + " && ".join(
            f"echo {base64.b64encode(data).decode()} | base64 -d > {name}"
            for name, data in files.items()
        )
    )
    assert put.exit_code == 0, put
    runner = yard.runner
    created = await _python_environment(yard, "mid")
    body = EnvironmentChangeBody(
        manager="pip",
        specs=["sy-mid", "sy-wheelmid"],
        index_url="none",
        find_links=["/workspace/dist"],
    )
    change = await yard.plane.environments.install(created.environment_id, body)
    building = await _build_started(runner._environments.root)
    try:  # mid-build: the agent's command swaps the folder for a link, and is not held up
        swap = await yard.run(
            f"mv dist dist.was && ln -s other dist && cp other/{wheel} dist.was/ && readlink dist"
        )
        assert swap.exit_code == 0 and swap.stdout == "other\n", swap
    finally:
        (building[0].parent / "go").touch()
    done = await yard.plane.environments.wait(change.change_id, 120)
    assert done.state == "succeeded", done
    seen = await yard.run(
        "python -c 'import sy_mid, sy_wheelmid; print(sy_mid.RESULT, sy_wheelmid.WHO)'",
        environment_id=created.environment_id,
    )
    assert seen.stdout.split() == ['"original"', "1"], (seen.state, seen.error, seen.stderr)
    prefix = runner._environments.prefix(created.environment_id)
    recorded = json.loads((prefix / ".shellyard" / "pip-sources.json").read_text())
    assert recorded["sy-mid==1.0"]["source"] == "/workspace/dist", recorded
    assert recorded["sy-wheelmid==1.0"] == {
        "source": "/workspace/dist",
        "sha256": hashlib.sha256(kept.read_bytes()).hexdigest(),
    }, recorded
