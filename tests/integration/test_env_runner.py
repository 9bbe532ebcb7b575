"""The runner side of managed environments (V1–V8): prefixes, pip through uv, the read-only
mount, refusals while in use, idempotent change ids, rollback of failed and interrupted changes.

Real components only: a LocalRunner with bubblewrap, uv, wheels and sdists built here, a runner
daemon in a subprocess that is killed with SIGKILL mid-install.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import stat
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from env_fixtures import make_slow_sdist, make_wheel, prefix_hash
from runner_daemon_fixture import running_daemon, start_daemon

from conftest import make_home
from shellyard.errors import Conflict, InvalidInput, NotFound, ShellyardError
from shellyard.runner.edits.editor import Editor
from shellyard.runner.local import LocalRunner
from shellyard.runner.protocol import (
    EnvChangeState,
    EnvironmentChange,
    EnvironmentChangeRequest,
    Runner,
    RunnerExecState,
    SandboxPolicy,
    StartRequest,
)

CHANGE_TIMEOUT_S = 180.0


@pytest.fixture
def root() -> Iterator[Path]:
    home = make_home()
    yield home / "runner"
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
async def runner(root: Path) -> AsyncIterator[LocalRunner]:
    r = LocalRunner(root)
    await r.startup()
    yield r
    await r.aclose()


@pytest.fixture(autouse=True)
def _fast_failing_index(monkeypatch: pytest.MonkeyPatch) -> None:
    # uv retries a refused connection 3 times with back-off (~11 s); the runner passes
    # UV_HTTP_RETRIES through to its tools, so the unreachable case stays quick.
    monkeypatch.setenv("UV_HTTP_RETRIES", "0")


async def change(runner: Runner, **fields: object) -> EnvironmentChange:
    """Start a change and wait for its end."""
    request = EnvironmentChangeRequest.model_validate(fields)
    started = await runner.environment_change(request)
    assert started.change_id == request.change_id
    return await runner.environment_change_wait(request.change_id, CHANGE_TIMEOUT_S)


async def create_python(runner: Runner, env_id: str = "env1") -> EnvironmentChange:
    done = await change(
        runner, change_id=f"create-{env_id}", environment_id=env_id, action="create",
        language="python",
    )  # fmt: skip
    assert done.state == EnvChangeState.succeeded, done.error
    return done


def wheels(folder: Path) -> Path:
    make_wheel(folder, "sy-alpha", "1.0", requires=["sy-beta>=2"])
    make_wheel(folder, "sy-beta", "2.0")
    make_wheel(folder, "sy-beta", "1.0")
    return folder


def local_only(folder: Path) -> dict[str, object]:
    return {"index_url": "none", "find_links": [str(folder)]}


def names(done: EnvironmentChange, manager: str) -> dict[str, str]:
    return {p.name: p.version for p in done.packages if p.manager == manager}


async def run(
    runner: LocalRunner, execution_id: str, command: str, env_id: str
) -> tuple[int | None, str, str]:
    await runner.ensure_workspace("ws")
    request = StartRequest(
        execution_id=execution_id, workspace_id="ws", command=command, environment_id=env_id
    )
    await runner.start(request)
    result = await runner.wait(execution_id, 120)
    assert result.state == RunnerExecState.finished, result
    out = (await runner.read_log(execution_id, "stdout", 0, 1 << 20)).data.decode()
    err = (await runner.read_log(execution_id, "stderr", 0, 1 << 20)).data.decode()
    return result.exit_code, out, err


async def test_create_python_records_the_base_and_pip_packages(runner: LocalRunner) -> None:
    """V1: a python environment is a venv of a Python the sandbox can run, with pip and uv;
    revision 1 lists the base records (interpreter and where it came from, pip, uv) and what
    the pip manager sees."""
    done = await create_python(runner)
    base = {p.name: p for p in done.packages if p.manager == "base"}
    assert base["python"].version.startswith("3.")
    assert base["python"].source is not None
    assert not base["python"].source.startswith("/root")
    assert {"pip", "uv"} <= set(base)
    assert "pip" in names(done, "pip")
    info = await runner.environment_info("env1")
    prefix = Path(info.prefix)
    assert info.language == "python" and not info.changing
    # V4: commands see the prefix at /env, not at its host path (docs/security.md)
    assert info.mounted_at == "/env" and info.env["VIRTUAL_ENV"] == "/env"
    assert info.env["PATH"] == "/env/bin"
    assert os.access(prefix / "bin" / "uv", os.X_OK)
    assert stat.S_IMODE(prefix.stat().st_mode) == 0o755
    # A second create of the same environment id is refused.
    with pytest.raises(InvalidInput, match="already exists"):
        await runner.environment_change(
            EnvironmentChangeRequest(
                change_id="again", environment_id="env1", action="create", language="python"
            )
        )


async def test_offline_runner_creates_and_installs_from_local_wheels(root: Path) -> None:
    """R2 with V1/V2: on a runner whose policy takes the tools' network away too
    (tool_network off; by default tools keep a filtered egress), create falls back to the
    interpreter's bundled pip (ensurepip) and local wheels still install."""
    runner = LocalRunner(root, SandboxPolicy(network="off", tool_network="off"))
    await runner.startup()
    try:
        done = await create_python(runner)
        base = {p.name: p for p in done.packages if p.manager == "base"}
        assert base["pip"].source is not None and base["pip"].source.startswith("ensurepip")
        folder = wheels(root.parent / "wheels")
        ok = await change(
            runner, change_id="i1", environment_id="env1", action="install", manager="pip",
            specs=["sy-alpha"], **local_only(folder),
        )  # fmt: skip
        assert ok.state == EnvChangeState.succeeded, ok.error
        assert names(ok, "pip")["sy-alpha"] == "1.0"
        bad = await change(
            runner, change_id="i2", environment_id="env1", action="install", manager="pip",
            specs=["six"],
        )  # fmt: skip
        assert (bad.state, bad.error_kind) == (EnvChangeState.failed, "unreachable"), bad.error
    finally:
        await runner.aclose()


