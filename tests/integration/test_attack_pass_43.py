"""Attack pass of session 43 (second engineer): environment changes' sources by every
spelling, package builds, and (phase 2) the neutral prefix and the relays' namespace join.
R2, V1–V4; docs/security.md "Attack pass (session 43)".

As the holder of one session's agent token (a second session made through the admin API),
on real bubblewrap sandboxes and uv on the in-process local runner."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from cran_repo import build_test_repo, r_available
from env_fixtures import backend_sdist, make_wheel
from test_attack_pass_41 import _agent
from test_env_tool_rights import _create, _install, _put

from conftest import Yard
from shellyard.errors import ShellyardError

pytestmark = [pytest.mark.timeout(300), pytest.mark.runner_kinds("local")]


@pytest.fixture
def hidden_folder() -> Iterator[Path]:
    """A world-readable host folder the sandbox's host view does not show (/var/tmp is a
    private tmpfs inside) and no operator allowed as a package source."""
    folder = Path("/var/tmp") / f"sy-attack43-{uuid.uuid4().hex[:8]}"
    folder.mkdir(mode=0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("form", ["file:{path}", "{path}", "file:{dir}", "{dir}"])
async def test_a_spec_naming_a_host_path_without_slashes_is_held_to_the_source_rule(
    yard: Yard, hidden_folder: Path, form: str
) -> None:
    """``name @ file:/path`` and ``name @ /path`` (no ``://``) skipped the source check
    (``sources._Checker.pip`` rewrote only ``://`` URLs), so an agent installed a wheel from
    a host folder nobody allowed and the sandbox hides, or had a host folder bound into the
    package tool's sandbox. Refused now as ``file://`` URLs are."""
    wheel = make_wheel(hidden_folder, "sy-hidden", "1.0", {"sy_hidden.py": "RESULT = 'host'\n"})
    wheel.chmod(0o644)
    project = hidden_folder / "project"
    project.mkdir(mode=0o755)
    (project / "pyproject.toml").write_text(
        '[project]\nname = "sy-hidden"\nversion = "1.0"\n'
        '[build-system]\nrequires = []\nbuild-backend = "b"\nbackend-path = ["."]\n'
    )
    agent = await _agent(yard)
    environment_id = await _create(yard, agent, "hidden")
    target = form.format(path=wheel, dir=project)
    try:
        change = await _install(
            yard, agent, environment_id, manager="pip", index_url="none",
            specs=[f"sy-hidden @ {target}"],
        )  # fmt: skip
    except ShellyardError as exc:
        assert "not in a local folder this runner allows" in exc.message, exc.message
        return
    raise AssertionError(f"a host path nobody allowed was used: {change}")


async def test_a_spec_naming_the_runners_folder_without_slashes_is_refused(
    yard: Yard,
) -> None:
    """The same spelling into the runner's own folder (other sessions' workspaces, its
    records): refused as the ``file://`` form is, before anything is read or bound."""
    agent = await _agent(yard)
    environment_id = await _create(yard, agent, "root")
    home = yard.home / "home"
    runner = home / "runners" / "local"
    for target in (f"file:{home}", str(home), f"{runner}/workspaces", f"file:{runner}/x.whl"):
        with pytest.raises(ShellyardError, match="runner's own folder"):
            await _install(
                yard, agent, environment_id, manager="pip", index_url="none",
                specs=[f"sy-root @ {target}"],
            )  # fmt: skip


PLANT = """
    import glob
    prefix = {prefix!r}
    planted = []
    for name, target in {links!r}.items():
        path = os.path.join(prefix, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.symlink(target, path)
        planted.append(path)
    RESULT = planted
"""


@pytest.mark.skipif(not r_available(), reason="R (Rscript) is not installed on this machine")
async def test_a_link_a_build_leaves_in_the_r_library_is_never_written_through(
    yard: Yard, home: Path
) -> None:
    """A pip build backend (the agent's code, the tools' uid) leaves symbolic links in its
    prefix's R library where the runner, as root, keeps the R packages' sources file
    (``.shellyard-sources.json`` and its temp ``.shellyard-sources.tmp``). A CRAN install
    then records its package there: before, root wrote the JSON through the link (a root-only
    host file overwritten) and read the sources file through its link. Now neither link is
    followed."""
    victim = home / "victim"
    victim.write_text("original\n")
    victim.chmod(0o600)
    secret = home / "secret.json"
    secret.write_text('{"shellyardhello": {"manager": "cran", "repository": "s3cr3t"}}')
    secret.chmod(0o600)
    repo = build_test_repo(home / "cran")
    agent = await _agent(yard)
    environment_id = await _create(yard, agent, "rlinks")
    prefix = yard.home / "home" / "runners" / "local" / "environments" / environment_id
    library = "lib/R/library"
    links = {
        f"{library}/.shellyard-sources.tmp": str(victim),
        f"{library}/.shellyard-sources.json": str(secret),
    }
    body = PLANT.format(prefix=str(prefix / "prefix"), links=links)
    await _put(
        yard, agent, {"dist/sy_plant-1.0.tar.gz": backend_sdist("sy-plant", "1.0", body)}, {}
    )
    change = await _install(
        yard, agent, environment_id, manager="pip", specs=["sy-plant"], index_url="none",
        find_links=["/workspace/dist"],
    )  # fmt: skip
    assert change.state == "succeeded", change
    try:
        change = await _install(
            yard, agent, environment_id, manager="cran", specs=["shellyardhello"],
            repos=[repo.as_uri()],
        )  # fmt: skip
    except ShellyardError as exc:
        assert "link" in exc.message, exc.message
    else:
        assert change.state == "succeeded", change
        revisions = await yard.plane.environments.revisions(environment_id, agent)
        assert "s3cr3t" not in " ".join(r.model_dump_json() for r in revisions)
    assert victim.read_text() == "original\n"


SPARSE = """
    import glob
    site = glob.glob(os.path.join({prefix!r}, "lib", "python3*", "site-packages"))[0]
    made = []
    for name, target in {links!r}.items():
        path = os.path.join(site, name) if not name.startswith("/") else name
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.symlink(target, path)
        made.append(path)
    huge = os.path.join(site, "sy_huge-6.6.dist-info")
    os.makedirs(huge)
    with open(os.path.join(huge, "METADATA"), "wb") as f:
        f.truncate({size})  # sparse: no room taken, the reserve never sees it
        f.seek({size})
        f.write(b"\\nName: sy-huge\\nVersion: 6.6\\n\\n")
    linked = os.path.join(site, "sy_linked-1.0.dist-info")
    os.makedirs(linked)
    with open(os.path.join(linked, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\\nName: sy-linked\\nVersion: 1.0\\n")
    os.symlink({secret!r}, os.path.join(linked, "direct_url.json"))
    RESULT = made
"""


async def test_what_a_build_leaves_in_a_prefix_is_read_bounded_and_without_links(
    yard: Yard, home: Path
) -> None:
    """A pip build backend leaves in its prefix: a ``lib/python3.99`` link to a root-only
    host folder holding a dist-info, a dist-info whose ``direct_url.json`` is a link to a
    root-only JSON file, and a sparse METADATA of 300 MiB with its headers at the end. Before,
    root listed the host folder's package, named the secret as a package's source, and read
    the whole sparse file into the runner's memory. Now none is followed, and a METADATA is
    read up to 1 MiB (its headers are at its start)."""
    hidden = home / "hostlib"
    info = hidden / "site-packages" / "sy_hostonly-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sy-hostonly\nVersion: 1.0\n")
    hidden.chmod(0o700)
    secret = home / "direct.json"
    secret.write_text('{"url": "file:///s3cr3t-url"}')
    secret.chmod(0o600)
    agent = await _agent(yard)
    environment_id = await _create(yard, agent, "leaves")
    prefix = yard.home / "home" / "runners" / "local" / "environments" / environment_id
    links = {f"{prefix}/prefix/lib/python3.99": str(hidden)}
    body = SPARSE.format(
        prefix=str(prefix / "prefix"), links=links, secret=str(secret), size=300 << 20
    )
    await _put(
        yard, agent, {"dist/sy_plant-1.0.tar.gz": backend_sdist("sy-plant", "1.0", body)}, {}
    )
    change = await _install(
        yard, agent, environment_id, manager="pip", specs=["sy-plant"], index_url="none",
        find_links=["/workspace/dist"],
    )  # fmt: skip
    assert change.state == "succeeded", change
    revisions = await yard.plane.environments.revisions(environment_id, agent)
    shown = " ".join(r.model_dump_json() for r in revisions)
    assert "sy-plant" in shown, shown
    assert "sy-hostonly" not in shown, shown
    assert "s3cr3t" not in shown, shown
    assert "sy-huge" not in shown, shown
