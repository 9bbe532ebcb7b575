"""Warm sandboxes (runner/sandbox/warm.py): a workspace's next sandbox made ahead, waiting
before exec. Real bubblewrap throughout; each test proves a warm one was (or was not) used
by the pool's counters and the execution's meta.json, not only that nothing broke."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from env_fixtures import make_wheel
from local_runner import kill9_while_running, open_files
from runner_daemon_fixture import start_daemon

from conftest import Yard, kill_server, open_yard
from shellyard.contract.environments import EnvironmentChangeBody, EnvironmentCreateRequest
from shellyard.contract.executions import ExecutionState, RunShellRequest
from shellyard.runner.protocol import SandboxPolicy
from shellyard.sdk.client import Client


def warm_processes(*workspaces: str) -> dict[int, str]:
    """Host pid → warm sandbox id of every process still made for a warm sandbox (of these
    workspaces only, when named: other tests and benchmarks may run beside)."""
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        sandbox = [x for x in environ if x.startswith(b"SHELLYARD_SANDBOX_ID=warm-")]
        owner = {
            x.split(b"=", 1)[1].decode()
            for x in environ
            if x.startswith(b"SHELLYARD_WORKSPACE_ID=")
        }
        if sandbox and (not workspaces or owner & set(workspaces)):
            found[int(entry)] = sandbox[0].split(b"=", 1)[1].decode()
    return found


async def wait_for_warm(runner: Any, workspace_id: str, timeout_s: float = 10.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        waiting = runner._runs.warm.waiting()
        if workspace_id in waiting:
            return str(waiting[workspace_id])
        await asyncio.sleep(0.02)
    raise AssertionError(f"no warm sandbox was made for {workspace_id}")


def meta(runner: Any, execution_id: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        (runner.root / "executions" / execution_id / "meta.json").read_text()
    )
    return data


async def run(plane: Any, command: str, agent_id: str | None = None, **options: Any) -> Any:
    request = RunShellRequest(command=command, **options)
    return await plane.executions.run_shell(request, agent_id=agent_id)


async def test_every_command_is_a_fresh_process_in_a_warm_sandbox(home: Path) -> None:
    """E1: a command taking a warm sandbox is a fresh process as before: its own start time,
    no variable or folder of an earlier command, the start folder /workspace (or its cwd),
    the same environment a cold sandbox gives; E2: its /tmp is its own."""
    plane, _, _ = await open_yard(home, "local")
    try:
        runner = plane.runners.get("local")
        probe = "echo $$; cut -d' ' -f22 /proc/self/stat; pwd; echo ${LEFT:-unset}; ls /tmp"
        first = await run(plane, f"export LEFT=1; cd /tmp; touch left-here; {probe}")
        assert first.exit_code == 0
        assert meta(runner, first.execution_id).get("sandbox_id") is None  # the first: cold
        await wait_for_warm(runner, first.workspace_id)
        second = await run(plane, probe)
        assert meta(runner, second.execution_id)["sandbox_id"].startswith("warm-")
        assert runner._runs.warm.stats["taken"] == 1
        pid1, start1, cwd1, _left1, tmp1 = first.stdout.split("\n", 4)
        pid2, start2, cwd2, left2, tmp2 = second.stdout.split("\n", 4)
        assert pid2 == pid1 == "2"  # the command under the namespace's init, as cold
        assert start2 != start1  # a new process
        assert (cwd1, cwd2) == ("/tmp", "/workspace")
        assert left2 == "unset" and "left-here" in tmp1 and tmp2 == ""
        await wait_for_warm(runner, first.workspace_id)
        os.makedirs(runner.workspace_path(first.workspace_id) / "sub", exist_ok=True)
        in_sub = await run(plane, "pwd; env | sort", cwd="sub", env={"MINE": "x y"})
        assert meta(runner, in_sub.execution_id)["sandbox_id"].startswith("warm-")
        runner._runs.warm.discard_all("test")
        cold = await run(plane, "pwd; env | sort", cwd="sub", env={"MINE": "x y"})
        assert meta(runner, cold.execution_id).get("sandbox_id") is None

        def without_id(text: str) -> list[str]:
            return [x for x in text.splitlines() if not x.startswith("SHELLYARD_EXECUTION_ID=")]

        assert without_id(in_sub.stdout) == without_id(cold.stdout)
        assert "MINE=x y" in in_sub.stdout and in_sub.stdout.startswith("/workspace/sub\n")
        assert f"SHELLYARD_EXECUTION_ID={in_sub.execution_id}" in in_sub.stdout
    finally:
        await plane.aclose()
    assert not warm_processes(first.workspace_id)


async def test_a_policy_change_discards_the_warm_sandbox(home: Path) -> None:
    """R2: a warm sandbox made under the old policy is not used: the command runs under the
    new limit (its open-file limit, set before bwrap), and the old one is gone."""
    plane, _, _ = await open_yard(home, "local")
    try:
        runner = plane.runners.get("local")
        first = await run(plane, "ulimit -n")
        old = await wait_for_warm(runner, first.workspace_id)
        runner.policy.max_open_files = 321
        after = await run(plane, "ulimit -n")
        assert after.stdout == "321\n"
        assert meta(runner, after.execution_id).get("sandbox_id") is None
        assert runner._runs.warm.stats["discarded_changed"] == 1
        assert runner._runs.warm.stats["taken"] == 0
        deadline = time.monotonic() + 10
        while old in warm_processes().values() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert old not in warm_processes().values()
    finally:
        await plane.aclose()


@pytest.mark.timeout(300)
async def test_an_environment_install_discards_the_warm_sandbox(home: Path) -> None:
    """V4, V5, E1: a warm sandbox made with an environment's revision 1 is not used after an
    install made revision 2: the command sees the installed package, in a new sandbox."""
    plane, _, _ = await open_yard(home, "local")
    yard = Yard(plane, "local", home)
    try:
        runner = plane.runners.get("local")
        wheels = home / "wheels"
        make_wheel(wheels, "shellyard-warmwheel", "1.0.0", {"warmwheel.py": "V = 'new'\n"})
        view = await plane.environments.create(
            EnvironmentCreateRequest(name="main", language="python", wait_ms=30_000)
        )
        assert view.state == "ready", view
        env_id = view.environment_id
        probe = "python -c 'import warmwheel; print(warmwheel.V)' 2>/dev/null || echo none"
        before = await yard.run(probe, environment_id=env_id)
        assert before.stdout == "none\n"
        await wait_for_warm(runner, before.workspace_id)
        change = await plane.environments.install(
            env_id,
            EnvironmentChangeBody(
                manager="pip",
                specs=["shellyard-warmwheel==1.0.0"],
                find_links=[str(wheels)],
                index_url="none",
                wait_ms=30_000,
            ),
        )
        if not change.done:
            change = await plane.environments.wait(change.change_id, 120)
        assert change.state == "succeeded", change
        assert runner._runs.warm.stats["discarded_environment"] == 1
        after = await yard.run(probe, environment_id=env_id)
        assert after.stdout == "new\n" and after.environment_revision == 2
        assert meta(runner, after.execution_id).get("sandbox_id") is None
        assert runner._runs.warm.stats["taken"] == 0
    finally:
        await plane.aclose()


async def test_quota_breach_discards_the_warm_sandbox(home: Path) -> None:
    """R2 limits: a command stopped by the workspace quota; the warm sandbox made before it
    is discarded, the next command starts cold."""
    plane, _, _ = await open_yard(home, "local", SandboxPolicy(workspace_quota_bytes=1 << 20))
    try:
        runner = plane.runners.get("local")
        first = await run(plane, "true")
        await wait_for_warm(runner, first.workspace_id)
        filler = await run(plane, "head -c 8000000 /dev/zero > big; sleep 5")
        assert meta(runner, filler.execution_id)["sandbox_id"].startswith("warm-")
        assert filler.limit == "quota" and filler.exit_code == 137, filler  # killed
        assert runner._runs.warm.stats["discarded_limit"] == 1
        next_one = await run(plane, "rm -f big; echo ok")
        assert next_one.stdout == "ok\n"
        assert meta(runner, next_one.execution_id).get("sandbox_id") is None
    finally:
        await plane.aclose()


async def test_two_workspaces_never_share_a_warm_sandbox(home: Path) -> None:
    """R2: each workspace's warm sandbox binds its own tree; a command of one workspace
    never takes the other's (its file is not there), each takes its own."""
    plane, _, _ = await open_yard(home, "local")
    try:
        runner = plane.runners.get("local")
        a = await run(plane, "echo a > mine.txt")
        session, _agent = await plane.store.default_owner()
        other = await plane.store.create_agent(str(session.id))
        b = await run(plane, "echo b > mine.txt", agent_id=str(other.id))
        assert a.workspace_id != b.workspace_id
        warm_a = await wait_for_warm(runner, a.workspace_id)
        warm_b = await wait_for_warm(runner, b.workspace_id)
        assert warm_a != warm_b
        read_b = await run(plane, "cat mine.txt", agent_id=str(other.id))
        read_a = await run(plane, "cat mine.txt")
        assert (read_a.stdout, read_b.stdout) == ("a\n", "b\n")
        assert meta(runner, read_a.execution_id)["sandbox_id"] == warm_a
        assert meta(runner, read_b.execution_id)["sandbox_id"] == warm_b
    finally:
        await plane.aclose()


