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
from env_fixtures import make_wheel
from test_attack_pass_41 import _agent
from test_env_tool_rights import _create, _install

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