async def test_pip_install_and_uninstall_change_the_package_state(
    runner: LocalRunner, root: Path
) -> None:
    """V2: pip installs (with dependencies) from a find_links folder with no index; the state
    names the folder and each wheel's sha256; uninstall removes only what it names."""
    await create_python(runner)
    folder = wheels(root.parent / "wheels")
    done = await change(
        runner, change_id="i1", environment_id="env1", action="install", manager="pip",
        specs=["sy-alpha"], **local_only(folder),
    )  # fmt: skip
    assert done.state == EnvChangeState.succeeded, done.error
    pip = {p.name: p for p in done.packages if p.manager == "pip"}
    assert pip["sy-alpha"].version == "1.0" and pip["sy-beta"].version == "2.0"
    alpha_wheel = folder / "sy_alpha-1.0-py3-none-any.whl"
    assert pip["sy-alpha"].sha256 == hashlib.sha256(alpha_wheel.read_bytes()).hexdigest()
    assert pip["sy-alpha"].source == str(folder)
    assert "pip" in pip  # the seeded pip is still listed, and the base records too
    assert any(p.manager == "base" and p.name == "python" for p in done.packages)

    done = await change(
        runner, change_id="u1", environment_id="env1", action="uninstall", manager="pip",
        specs=["sy-alpha"],
    )  # fmt: skip
    assert done.state == EnvChangeState.succeeded, done.error
    assert "sy-alpha" not in names(done, "pip")
    assert names(done, "pip")["sy-beta"] == "2.0"


async def test_changes_of_different_environments_run_in_parallel(runner: LocalRunner) -> None:
    """One change per environment at a time, but two environments change side by side: both
    are running at once and both succeed."""
    requests = [
        EnvironmentChangeRequest(
            change_id=f"create-{e}", environment_id=e, action="create", language="python"
        )
        for e in ("pa", "pb")
    ]
    started = [await runner.environment_change(r) for r in requests]
    assert [s.state for s in started] == [EnvChangeState.running] * 2
    done = await asyncio.gather(
        *(runner.environment_change_wait(r.change_id, CHANGE_TIMEOUT_S) for r in requests)
    )
    assert [d.state for d in done] == [EnvChangeState.succeeded] * 2, [d.error for d in done]
    prefixes = {(await runner.environment_info(e)).prefix for e in ("pa", "pb")}
    assert len(prefixes) == 2