async def test_a_warm_folder_that_cannot_become_the_executions_runs_nothing(
    home: Path,
) -> None:
    """E10, E11: a warm sandbox's folder is renamed to the execution's before its command is
    written to the waiter's pipe, so no command ever runs in a folder recovery does not take
    for the execution's (a kill -9 between the two would have left it running in
    ``sandbox/warm/``, reaped, and a retried start would have run it again). Shown by the
    one case the order decides without a fault hook: a warm folder removed beside the runner
    cannot be renamed; the warm sandbox runs nothing and goes, the command runs once, cold
    (sent first, it ran in the warm sandbox and its start failed "nothing ran")."""
    plane, _, _ = await open_yard(home, "local")
    try:
        runner = plane.runners.get("local")
        first = await run(plane, "true")
        warm_id = await wait_for_warm(runner, first.workspace_id)
        shutil.rmtree(runner._runs.warm.directory / warm_id)
        done = await run(plane, "echo ran >> count; cat count")
        assert done.state == ExecutionState.completed, done
        assert (done.exit_code, done.stdout) == (0, "ran\n"), done
        assert meta(runner, done.execution_id).get("sandbox_id") is None  # cold
        stats = runner._runs.warm.stats
        assert (stats["taken"], stats["discarded_folder"]) == (0, 1), stats
        deadline = time.monotonic() + 10
        while warm_id in warm_processes().values() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert warm_id not in warm_processes().values()
        again = await run(plane, "cat count")  # the discarded one never ran it
        assert again.stdout == "ran\n", again
    finally:
        await plane.aclose()


