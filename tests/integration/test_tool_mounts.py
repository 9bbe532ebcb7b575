"""A package tool's sandbox shows no host path of the home in its mountinfo (R2, V4;
docs/security.md "Host paths", "Package tools' folders"): an environment change's prefix,
cache and scratch are bound as writable overlays of their own (root ``/``), not as binds
of the home's folders, and what the tool writes through them lands in the real folders.

Real components: the control plane with its LocalRunner (root, the default policy),
bubblewrap, uv building an sdist whose in-tree build backend is the probe.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from env_fixtures import backend_sdist
from test_env_tool_rights import _agent, _create, _import, _install, _put, _sh

from conftest import Yard
from shellyard.runner.tool_mounts import ToolMounts

pytestmark = [pytest.mark.timeout(300), pytest.mark.runner_kinds("local")]

#: The build backend's view: its mountinfo lines; and the cache, which it writes a marker
#: into and lists (a later change's build sees the earlier one's marker: the cache kept it).
PROBE = """
    with open("/proc/self/mountinfo") as f:
        lines = f.read().splitlines()
    nonce = os.urandom(8).hex()
    before = sorted(n for n in os.listdir("/env-cache") if n.startswith("sy-mark-"))
    with open(os.path.join("/env-cache", "sy-mark-" + nonce), "w") as f:
        f.write(nonce)
    RESULT = {"mountinfo": lines, "nonce": nonce, "before": before}