async def test_command_uses_the_environment_read_only(runner: LocalRunner, root: Path) -> None:
    """V4, V7: a command with environment_id imports the installed package; pip install, uv
    pip install and touch inside the prefix all fail, and the prefix is unchanged."""
    await create_python(runner)
    folder = wheels(root.parent / "wheels")
    done = await change(
        runner, change_id="i1", environment_id="env1", action="install", manager="pip",
        specs=["sy-alpha"], **local_only(folder),
    )  # fmt: skip
    assert done.state == EnvChangeState.succeeded, done.error
    prefix = Path((await runner.environment_info("env1")).prefix)
    before = prefix_hash(prefix)
    await runner.ensure_workspace("ws")
    shutil.copy(folder / "sy_beta-1.0-py3-none-any.whl", runner.workspace_path("ws"))
    command = (
        "python -c 'import sy_alpha, sy_beta, sys; print(sy_alpha.VERSION, sy_beta.VERSION, "
        "sys.prefix)'; "
        "pip install --no-index ./sy_beta-1.0-py3-none-any.whl >pip.out 2>&1; echo pip=$?; "
        "uv pip install --no-index ./sy_beta-1.0-py3-none-any.whl >uv.out 2>&1; echo uv=$?; "
        'touch "$VIRTUAL_ENV/x"; echo touch=$?; '
        "tail -c 300 pip.out"
    )
    code, out, err = await run(runner, "x1", command, "env1")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "1.0 2.0 /env"  # V4: sys.prefix is the neutral path
    assert "pip=0" not in out and "uv=0" not in out and "touch=0" not in out
    assert "Read-only file system" in out + err
    assert prefix_hash(prefix) == before
    assert not (prefix / "x").exists()


FAILURES = [
    # (specs, sources, action, expected error kind)
    (["sy-alpha==>1"], "local", "install", "invalid_spec"),
    # an option in a spec is refused before the change starts: test_env_sources.py
    (["sy-nonexistent"], "local", "install", "not_found"),
    (["sy-beta==9.9"], "local", "install", "not_found"),
    (["six"], "unreachable", "install", "unreachable"),
    (["sy-slow"], "local", "install", "failed"),
    (["sy-never-installed"], "local", "uninstall", "not_found"),
    (["pip==1.0"], "local", "uninstall", "invalid_spec"),
]


async def test_failed_changes_leave_the_prefix_byte_for_byte(
    runner: LocalRunner, root: Path
) -> None:
    """V8: a bad spec, an unknown package or version, an unreachable index, a build that
    damages the prefix and then fails, an uninstall of what is not there: each fails with its
    error kind, lists no packages, and the prefix hash (paths, contents, modes, link targets)
    is what it was."""
    await create_python(runner)
    prefix = Path((await runner.environment_info("env1")).prefix)
    folder = wheels(root.parent / "wheels")
    make_slow_sdist(folder, "sy-slow", "1.0", prefix, "fail")
    before = prefix_hash(prefix)
    for i, (specs, sources, action, kind) in enumerate(FAILURES):
        options = (
            local_only(folder) if sources == "local" else {"index_url": "https://127.0.0.1:9/"}
        )
        done = await change(
            runner, change_id=f"bad{i}", environment_id="env1", action=action,
            manager="pip", specs=specs, **options,
        )  # fmt: skip
        assert done.state == EnvChangeState.failed, specs
        assert done.error_kind == kind, (specs, done.error)
        assert done.error and len(done.error) > 20
        assert done.packages == []
        assert prefix_hash(prefix) == before, specs
        assert not (await runner.environment_info("env1")).changing