async def test_kill9_of_the_control_plane_leaves_no_warm_sandbox(served_home: Path) -> None:
    """E11: ``shellyard serve`` killed with SIGKILL while warm sandboxes wait: their waiters
    see the pipe end and run nothing; after the restart no process of theirs is left and
    their folders are gone, while a running execution survives and finishes (E11)."""
    home = served_home
    client = Client.for_home(home)
    first = client.run("echo one", wait_ms=30000)
    assert first.state == ExecutionState.completed
    deadline = time.monotonic() + 10
    while not warm_processes(first.workspace_id) and time.monotonic() < deadline:
        time.sleep(0.05)
    waiting = set(warm_processes(first.workspace_id).values())
    assert waiting, "a warm sandbox must be waiting before the kill"
    running = client.run("sleep 2; echo survived", wait_ms=200)  # takes the warm one
    assert running.state == ExecutionState.running
    deadline = time.monotonic() + 10
    while len(set(warm_processes(first.workspace_id).values())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # the taken one's command runs; the next one waits
    kill_server(home)
    client = Client.for_home(home)  # a new control plane on the same home
    done = client.wait(running.execution_id, 30)
    assert done.state == ExecutionState.completed and done.exit_code == 0
    assert client.logs(running.execution_id).data == "survived\n"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        left = {
            pid: sid for pid, sid in warm_processes(first.workspace_id).items() if sid in waiting
        }
        if not left:
            break
        time.sleep(0.05)
    assert not left, f"warm sandbox processes left after the restart: {left}"
    folders = [p.name for p in home.glob("**/sandbox/warm/warm-*")]
    assert not set(folders) & waiting, "a dead runner's warm folders are removed at restart"
    after = client.run("echo next", wait_ms=30000)  # and new ones are made
    assert after.exit_code == 0, (after.state, after.error)


async def test_kill9_of_the_runner_daemon_leaves_no_warm_sandbox(home: Path) -> None:
    """E11, R3: a runner daemon killed with SIGKILL while its warm sandbox waits: after the
    restart nothing of it is left, and the daemon makes and uses new ones."""
    plane, _, _ = await open_yard(home, "local")
    daemon = await start_daemon(home / "daemon", SandboxPolicy(), subprocess=True)
    try:
        await plane.runners.add_direct("remote", daemon.url, daemon.token)
        first = await run(plane, "echo one", runner_id="remote")
        assert first.stdout == "one\n"
        deadline = time.monotonic() + 10
        while not warm_processes(first.workspace_id) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        waiting = set(warm_processes(first.workspace_id).values())
        assert waiting, "the daemon must have a warm sandbox waiting before the kill"
        daemon.kill()
        await daemon.restart()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            left = {
                pid: sid
                for pid, sid in warm_processes(first.workspace_id).items()
                if sid in waiting
            }
            if not left:
                break
            await asyncio.sleep(0.05)
        assert not left, f"warm sandbox processes left after the restart: {left}"
        assert not [p for p in (home / "daemon").glob("**/sandbox/warm/*") if p.name in waiting]
        again = await run(plane, "echo two", runner_id="remote")
        assert again.stdout == "two\n"
        # the next one is made in a task after ``again`` started: wait for it (a loaded
        # machine makes it after a back-to-back command would have asked)
        deadline = time.monotonic() + 10
        while not warm_processes(first.workspace_id) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        after = await run(plane, "echo three", runner_id="remote")
        root = home / "daemon"
        recorded = json.loads(
            next(root.glob(f"**/executions/{after.execution_id}/meta.json")).read_text()
        )
        assert recorded["sandbox_id"].startswith("warm-")  # the restarted daemon warms again
    finally:
        await plane.aclose()
        await daemon.stop()


async def _local_runner(root: Path) -> Any:
    from shellyard.runner.local import LocalRunner

    root.mkdir(parents=True)
    root.chmod(0o711)
    runner = LocalRunner(root / "runner")
    await runner.startup()
    return runner


async def _run_direct(runner: Any, workspace_id: str, execution_id: str) -> None:
    from shellyard.runner.protocol import StartRequest

    await runner.ensure_workspace(workspace_id)
    request = StartRequest(execution_id=execution_id, workspace_id=workspace_id, command="true")
    await runner.start(request)
    assert (await runner.wait(execution_id, 30)).exit_code == 0


async def test_the_next_warm_sandbox_is_made_off_a_short_commands_end(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/operations.md "Warm sandboxes", docs/benchmarks.md §55: the workspace's next
    sandbox is made once its command has run SHELLYARD_WARM_AFTER_MS or when it ends, if
    sooner, never at the start itself (there its making took the loop and the cores from a
    short command's end). A command that runs longer than that has it ready before it ends;
    one that ends sooner has it made after its end; either way the next command takes it."""
    from shellyard.runner.protocol import StartRequest

    monkeypatch.setenv("SHELLYARD_WARM_AFTER_MS", "400")
    runner = await _local_runner(home / "r")
    pool = runner._runs.warm
    workspace = f"ws-after-{os.getpid()}-{time.time_ns()}"
    try:
        assert pool.after_s == 0.4
        await runner.ensure_workspace(workspace)
        await runner.start(
            StartRequest(execution_id="long", workspace_id=workspace, command="sleep 3")
        )
        await asyncio.sleep(0.15)  # running, not yet 400 ms: nothing is being made
        assert pool.waiting() == {} and pool.stats["made"] == 0
        assert not warm_processes(workspace)
        made = await wait_for_warm(runner, workspace, timeout_s=2.5)  # at 400 ms, running
        assert (await runner.status("long")).state == "running"
        ended = await runner.wait("long", 30)
        assert ended.exit_code == 0 and pool.waiting() == {workspace: made}
        # Taken by a command that ends before its timer (an hour here): the next is made
        # at its end, not at its start.
        pool.after_s = 3600.0
        short = StartRequest(execution_id="short", workspace_id=workspace, command="sleep 0.3")
        await runner.start(short)
        assert pool.stats["taken"] == 1 and pool.waiting() == {}
        await asyncio.sleep(0.15)
        assert pool.waiting() == {} and pool.stats["made"] == 1  # none made while it runs
        assert (await runner.wait("short", 30)).exit_code == 0
        following = await wait_for_warm(runner, workspace)
        assert following != made and pool.stats["made"] == 2
        following_request = StartRequest(
            execution_id="next", workspace_id=workspace, command="true"
        )
        await runner.start(following_request)
        assert pool.stats["taken"] == 2
        assert (await runner.wait("next", 30)).exit_code == 0
    finally:
        await runner.aclose()
    assert not warm_processes(workspace)


async def test_idle_full_and_memory_pressure_discard(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R2: bounded per runner (SHELLYARD_WARM_SANDBOXES): with every place taken, one that
    waited less than its swap age keeps its place (the other workspace starts cold and none
    is made for it: no spawn thrown away), one that waited longer makes room; gone after
    SHELLYARD_WARM_IDLE_S, none made and none kept while the host is short of memory (the
    threshold raised over the real /proc/meminfo); each discarded one's processes are gone."""
    from shellyard.runner.sandbox import warm

    monkeypatch.setenv("SHELLYARD_WARM_SANDBOXES", "1")
    monkeypatch.setenv("SHELLYARD_WARM_IDLE_S", "3")
    runner = await _local_runner(home / "r")
    pool = runner._runs.warm
    ws_a, ws_b = f"ws-a-{os.getpid()}-{time.time_ns()}", f"ws-b-{os.getpid()}-{time.time_ns()}"
    try:
        await _run_direct(runner, ws_a, "a1")
        first = await wait_for_warm(runner, ws_a)
        assert pool.swap_after_s == 3 * warm.SWAP_FRACTION
        pool.swap_after_s = 3600.0  # a's is young: it keeps its place
        await _run_direct(runner, ws_b, "b1")
        deadline = time.monotonic() + 10
        while not pool.stats["full"] and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert pool.waiting() == {ws_a: first} and pool.stats["full"] == 1
        assert pool.stats["discarded_full"] == 0
        pool.swap_after_s = 0.0  # a's has waited long enough: b's next takes its place
        await _run_direct(runner, ws_b, "b2")
        await wait_for_warm(runner, ws_b)
        assert set(pool.waiting()) == {ws_b} and pool.stats["discarded_full"] == 1
        deadline = time.monotonic() + 10
        while pool.waiting() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert pool.waiting() == {} and pool.stats["discarded_idle"] == 1
        monkeypatch.setattr(warm, "MEMORY_LOW_FRACTION", 1.01)  # every host is short now
        assert warm.memory_low()
        await _run_direct(runner, ws_a, "a2")
        await asyncio.sleep(0.5)
        assert pool.waiting() == {} and pool.stats["memory"] >= 1
        deadline = time.monotonic() + 10
        while first in warm_processes().values() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not warm_processes(ws_a, ws_b)
    finally:
        await runner.aclose()
    assert not warm_processes(ws_a, ws_b)


async def test_a_taken_warm_sandbox_costs_no_new_record_file(home: Path) -> None:
    """docs/benchmarks.md §36: a taken warm sandbox's warm.json (read only in the warm folder,
    by ``reap``) becomes the execution's meta.json by a rename, whole (E11: meta.json is whole
    or absent), so no ``meta.json.tmp`` inode is made; and its next warm sandbox asks the
    workspace's uid (with the R2 checks of its tree and home) once for its key and spawn
    together, not twice: two asks a run with the take's own, not three."""
    runner = await _local_runner(home / "r")
    workspace = f"ws-rec-{os.getpid()}-{time.time_ns()}"
    box = runner._sandboxes
    try:
        await _run_direct(runner, workspace, "rec1")
        sandbox_id = await wait_for_warm(runner, workspace)
        record = runner._runs.warm.directory / sandbox_id / "warm.json"
        inode = record.stat().st_ino
        asked: list[str] = []
        real = box.workspace_ids
        if real is not None:

            def counted(workspace_id: str) -> tuple[int, int]:
                asked.append(workspace_id)
                return real(workspace_id)

            box.workspace_ids = counted
        await _run_direct(runner, workspace, "rec2")
        await wait_for_warm(runner, workspace)
        folder = runner.root / "executions" / "rec2"
        recorded = json.loads((folder / "meta.json").read_text())
        assert recorded["sandbox_id"] == sandbox_id
        assert (folder / "meta.json").stat().st_ino == inode
        assert not (folder / "warm.json").exists()
        assert not (folder / "meta.json.tmp").exists()
        if real is not None:
            assert asked == [workspace, workspace]
    finally:
        box.workspace_ids = real
        await runner.aclose()
    assert not warm_processes(workspace)


async def test_a_warm_run_makes_no_inode_on_the_loop_thread(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/benchmarks.md §46: making an inode on this ext4 costs 80–600 µs of CPU; a run
    that takes a warm sandbox makes none in the runner's folders on the event loop's thread,
    from its start through the making of the workspace's next warm sandbox: that folder, its
    logs, status, warm.json and the result's temporary are made in a worker thread, and
    result.json is the temporary renamed. The run still gets its own folder and files."""
    import threading

    runner = await _local_runner(home / "r")
    workspace = f"ws-inode-{os.getpid()}-{time.time_ns()}"
    loop_thread = threading.get_ident()
    made: list[str] = []
    real_open, real_mkdir = os.open, os.mkdir

    def counted_open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: Any = None) -> int:
        if threading.get_ident() == loop_thread and flags & os.O_CREAT:
            try:
                os.stat(path, dir_fd=dir_fd)
            except FileNotFoundError:
                made.append(os.fspath(path))
        return real_open(path, flags, mode, dir_fd=dir_fd)

    def counted_mkdir(path: Any, mode: int = 0o777, *, dir_fd: Any = None) -> None:
        if threading.get_ident() == loop_thread:
            made.append(os.fspath(path))
        real_mkdir(path, mode, dir_fd=dir_fd)

    try:
        await _run_direct(runner, workspace, "inode1")
        sandbox_id = await wait_for_warm(runner, workspace)
        with monkeypatch.context() as patched:
            patched.setattr(os, "open", counted_open)
            patched.setattr(os, "mkdir", counted_mkdir)
            await _run_direct(runner, workspace, "inode2")
            await wait_for_warm(runner, workspace)
        folder = runner.root / "executions" / "inode2"
        assert json.loads((folder / "meta.json").read_text())["sandbox_id"] == sandbox_id
        assert json.loads((folder / "result.json").read_text())["exit_code"] == 0
        assert sorted(os.listdir(folder)) == [
            "meta.json",
            "result.json",
            "status",
            "stderr",
            "stdout",
        ]
        assert made == [], made
    finally:
        await runner.aclose()
    assert not warm_processes(workspace)


async def test_a_warm_spawn_cancelled_in_flight_leaves_no_process_and_no_descriptor(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The warm sandbox's spawn runs in a worker thread (warm.py ``spawn_in_thread``): its
    making cancelled while that thread is inside the real spawn (the loop stopping) waits
    for the thread, kills and reaps what it spawned, and only then closes the descriptors
    the spawn used: no process of it is left, none of its files stays open here, its folder
    goes, and the next command of the workspace still runs (cold, then warm again)."""
    import threading

    from shellyard.runner.sandbox.spawn import PendingSpawn

    inside, release = threading.Event(), threading.Event()
    real = PendingSpawn.spawn

    def spawn(self: PendingSpawn) -> Any:
        if self.sandbox_id.startswith("warm-") and not release.is_set():
            inside.set()
            release.wait(30)
        return real(self)

    monkeypatch.setattr(PendingSpawn, "spawn", spawn)
    monkeypatch.setenv("SHELLYARD_WARM_AFTER_MS", "0")
    runner = await _local_runner(home / "r")
    pool = runner._runs.warm
    workspace = f"ws-cancel-{os.getpid()}-{time.time_ns()}"
    try:
        await _run_direct(runner, workspace, "c1")  # its start asked for the next one
        assert await asyncio.to_thread(inside.wait, 30), "no warm spawn began"
        (task,) = pool._tasks
        task.cancel()
        await asyncio.sleep(0.1)
        assert not task.done()  # it waits for the thread: its descriptors are in use
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert pool.waiting() == {}
        folders = list((runner.root / "sandbox" / "warm").glob("warm-*"))
        assert folders == [], folders
        open_here = open_files()
        assert not [path for path in open_here if "/warm/warm-" in path], open_here
        deadline = time.monotonic() + 10
        while warm_processes(workspace) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not warm_processes(workspace)
        await _run_direct(runner, workspace, "c2")  # cold; asks for a warm one again
        await wait_for_warm(runner, workspace)
        await _run_direct(runner, workspace, "c3")
        assert meta(runner, "c3")["sandbox_id"].startswith("warm-")
    finally:
        release.set()
        await runner.aclose()
    assert not warm_processes(workspace)


async def test_kill9_with_warm_spawns_in_flight_leaves_no_process(
    served_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """E11: ``shellyard serve`` killed with SIGKILL while commands run back to back, each
    start making the next warm sandbox in a worker thread (SHELLYARD_WARM_AFTER_MS=0), so a
    spawn is often in flight: a vforked child finishes its exec, but its waiter's pipe has
    no writer left and it runs nothing; no warm process is left even before a restart, and
    the restarted service runs commands in warm sandboxes again."""
    monkeypatch.setenv("SHELLYARD_WARM_AFTER_MS", "0")
    home = served_home
    for round_ in range(3):
        workspace = await kill9_while_running(home, round_)
        deadline = time.monotonic() + 15
        while warm_processes(workspace) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not warm_processes(workspace), f"round {round_}: warm processes left"
    client = Client.for_home(home)
    client.run("true", wait_ms=30000)
    deadline = time.monotonic() + 10
    while not warm_processes(workspace) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    after = client.run("true", wait_ms=30000)
    assert after.exit_code == 0
    assert folder_of_warm(home, after.execution_id)


def folder_of_warm(home: Path, execution_id: str) -> bool:
    """Whether the execution took a warm sandbox (its meta.json names one)."""
    (found,) = home.glob(f"**/executions/{execution_id}/meta.json")
    return str(json.loads(found.read_text()).get("sandbox_id", "")).startswith("warm-")
