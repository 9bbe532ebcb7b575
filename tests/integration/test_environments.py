"""Managed environments through the control plane, on a real runner (LocalRunner and a runner
daemon): the waiting rule (V5), the revision an execution used (V6), conda + pip + cran in one
prefix with revisions 1..4 (V2), clear errors that change nothing (V8), the read-only prefix
(V4, V7), environments bound to their runner and their session, and a kill -9 of
``shellyard serve`` mid-install."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from conda_channel import build_test_channel
from cran_repo import build_test_repo, r_available
from env_fixtures import host_prefix, make_slow_sdist, make_wheel, prefix_hash

from conftest import Yard, open_yard
from shellyard.contract.environments import (
    EnvironmentChangeBody,
    EnvironmentCreateRequest,
    EnvironmentListQuery,
    EnvironmentRevisionsQuery,
)
from shellyard.contract.executions import (
    ExecutionCancelQuery,
    ExecutionLogsQuery,
    ExecutionState,
    ExecutionWait,
    RunShellRequest,
)
from shellyard.contract.rawjson import parse
from shellyard.errors import (
    ChangeFailed,
    InvalidInput,
    NotFound,
    ShellyardError,
    SourceUnreachable,
)

pytestmark = pytest.mark.timeout(300)


async def _create(yard: Yard, name: str = "main", language: str = "python") -> str:
    view = await yard.plane.environments.create(
        EnvironmentCreateRequest(
            name=name, language=language, runner_id=yard.runner_id, wait_ms=30_000
        )
    )
    assert view.state == "ready", view
    assert view.revision == 1
    return view.environment_id


async def _install(yard: Yard, environment_id: str, **body: Any) -> Any:
    body.setdefault("wait_ms", 30_000)
    change = await yard.plane.environments.install(environment_id, EnvironmentChangeBody(**body))
    if not change.done:
        change = await yard.plane.environments.wait(change.change_id, 120)
    assert change.state == "succeeded", change
    return change


async def _prefix(yard: Yard, environment_id: str) -> Path:
    """The prefix on the runner's host; the doors show where commands see it (V4: /env)."""
    view = await yard.plane.environments.show(environment_id)
    assert view.prefix == "/env", view.prefix
    return host_prefix(yard.runner_root, environment_id)


async def test_install_waits_for_running_execution_and_queues_new_ones(
    yard: Yard, home: Path
) -> None:
    """V5: an install waits while an execution uses the environment, and its status names that
    execution; an execution asking for the environment meanwhile is queued behind the change
    (its status names the change) and, when it runs, records the new revision (V6)."""
    plane = yard.plane
    channel = await build_test_channel(home / "channel")
    environment_id = await _create(yard)
    holder = await yard.run("sleep 600", environment_id=environment_id, background=True)
    assert holder.environment_revision == 1

    change = await plane.environments.install(
        environment_id,
        EnvironmentChangeBody(
            manager="conda",
            specs=["shellyard-hello==1.0"],
            channels=[channel.as_uri()],
            wait_ms=300,
        ),
    )
    assert change.state == "waiting"
    assert change.waiting_for == [holder.execution_id]

    # Another agent of the same session (its own workspace, so only the change holds it up).
    session, _main = await plane.store.default_owner()
    child = await plane.store.create_agent(str(session.id), parent_id=str(_main.id))
    queued = await plane.executions.run_shell(
        RunShellRequest(
            command="shellyard-hello",
            environment_id=environment_id,
            runner_id=yard.runner_id,
            background=True,
        ),
        str(child.id),
    )
    assert queued.state == ExecutionState.queued
    assert queued.waiting_for == change.change_id
    assert queued.environment_revision is None
    still = await plane.environments.change_status(change.change_id)
    assert still.state == "waiting" and still.waiting_for == [holder.execution_id]
    # One queued behind the change can be cancelled at once: it never started.
    other = await plane.store.create_agent(str(session.id), parent_id=str(_main.id))
    dropped = await plane.executions.run_shell(
        RunShellRequest(
            command="true",
            environment_id=environment_id,
            runner_id=yard.runner_id,
            background=True,
        ),
        str(other.id),
    )
    assert dropped.waiting_for == change.change_id
    gone = await plane.executions.cancel(
        dropped.execution_id, ExecutionCancelQuery(), str(other.id)
    )
    assert gone.state == ExecutionState.cancelled and gone.started_at is None
    workspace = await plane.store.get_workspace(gone.workspace_id)
    assert workspace is not None and workspace.writer_id is None

    await plane.executions.cancel(holder.execution_id, ExecutionCancelQuery(wait_s=20))
    done = await plane.environments.wait(change.change_id, 60)
    assert done.state == "succeeded" and done.revision == 2
    ran = await plane.executions.wait(
        queued.execution_id, ExecutionWait(timeout_s=30), str(child.id)
    )
    assert ran.state == ExecutionState.completed and ran.exit_code == 0
    assert ran.environment_revision == 2 and ran.waiting_for is None  # V6: the new revision
    logs = await plane.executions.logs(queued.execution_id, ExecutionLogsQuery(), str(child.id))
    assert logs.data == "hello 1.0\n"
    held = await plane.executions.status(holder.execution_id)
    assert held.environment_revision == 1