async def test_change_refused_while_an_execution_uses_the_environment(
    runner: LocalRunner, root: Path
) -> None:
    """V5 (runner side): a change is refused (Conflict) while an execution using the
    environment runs, and accepted once it has ended."""
    await create_python(runner)
    folder = wheels(root.parent / "wheels")
    await runner.ensure_workspace("ws")
    stop = runner.workspace_path("ws") / "stop"
    await runner.start(
        StartRequest(execution_id="long", workspace_id="ws", environment_id="env1",
                     command="until [ -e stop ]; do sleep 0.05; done")
    )  # fmt: skip
    request = EnvironmentChangeRequest(
        change_id="i1", environment_id="env1", action="install", manager="pip",
        specs=["sy-beta"], index_url="none", find_links=[str(folder)],
    )  # fmt: skip
    with pytest.raises(Conflict, match="long"):
        await runner.environment_change(request)
    assert (await runner.environment_change_status("i1")).state == EnvChangeState.lost
    stop.touch()
    assert (await runner.wait("long", 30)).exit_code == 0
    await runner.environment_change(request)
    done = await runner.environment_change_wait("i1", CHANGE_TIMEOUT_S)
    assert done.state == EnvChangeState.succeeded, done.error


async def test_execution_refused_while_a_change_runs_and_close_rolls_back(
    root: Path,
) -> None:
    """V5 (runner side), V8: while a change runs, an execution on the environment and a second
    change are refused (Conflict); closing the runner mid-change kills the tool, rolls the
    prefix back and records the change as interrupted."""
    runner = LocalRunner(root)
    await runner.startup()
    try:
        await create_python(runner)
        prefix = Path((await runner.environment_info("env1")).prefix)
        folder = root.parent / "wheels"
        await runner.ensure_workspace("ws")
        probe = [runner.workspace_path("ws"), root / "snapshots", root / "token", prefix]
        probe.append(Path("/env"))  # V4: the prefix is seen there, not at its host path
        make_slow_sdist(folder, "sy-slow", "1.0", prefix, "hang", probe)
        before = prefix_hash(prefix)
        await runner.environment_change(
            EnvironmentChangeRequest(
                change_id="slow", environment_id="env1", action="install", manager="pip",
                specs=["sy-slow"], index_url="none", find_links=[str(folder)],
            )
        )  # fmt: skip
        await _wait_for(prefix / ".build-started")
        # the tool's sandbox: no capabilities, the runner's home hidden, the prefix at /env
        view = json.loads((prefix / ".build-started").read_text())
        assert int(view["cap_eff"], 16) == 0
        assert view["seen"] == {str(p): p == Path("/env") for p in probe}
        assert (await runner.environment_info("env1")).changing
        with pytest.raises(Conflict, match="slow"):
            await runner.start(
                StartRequest(execution_id="x", workspace_id="ws", command="true",
                             environment_id="env1")
            )  # fmt: skip
        with pytest.raises(Conflict, match="slow"):
            await runner.environment_change(
                EnvironmentChangeRequest(
                    change_id="other", environment_id="env1", action="uninstall",
                    manager="pip", specs=["pip"],
                )
            )  # fmt: skip
    finally:
        await runner.aclose()
    again = LocalRunner(root)
    await again.startup()
    try:
        done = await again.environment_change_status("slow")
        assert (done.state, done.error_kind) == (EnvChangeState.failed, "interrupted")
        assert prefix_hash(prefix) == before
    finally:
        await again.aclose()