"""


def _fields(line: str) -> tuple[str, str]:
    """Field 4 (the mount's root in its file system) and 5 (its mount point)."""
    parts = line.split()
    return parts[3], parts[4]


@pytest.mark.skipif(os.geteuid() != 0, reason="overlays need a root runner (Known limits)")
async def test_a_build_sees_no_host_path_of_the_home_in_mountinfo_and_installs(
    yard: Yard,
) -> None:
    """R2 (docs/security.md "Host paths"): an sdist's build backend reads
    /proc/self/mountinfo; no line names the home in field 4 (root) or 5 (mount point);
    /env, /env-cache and /env-scratch are mounts whose root is ``/``. The install still
    works: the package imports in a command (the prefix was written through the overlay),
    and a reinstall in the same environment takes uv's cached wheel (the cache was written
    through its overlay: the backend does not run again, its nonce is the first build's)."""
    needles = {str(yard.home), str(yard.home.resolve())}
    agent = await _agent(yard)
    environment_id = await _create(yard, agent, "toolview")
    sdist = backend_sdist("sy-toolview", "1.0", PROBE)
    await _put(yard, agent, {"dist/sy_toolview-1.0.tar.gz": sdist}, {})
    body = {"manager": "pip", "specs": ["sy-toolview"], "index_url": "none"}
    change = await _install(yard, agent, environment_id, find_links=["/workspace/dist"], **body)
    assert change.state == "succeeded", change
    seen = await _import(yard, agent, environment_id, "sy_toolview")
    leaks = [
        line
        for line in seen["mountinfo"]
        if any(n in field for n in needles for field in _fields(line))
    ]
    assert not leaks, "\n".join(leaks)
    roots = {_fields(line)[1]: _fields(line)[0] for line in seen["mountinfo"]}
    for point in ("/env", "/env-cache", "/env-scratch"):
        assert roots.get(point) == "/", (point, roots.get(point))

    # what the build wrote landed in the real folders: the prefix (the import above, in a
    # command, reads it through the command's own overlay) and the cache, which the next
    # change of the environment reuses
    env_dir = yard.runner_root / "environments" / environment_id
    assert (env_dir / "cache" / f"sy-mark-{seen['nonce']}").is_file()
    assert any((env_dir / "cache" / "uv").iterdir())
    sdist = backend_sdist("sy-toolview-two", "1.0", PROBE)
    await _put(yard, agent, {"dist/sy_toolview_two-1.0.tar.gz": sdist}, {})
    body["specs"] = ["sy-toolview-two"]
    again = await _install(yard, agent, environment_id, find_links=["/workspace/dist"], **body)
    assert again.state == "succeeded", again
    second = await _import(yard, agent, environment_id, "sy_toolview_two")
    assert f"sy-mark-{seen['nonce']}" in second["before"], second["before"]
    await _import(yard, agent, environment_id, "sy_toolview")  # still installed
    # nothing of the changes stays mounted on the host, nor their overlays' work folders
    assert str(env_dir) not in Path("/proc/self/mountinfo").read_text()
    tools = yard.runner_root / "sandbox" / "tools"
    assert [p.name for p in tools.iterdir()] == ["empty"]


@pytest.mark.skipif(os.geteuid() != 0, reason="overlays need a root runner (Known limits)")
async def test_a_workspace_folder_copied_for_the_build_shows_no_host_path(yard: Yard) -> None:
    """R2: with a uid per workspace (the default), a project folder and an index folder of
    the workspace are copied by the reader into the change's scratch and shown to the tool
    where the request named them (``/workspace/proj``, ``/workspace/idx``); those binds'
    field 4 is their path inside the scratch's overlay, not the scratch's host folder."""
    needles = {str(yard.home), str(yard.home.resolve())}
    agent = await _agent(yard)
    environment_id = await _create(yard, agent, "toolcopies")
    await _put(yard, agent, {"sdist.tar.gz": backend_sdist("sy-copied", "1.0", PROBE)}, {})
    await _put(yard, agent, {"idx/x": b""}, {})
    await _sh(yard, agent, "mkdir proj && tar -xzf sdist.tar.gz -C proj --strip-components=1")
    change = await _install(
        yard, agent, environment_id, manager="pip", index_url="none",
        extra_index_urls=["/workspace/idx"], specs=["sy-copied @ file:///workspace/proj"],
    )  # fmt: skip
    assert change.state == "succeeded", change
    seen = await _import(yard, agent, environment_id, "sy_copied")
    roots = {_fields(line)[1]: _fields(line)[0] for line in seen["mountinfo"]}
    assert "/workspace/proj" in roots, sorted(roots)
    leaks = [line for line in seen["mountinfo"] if any(n in line for n in needles)]
    assert not leaks, "\n".join(leaks)


@pytest.mark.skipif(os.geteuid() != 0, reason="overlays need root")
def test_what_a_tool_run_writes_lands_in_the_folder_and_a_restart_detaches_leftovers(
    tmp_path: Path,
) -> None:
    """R2 (tool_mounts.py): what goes through a tool run's overlay (a file, a folder
    renamed, a hard link) is in the real folder at once; the next run mounts again on the
    same work folder (overlayfs' volatile mark cleared); a folder the kernel cannot mount
    (missing) stays bound itself (bwrap then names what is missing, as before); the
    overlays a killed runner left mounted are detached by the next start, never walked;
    ``close`` removes the work folders."""
    folder = tmp_path / "env" / "prefix"
    folder.mkdir(parents=True)
    missing = tmp_path / "env" / "missing"
    mounts = ToolMounts(tmp_path / "tools")
    mounts.startup(True)
    with mounts.mounted([(folder, Path("/env")), (missing, Path("/x"))]) as shown:
        point = shown[0][0]
        assert point != folder and os.path.ismount(point)
        assert shown[1] == (missing, Path("/x"))
        (point / "d").mkdir()
        (point / "d" / "f").write_text("x")
        os.rename(point / "d", point / "e")
        os.link(point / "e" / "f", point / "e" / "g")
        assert (folder / "e" / "g").read_text() == "x"
        assert (folder / "e" / "f").stat().st_nlink == 2
    assert not os.path.ismount(point) and not point.exists()
    with mounts.mounted([(folder, Path("/env"))]) as shown:  # the next run, same work folder
        assert (shown[0][0] / "e" / "f").read_text() == "x"

    left = mounts.mounted([(folder, Path("/env"))])
    point = left.__enter__()[0][0]  # a runner killed while its tool runs
    assert os.path.ismount(point)
    ToolMounts(tmp_path / "tools").startup(True)
    assert not os.path.ismount(point) and not point.exists()
    assert (folder / "e" / "f").read_text() == "x"
    mounts.close()  # an operator build's end: its work folders go
    assert [p.name for p in folder.parent.iterdir()] == ["prefix"]
