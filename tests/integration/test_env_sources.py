"""Package sources under the operator's control (issue 20; V2, V8): the runner's allow-list,
https-only indexes, no credentials, no option injection through a spec, the offline mode, and
local wheels from the workspace copied into the environments' content-addressed store with
their sha256 in the revision.

Real components: a LocalRunner with bubblewrap and uv, wheels built here, the control plane
in-process for the refusals made before anything is recorded."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from env_fixtures import make_wheel, prefix_hash

from conftest import make_home
from shellyard.contract.environments import (
    EnvironmentChangeBody,
    EnvironmentRevisionsQuery,
)
from shellyard.contract.rawjson import parse
from shellyard.errors import InvalidInput
from shellyard.runner.local import LocalRunner
from shellyard.runner.protocol import (
    EnvChangeState,
    EnvironmentChange,
    EnvironmentChangeRequest,
    SandboxPolicy,
)

CHANGE_TIMEOUT_S = 180.0


@pytest.fixture
def home() -> Iterator[Path]:
    folder = make_home()
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


async def _runner(home: Path, **policy: object) -> LocalRunner:
    runner = LocalRunner(home / "runner", SandboxPolicy(**policy))  # type: ignore[arg-type]
    await runner.startup()
    return runner


@pytest.fixture
async def wheels(home: Path) -> Path:
    folder = home / "wheels"
    make_wheel(folder, "sy-alpha", "1.0")
    return folder


async def change(runner: LocalRunner, **fields: object) -> EnvironmentChange:
    request = EnvironmentChangeRequest.model_validate(fields)
    await runner.environment_change(request)
    return await runner.environment_change_wait(request.change_id, CHANGE_TIMEOUT_S)


async def created(runner: LocalRunner, env_id: str = "env1") -> Path:
    done = await change(
        runner, change_id=f"create-{env_id}", environment_id=env_id, action="create",
        language="python",
    )  # fmt: skip
    assert done.state == EnvChangeState.succeeded, done.error
    return Path((await runner.environment_info(env_id)).prefix)


@pytest.fixture
async def allow_listed(home: Path, wheels: Path) -> AsyncIterator[LocalRunner]:
    runner = await _runner(home, allowed_sources=["https://mirror.example.org/simple", str(wheels)])
    yield runner
    await runner.aclose()


REFUSED = [
    # (request fields beyond manager/specs, words the error must carry)
    ({"index_url": "https://pypi.org/simple"}, "not among this runner's allowed"),
    ({}, "the default index (PyPI) is not among"),
    ({"index_url": "http://mirror.example.org/simple"}, "plain http"),
    ({"index_url": "none", "find_links": ["/etc"]}, "not in a local folder this runner allows"),
    ({"manager": "conda", "channels": ["conda-forge"]}, "not among this runner's allowed"),
    ({"manager": "cran", "specs": ["jsonlite"]}, "default repos"),
]


@pytest.mark.parametrize(("fields", "words"), REFUSED)
async def test_sources_outside_the_allow_list_are_refused_before_anything_runs(
    allow_listed: LocalRunner, fields: dict[str, object], words: str
) -> None:
    """V8 / issue 20: an index, channel, folder or default source the operator did not allow
    (and plain http, even to an allowed host) is refused at once with an error that names it
    and the allowed sources; no change is recorded and the prefix is byte for byte the same."""
    prefix = await created(allow_listed)
    before = prefix_hash(prefix)
    body = {"manager": "pip", "specs": ["sy-alpha"], **fields}
    with pytest.raises(InvalidInput) as caught:
        await allow_listed.environment_change(
            EnvironmentChangeRequest(change_id="c1", environment_id="env1", action="install",
                                     **body)  # type: ignore[arg-type]
        )  # fmt: skip
    assert words in caught.value.message, caught.value.message
    assert prefix_hash(prefix) == before
    assert (await allow_listed.environment_change_status("c1")).state == EnvChangeState.lost


async def test_an_allowed_local_folder_installs(allow_listed: LocalRunner, wheels: Path) -> None:
    """Issue 20: the folder the operator listed is usable (the allow-list lets through what it
    names), and the wheel's sha256 is in the revision."""
    await created(allow_listed)
    done = await change(
        allow_listed, change_id="ok", environment_id="env1", action="install", manager="pip",
        specs=["sy-alpha"], index_url="none", find_links=[str(wheels)],
    )  # fmt: skip
    assert done.state == EnvChangeState.succeeded, done.error
    alpha = next(p for p in done.packages if p.name == "sy-alpha")
    wheel = next(wheels.glob("sy_alpha-1.0-*.whl"))
    assert alpha.sha256 == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert alpha.source == str(wheels)