async def test_a_rollback_cut_short_is_finished_at_the_next_start(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """V8: the rollback is re-runnable. A rollback that dies part-way (a fault injected into
    the restore after a few entries) leaves the journal; the environment refuses changes and
    executions meanwhile, and the next start of the runner finishes the rollback."""
    runner = LocalRunner(root)
    await runner.startup()
    prefix = Path("/nonexistent")
    try:
        await create_python(runner)
        prefix = Path((await runner.environment_info("env1")).prefix)
        folder = root.parent / "wheels"
        make_slow_sdist(folder, "sy-slow", "1.0", prefix, "fail")
        before = prefix_hash(prefix)
        real = Editor._materialize
        calls = {"n": 0}

        def flaky(self: Editor, *args: object, **kwargs: object) -> None:
            calls["n"] += 1
            if calls["n"] == 3:
                raise OSError("injected: the disk went away mid-rollback")
            real(self, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(Editor, "_materialize", flaky)
        done = await change(
            runner, change_id="half", environment_id="env1", action="install",
            manager="pip", specs=["sy-slow"], **local_only(folder),
        )  # fmt: skip
        assert (done.state, done.error_kind) == (EnvChangeState.failed, "failed")
        assert done.error is not None and "rolling the prefix back failed" in done.error
        assert calls["n"] == 3
        assert prefix_hash(prefix) != before  # part-way: neither old nor new
        with pytest.raises(ShellyardError, match="could not be rolled back"):
            await runner.environment_change(
                EnvironmentChangeRequest(
                    change_id="next", environment_id="env1", action="uninstall",
                    manager="pip", specs=["pip"],
                )
            )  # fmt: skip
    finally:
        await runner.aclose()
    monkeypatch.undo()
    again = LocalRunner(root)
    await again.startup()
    try:
        assert prefix_hash(prefix) == before
        status = await again.environment_change_status("half")
        assert (status.state, status.error_kind) == (EnvChangeState.failed, "failed")
        ok = await change(
            again, change_id="next", environment_id="env1", action="install", manager="pip",
            specs=["sy-beta"], **local_only(wheels(root.parent / "wheels")),
        )  # fmt: skip
        assert ok.state == EnvChangeState.succeeded, ok.error
    finally:
        await again.aclose()


async def test_change_ids_are_idempotent_and_unknown_ids_lost(
    runner: LocalRunner, root: Path
) -> None:
    """A change id names one change: asking again returns it (running or ended) without a
    second run; an id reused for another environment is refused; an unknown id is lost."""
    first = await create_python(runner)
    folder = wheels(root.parent / "wheels")
    request = EnvironmentChangeRequest(
        change_id="i1", environment_id="env1", action="install", manager="pip",
        specs=["sy-beta==1.0"], index_url="none", find_links=[str(folder)],
    )  # fmt: skip
    await runner.environment_change(request)
    again = await runner.environment_change(request)  # while running, or just ended
    assert again.change_id == "i1" and again.started_at is not None
    done = await runner.environment_change_wait("i1", CHANGE_TIMEOUT_S)
    assert done.state == EnvChangeState.succeeded
    replay = await runner.environment_change(request)
    assert replay == done
    repeated = await runner.environment_change(
        EnvironmentChangeRequest(
            change_id="create-env1", environment_id="env1", action="create", language="python"
        )
    )
    assert repeated == first
    with pytest.raises(InvalidInput, match="already used"):
        await runner.environment_change(request.model_copy(update={"environment_id": "env2"}))
    lost = await runner.environment_change_status("never-seen")
    assert lost.state == EnvChangeState.lost
    with pytest.raises(NotFound):
        await runner.environment_change(
            request.model_copy(update={"change_id": "x", "environment_id": "nope"})
        )


async def test_kill_9_mid_install_leaves_the_old_prefix(root: Path) -> None:
    """V8 with a crash: the runner daemon (the process running the LocalRunner) is killed
    with SIGKILL while a build has half-changed the prefix; the tool dies with it, and after the
    restart the change is failed/interrupted and the prefix is byte-for-byte what it was."""
    daemon = await start_daemon(root, subprocess=True)
    try:
        remote = daemon.runner
        await create_python(remote)
        prefix = Path((await remote.environment_info("env1")).prefix)
        folder = root.parent / "wheels"
        make_slow_sdist(folder, "sy-slow", "1.0", prefix, "hang")
        wheels(folder)
        before = prefix_hash(prefix)
        await remote.environment_change(
            EnvironmentChangeRequest(
                change_id="crash", environment_id="env1", action="install", manager="pip",
                specs=["sy-slow", "sy-alpha"], index_url="none", find_links=[str(folder)],
            )
        )  # fmt: skip
        await _wait_for(prefix / ".build-started")
        assert prefix_hash(prefix) != before
        # the tools of the change run with HOME in its scratch folder, seen at /env-scratch
        # (V4); other tests' builds run beside this one under CI's workers, so only the
        # daemon's own descendants are this change's tools
        assert daemon.process is not None
        tools = _descendants_with(daemon.process.pid, b"HOME=/env-scratch")
        assert tools
        daemon.kill()
        # --die-with-parent: uv and the build (its pid namespace) are gone with the runner
        await _wait_gone(tools)
        await daemon.restart()
        done = await remote.environment_change_status("crash")
        assert (done.state, done.error_kind) == (EnvChangeState.failed, "interrupted")
        assert prefix_hash(prefix) == before
        # the environment is usable again
        ok = await change(
            remote, change_id="after", environment_id="env1", action="install",
            manager="pip", specs=["sy-alpha"], **local_only(folder),
        )  # fmt: skip
        assert ok.state == EnvChangeState.succeeded, ok.error
        assert names(ok, "pip")["sy-alpha"] == "1.0"
    finally:
        await daemon.stop()


async def test_r_environment_over_the_daemon(root: Path) -> None:
    """V1, V4 through the runner daemon: an r environment has R's version as its base record
    and a library inside the prefix that R in a command puts first."""
    if shutil.which("Rscript") is None:
        pytest.skip("R (Rscript) is not installed on this machine")
    async with running_daemon(root) as daemon:
        remote = daemon.runner
        done = await change(
            remote, change_id="r1", environment_id="renv", action="create", language="r"
        )
        assert done.state == EnvChangeState.succeeded, done.error
        base = {p.name: p.version for p in done.packages if p.manager == "base"}
        assert base["r"].count(".") == 2
        info = await remote.environment_info("renv")
        library = Path("/env/lib/R/library")  # V4: as commands see it
        assert info.mounted_at == "/env" and info.env["R_LIBS"] == str(library)
        await remote.ensure_workspace("ws")
        await remote.start(
            StartRequest(execution_id="rx", workspace_id="ws", environment_id="renv",
                         command="Rscript -e 'cat(.libPaths()[1])'")
        )  # fmt: skip
        result = await remote.wait("rx", 60)
        out = (await remote.read_log("rx", "stdout", 0, 4096)).data.decode()
        assert result.exit_code == 0, out
        assert out.strip() == str(library)
        missing = await remote.environment_change_status("nothing")
        assert missing.state == EnvChangeState.lost


async def test_a_real_package_from_the_index(runner: LocalRunner) -> None:
    """V2 with the real package index: six comes from PyPI, recorded with its index URL, and
    a command imports it."""
    await create_python(runner)
    done = await change(
        runner, change_id="six", environment_id="env1", action="install", manager="pip",
        specs=["six==1.17.0"],
    )  # fmt: skip
    assert done.state == EnvChangeState.succeeded, done.error
    six = next(p for p in done.packages if p.manager == "pip" and p.name == "six")
    assert six.version == "1.17.0" and six.source == "https://pypi.org/simple"
    code, out, err = await run(
        runner, "x", "python -c 'import six; print(six.__version__)'", "env1"
    )
    assert (code, out.strip()) == (0, "1.17.0"), err


async def _wait_for(path: Path, timeout_s: float = 120.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if path.exists():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{path} did not appear")


def _start_time(pid: int) -> int | None:
    """The process's start time (field 22 of /proc/<pid>/stat): a pid used again differs."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    return int(raw[raw.rindex(b")") + 2 :].split()[19])


def _descendants_with(ancestor: int, needle: bytes) -> dict[int, int | None]:
    """Host pids under ``ancestor`` whose environment holds ``needle`` (one NAME=value entry),
    with their start times."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as handle:
                    raw = handle.read()
            except OSError:
                continue
            parents[int(entry)] = int(raw[raw.rindex(b")") + 2 :].split()[1])
    found: dict[int, int | None] = {}
    for pid in parents:
        up: int | None = parents.get(pid)
        for _ in range(64):  # a chain of parents ends at init (1) or the kernel (0)
            if up in (None, 0, 1, ancestor):
                break
            up = parents.get(up)  # type: ignore[arg-type]
        if up != ancestor:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                if needle in handle.read().split(b"\0"):
                    found[pid] = _start_time(pid)
        except OSError:
            continue
    return found


async def _wait_gone(tools: dict[int, int | None], timeout_s: float = 10.0) -> None:
    def alive() -> list[int]:
        return [pid for pid, began in tools.items() if _start_time(pid) == began]

    for _ in range(int(timeout_s / 0.05)):
        if not alive():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"processes {alive()} outlived the runner")