@pytest.mark.skipif(not r_available(), reason="R (Rscript) is not installed on this machine")
async def test_conda_then_pip_then_cran_in_one_prefix(yard: Yard, home: Path) -> None:
    """V2: conda packages, then pip packages, then an R package go into one environment, and
    one command uses all three; revisions 1..4 each list the right packages and requests."""
    channel = await build_test_channel(home / "channel")
    wheels = home / "wheels"
    make_wheel(
        wheels,
        "shellyard-tinywheel",
        "1.2.0",
        {"shellyard_tinywheel.py": "VALUE = 'from the wheel'\n"},
    )
    repo = build_test_repo(home / "cran")
    environment_id = await _create(yard)

    await _install(
        yard,
        environment_id,
        manager="conda",
        specs=["shellyard-greeter"],
        channels=[channel.as_uri()],
    )
    await _install(
        yard,
        environment_id,
        manager="pip",
        specs=["shellyard_tinywheel==1.2.0"],
        find_links=[str(wheels)],
        index_url="none",
    )
    await _install(
        yard, environment_id, manager="cran", specs=["shellyardhello"], repos=[repo.as_uri()]
    )

    result = await yard.run(
        "shellyard-greeter you && "
        "python -c 'import shellyard_tinywheel as t; print(t.VALUE)' && "
        "Rscript -e 'cat(shellyardhello::shellyard_hello(), \"\\n\")'",
        environment_id=environment_id,
        wait_ms=30_000,
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "hello 2.0\ngreeted you\nfrom the wheel\nhello from R \n"
    assert result.environment_revision == 4

    revisions = await yard.plane.environments.revisions(environment_id, EnvironmentRevisionsQuery())
    assert [r.revision for r in revisions] == [1, 2, 3, 4]

    def names(revision: Any, manager: str) -> dict[str, str]:
        return {p.name: p.version for p in revision.packages if p.manager == manager}

    first, conda, pip, cran = revisions
    assert first.request == {"action": "create", "language": "python"}
    assert "python" in names(first, "base")
    assert names(first, "conda") == {} and names(first, "cran") == {}

    assert conda.request == {
        "action": "install",
        "manager": "conda",
        "specs": ["shellyard-greeter"],
        "channels": [channel.as_uri()],
    }
    assert names(conda, "conda") == {
        "shellyard-greeter": "1.0",
        "shellyard-hello": "2.0",
        "shellyard-words": "1.0",
    }
    assert "shellyard-tinywheel" not in {n.replace("_", "-") for n in names(conda, "pip")}

    assert pip.request["manager"] == "pip" and pip.request["specs"] == [
        "shellyard_tinywheel==1.2.0"
    ]
    assert pip.request["find_links"] == [str(wheels)]
    pip_names = {n.replace("_", "-").lower(): v for n, v in names(pip, "pip").items()}
    assert pip_names.get("shellyard-tinywheel") == "1.2.0"
    assert names(pip, "conda") == names(conda, "conda")  # pip left conda's packages alone

    assert cran.request == {
        "action": "install",
        "manager": "cran",
        "specs": ["shellyardhello"],
        "repos": [repo.as_uri()],
    }
    assert names(cran, "cran") == {"shellyardhello": "1.0"}
    assert names(cran, "conda") == names(conda, "conda")
    assert {n.replace("_", "-").lower() for n in names(cran, "pip")} >= {"shellyard-tinywheel"}

    view = await yard.plane.environments.show(environment_id)
    assert view.revision == 4 and view.pending_changes == []
    assert [(r.revision, r.manager) for r in view.revisions or []] == [
        (1, None),
        (2, "conda"),
        (3, "pip"),
        (4, "cran"),
    ]


async def test_bad_changes_give_clear_errors_and_change_nothing(yard: Yard, home: Path) -> None:
    """V8: unknown package, bad version spec, unreachable channel, a broken R package: a clear
    error naming the change, no new revision, the prefix byte-for-byte as it was."""
    plane = yard.plane
    channel = await build_test_channel(home / "channel")
    environment_id = await _create(yard)
    await _install(
        yard,
        environment_id,
        manager="conda",
        specs=["shellyard-hello==1.0"],
        channels=[channel.as_uri()],
    )
    prefix = await _prefix(yard, environment_id)
    before = prefix_hash(prefix)
    cases: list[tuple[dict[str, Any], type[ShellyardError]]] = [
        (
            {"manager": "conda", "specs": ["shellyard-nope"], "channels": [channel.as_uri()]},
            NotFound,
        ),
        (
            {
                "manager": "conda",
                "specs": ["shellyard-hello >>= 1"],
                "channels": [channel.as_uri()],
            },
            InvalidInput,
        ),
        (
            {
                "manager": "conda",
                "specs": ["shellyard-hello"],
                "channels": ["https://127.0.0.1:9/nothing"],
            },
            SourceUnreachable,
        ),
        (
            {
                "manager": "pip",
                "specs": ["shellyard-no-such-wheel"],
                # a folder of its own: one around the runner's folder is refused (issue 20)
                "find_links": [str(home / "channel")],
                "index_url": "https://127.0.0.1:9/simple",
            },
            SourceUnreachable,
        ),
    ]
    if r_available():
        repo = build_test_repo(home / "cran")
        cases.append(
            (
                {"manager": "cran", "specs": ["shellyardbroken"], "repos": [repo.as_uri()]},
                ChangeFailed,
            )
        )
    for body, error in cases:
        with pytest.raises(error) as caught:
            await plane.environments.install(
                environment_id, EnvironmentChangeBody(**body, wait_ms=30_000)
            )
        message = caught.value.message
        change_id = caught.value.details["change_id"]
        assert change_id in message and "unchanged (still revision 2)" in message, message
        failed = await plane.environments.change_status(change_id)
        assert failed.state == "failed" and failed.revision is None and failed.error
        assert [
            r.revision
            for r in await plane.environments.revisions(environment_id, EnvironmentRevisionsQuery())
        ] == [1, 2]
        assert prefix_hash(prefix) == before, body
    view = await plane.environments.show(environment_id)
    assert view.revision == 2 and view.pending_changes == []


@pytest.mark.runner_kinds("local", "direct", "ssh")  # R1: a representative subset
async def test_refused_before_anything_is_recorded(yard: Yard) -> None:
    """Unknown manager, empty specs, options of another manager, unknown environment: clear
    errors, no change recorded."""
    plane = yard.plane
    environment_id = await _create(yard)
    for body, words in [
        ({"manager": "apt", "specs": ["x"]}, "unknown manager 'apt'"),
        ({"manager": "pip", "specs": []}, "at least one package spec"),
        ({"manager": "pip", "specs": ["  "]}, "none empty"),
        ({"manager": "pip", "specs": ["x"], "channels": ["c"]}, "channels does not apply"),
        ({"manager": "pip", "specs": ["x"], "wait_ms": 30_001}, "wait_ms must be between"),
    ]:
        with pytest.raises(InvalidInput, match=words):
            await plane.environments.install(environment_id, parse(EnvironmentChangeBody, body))
    with pytest.raises(NotFound, match="no environment 'env_nope'"):
        await plane.environments.install(
            "env_nope", EnvironmentChangeBody(manager="pip", specs=["x"])
        )
    with pytest.raises(ShellyardError, match="already exists"):
        await _create(yard)
    changes = await plane.store.environment_changes(environment_id)
    assert [c.action for c in changes] == ["create"]


@pytest.mark.runner_kinds("local", "direct", "ssh")  # R1: a representative subset
async def test_prefix_is_read_only_inside_commands(yard: Yard) -> None:
    """V4, V7: the prefix is mounted read-only with its variables set; writing into it, or
    `pip install` in a command, fails as it normally would; the prefix is unchanged."""
    environment_id = await _create(yard)
    prefix = await _prefix(yard, environment_id)
    before = prefix_hash(prefix)
    seen = await yard.run('echo "$VIRTUAL_ENV"; command -v python', environment_id=environment_id)
    assert seen.exit_code == 0
    # V4: commands see the prefix at /env (docs/security.md "Host paths")
    assert seen.stdout == "/env\n/env/bin/python\n"
    touch = await yard.run("touch /env/x", environment_id=environment_id)
    assert touch.exit_code != 0 and "Read-only file system" in touch.stderr
    pip = await yard.run("pip install --no-index shellyard-anything", environment_id=environment_id)
    assert pip.exit_code != 0
    assert prefix_hash(prefix) == before
    assert (await yard.plane.environments.show(environment_id)).revision == 1


async def test_environment_is_bound_to_its_runner_and_session(home: Path) -> None:
    """An environment lives on one runner: another runner cannot use it (clear error); another
    session can neither see nor use it."""
    plane, remote_id, daemon = await open_yard(home, "direct")
    assert daemon is not None
    try:
        yard = Yard(plane, "local", home)
        environment_id = await _create(yard)
        with pytest.raises(InvalidInput, match="lives on runner 'local'; pass runner_id 'local'"):
            await plane.executions.run_shell(
                RunShellRequest(command="true", environment_id=environment_id, runner_id=remote_id)
            )
        # Without runner_id the execution goes to the environment's runner.
        used = await plane.executions.run_shell(
            RunShellRequest(command="echo $VIRTUAL_ENV", environment_id=environment_id)
        )
        assert used.runner_id == "local" and used.environment_revision == 1

        _other_session, stranger = await plane.store.create_session()
        stranger_id = str(stranger.id)
        assert await plane.environments.list_environments(EnvironmentListQuery(), stranger_id) == []
        assert [
            e.environment_id
            for e in await plane.environments.list_environments(EnvironmentListQuery())
        ] == [environment_id]
        with pytest.raises(NotFound, match="no environment"):
            await plane.environments.show(environment_id, stranger_id)
        with pytest.raises(NotFound, match="no environment"):
            await plane.executions.run_shell(
                RunShellRequest(command="true", environment_id=environment_id), stranger_id
            )
        with pytest.raises(NotFound, match="no environment"):
            await plane.environments.install(
                environment_id, EnvironmentChangeBody(manager="pip", specs=["x"]), stranger_id
            )
        view = await plane.environments.show(environment_id)
        change_id = (view.revisions or [])[0].change_id
        with pytest.raises(NotFound, match="no environment change"):
            await plane.environments.change_status(change_id, stranger_id)
    finally:
        await plane.aclose()
        await daemon.stop()


# ---------------------------------------------------------------------- kill -9 mid-install


async def test_kill9_mid_install_leaves_the_old_revision(served_home: Path) -> None:
    """A control plane (with its local runner) killed with SIGKILL while an install is half
    done — a package build that already changed files in the prefix and hangs: after the
    restart the change is failed (interrupted), the environment is at the old revision with the
    prefix byte-for-byte as before, nothing stays waiting, and the environment takes changes
    and executions again."""
    from shellyard.home import ensure_server, is_served
    from shellyard.sdk.client import Client

    home = served_home
    channel = await build_test_channel(home / "channel")
    client = Client.for_home(home)
    created = client.environment_create("main", wait_ms=30_000)
    assert created.state == "ready"
    environment_id = created.environment_id
    assert client.environment_show(environment_id).prefix == "/env"  # V4
    prefix = host_prefix(home / "runners" / "local", environment_id)
    before = prefix_hash(prefix)
    sdists = home / "sdists"
    make_slow_sdist(sdists, "shellyard-slow", "1.0", prefix, "hang")
    started = client.environment_install(
        environment_id,
        "pip",
        ["shellyard-slow==1.0"],
        find_links=[str(sdists)],
        index_url="none",
        wait_ms=0,
    )
    assert started.state in ("waiting", "running")
    # A run_shell meanwhile queues behind the change.
    queued = client.run("echo $VIRTUAL_ENV", environment_id=environment_id, background=True)
    deadline = time.monotonic() + 60
    while not (prefix / ".build-started").exists():
        assert time.monotonic() < deadline, "the package build never started"
        await asyncio.sleep(0.05)
    assert prefix_hash(prefix) != before  # half-installed
    assert client.status(queued.execution_id).state == ExecutionState.queued
    info = ensure_server(home)
    os.kill(info.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while is_served(home) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    client.close()

    client = Client.for_home(home)  # a new control plane on the same home
    change = client.environment_change_status(started.change_id, 30)
    assert change.state == "failed" and change.error_kind == "interrupted", change
    assert change.revision is None
    view = client.environment_show(environment_id)
    assert view.pending_changes == [] and view.revision == 1
    assert [r.revision for r in client.environment_revisions(environment_id)] == [1]
    assert prefix_hash(prefix) == before
    ran = client.wait(queued.execution_id, 30)
    assert ran.state == ExecutionState.completed and ran.environment_revision == 1
    again = client.environment_install(
        environment_id, "conda", ["shellyard-hello"], channels=[channel.as_uri()], wait_ms=30_000
    )
    assert again.state == "succeeded" and again.revision == 2
    client.close()