async def test_offline_runner_refuses_cran_and_remote_indexes(home: Path, wheels: Path) -> None:
    """Issue 20: with SHELLYARD_PACKAGES_OFFLINE (local sources only) CRAN and Bioconductor
    are refused with an error saying to give a local repository, a remote index is refused,
    and a pip install without index_url runs --no-index from the local folder."""
    runner = await _runner(home, packages_offline=True)
    try:
        prefix = await created(runner)
        before = prefix_hash(prefix)
        for manager in ("cran", "bioconductor"):
            with pytest.raises(InvalidInput) as caught:
                await runner.environment_change(
                    EnvironmentChangeRequest(change_id=f"r-{manager}", environment_id="env1",
                                             action="install", manager=manager, specs=["x"])
                )  # fmt: skip
            assert "CRAN and Bioconductor cannot be used" in caught.value.message
            assert "local repository" in caught.value.message
        with pytest.raises(InvalidInput) as caught:
            await runner.environment_change(
                EnvironmentChangeRequest(change_id="remote", environment_id="env1",
                                         action="install", manager="pip", specs=["six"],
                                         index_url="https://pypi.org/simple")
            )  # fmt: skip
        assert "offline" in caught.value.message
        assert prefix_hash(prefix) == before
        done = await change(
            runner, change_id="local", environment_id="env1", action="install",
            manager="pip", specs=["sy-alpha"], find_links=[str(wheels)],
        )  # fmt: skip
        assert done.state == EnvChangeState.succeeded, done.error
        assert "sy-alpha" in {p.name for p in done.packages}
    finally:
        await runner.aclose()


async def test_workspace_wheel_is_copied_into_the_store_with_its_sha256(home: Path) -> None:
    """Issue 20: a wheel in the caller's workspace (named /workspace/… as in a command) is
    copied into the environments' content-addressed store before uv reads it; the revision
    records /workspace/… and its sha256, and the stored copy stays when the workspace's file
    is deleted. A path into the runner's own folder (another workspace) is refused."""
    runner = await _runner(home)
    try:
        await created(runner)
        await runner.ensure_workspace("ws1")
        dist = runner.workspace_path("ws1") / "dist"
        wheel = make_wheel(dist, "sy-local", "3.1")
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        done = await change(
            runner, change_id="ws", environment_id="env1", action="install", manager="pip",
            specs=[f"sy-local @ file:///workspace/dist/{wheel.name}"], workspace_id="ws1",
        )  # fmt: skip
        assert done.state == EnvChangeState.succeeded, done.error
        local = next(p for p in done.packages if p.name == "sy-local")
        assert (local.version, local.sha256) == ("3.1", digest)
        assert local.source == f"file:///workspace/dist/{wheel.name}"
        stored = home / "runner" / "environments" / "wheels" / digest
        wheel.unlink()
        assert hashlib.sha256(stored.read_bytes()).hexdigest() == digest
        # the same folder named by its runner path: the runner's own folder, refused
        with pytest.raises(InvalidInput) as caught:
            await runner.environment_change(
                EnvironmentChangeRequest(change_id="other", environment_id="env1",
                                         action="install", manager="pip", specs=["sy-local"],
                                         index_url="none", find_links=[str(dist)])
            )  # fmt: skip
        assert "the runner's own folder" in caught.value.message
        # nor a folder around it (bound into the tool's sandbox, it would show all of it)
        with pytest.raises(InvalidInput) as caught:
            await runner.environment_change(
                EnvironmentChangeRequest(change_id="around", environment_id="env1",
                                         action="install", manager="pip", specs=["sy-local"],
                                         index_url="none", find_links=[str(home)])
            )  # fmt: skip
        assert "in or around the runner's own folder" in caught.value.message
        # and /workspace/… without a workspace cannot be resolved
        with pytest.raises(InvalidInput) as caught:
            await runner.environment_change(
                EnvironmentChangeRequest(change_id="none", environment_id="env1",
                                         action="install", manager="pip", specs=["sy-local"],
                                         index_url="none", find_links=["/workspace/dist"])
            )  # fmt: skip
        assert "names the workspace" in caught.value.message
    finally:
        await runner.aclose()


BAD_BODIES = [
    ({"manager": "pip", "specs": ["requests --index-url https://evil.example/simple"]}, "option"),
    ({"manager": "pip", "specs": ["-r requirements.txt"]}, "option"),
    ({"manager": "pip", "specs": ["https://evil.example/x-1.0-py3-none-any.whl"]}, "URL where"),
    ({"manager": "conda", "specs": ["https://evil.example/noarch/x-1-0.tar.bz2"]}, "a URL"),
    ({"manager": "conda", "specs": ["evil::numpy"]}, "names a channel"),
    ({"manager": "conda", "specs": ["numpy[channel=https://evil.example]"]}, "names a channel"),
    (
        {"manager": "pip", "specs": ["x"], "index_url": "https://user:secret@mirror.example"},
        "credentials",
    ),
    ({"manager": "pip", "specs": ["x"], "index_url": "https://m.example/simple?t=1"}, "query"),
    ({"manager": "pip", "specs": ["x"], "index_url": "https://m.example/simple#top"}, "fragment"),
    ({"manager": "pip", "specs": ["x"], "index_url": "https://m.example/" + "a" * 2050}, "2048"),
    ({"manager": "pip", "specs": ["x"], "index_url": "ftp://m.example/simple"}, "https://"),
    ({"manager": "pip", "specs": ["x"], "find_links": ["/srv/../etc"]}, "without '..'"),
    ({"manager": "cran", "specs": ["x"], "repos": ["https://u:p@cran.example"]}, "credentials"),
    ({"manager": "pip", "specs": ["x @ https://u:p@files.example/x.whl"]}, "credentials"),
]


@pytest.mark.parametrize(("body", "words"), BAD_BODIES)
def test_the_request_model_refuses_injection_and_bad_urls(
    body: dict[str, object], words: str
) -> None:
    """Issue 20 (V8): an option inside a spec, a URL where a name belongs, credentials, a
    query or fragment, an over-long URL, another scheme or '..' are refused by the request
    model itself (every door: REST, MCP, SDK, CLI), so nothing is recorded."""
    with pytest.raises(InvalidInput) as caught:
        parse(EnvironmentChangeBody, body)  # what REST, MCP and the SDK's server call
    assert words in caught.value.message, caught.value.message
    assert "secret" not in caught.value.message


async def test_the_control_plane_reports_a_refused_source_and_records_no_revision(
    yard_factory: Any,
) -> None:
    """V8 through the control plane (local and direct runners): a runner whose operator
    allows only a mirror refuses an install that would fall back on PyPI; the caller gets
    invalid_input naming the allowed sources, the change is recorded failed, and the
    environment keeps its revision list."""
    from shellyard.contract.environments import EnvironmentCreateRequest

    yard = await yard_factory(SandboxPolicy(allowed_sources=["https://mirror.example.org/simple"]))
    plane = yard.plane
    env = await plane.environments.create(
        EnvironmentCreateRequest(name="src", runner_id=yard.runner_id, wait_ms=30_000)
    )
    assert env.state == "ready", env.error
    with pytest.raises(InvalidInput) as caught:
        await plane.environments.install(
            env.environment_id,
            EnvironmentChangeBody(manager="pip", specs=["six"], wait_ms=30_000),
        )
    message = caught.value.message
    assert "not among this runner's allowed package sources" in message, message
    assert "https://mirror.example.org/simple" in message and "still revision 1" in message
    failed = await plane.environments.change_status(caught.value.details["change_id"])
    assert (failed.state, failed.revision) == ("failed", None)
    assert [
        r.revision
        for r in await plane.environments.revisions(env.environment_id, EnvironmentRevisionsQuery())
    ] == [1]
