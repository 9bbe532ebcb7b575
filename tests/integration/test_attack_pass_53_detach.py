"""Attack pass of session 53 (second engineer) on the launcher's detach (launch.c ``--detach``,
bwrap.py ``Detach``) where session 52 did not go: the service killed with SIGKILL while
detached sandboxes run, then its restart and adoption (E11); egress executions (R2 network
``egress``); interactive executions on a terminal (E13); a mount appearing below the runner's
folder between the launcher's read of the table and its own namespace (docs/security.md
"Attack pass (session 53, the detach under restarts, egress, tty)"). Each runs with at least
four busy workspaces, so the launcher really detaches. Real overlays, a real launcher, real
runners with bubblewrap; root needed.

Each test says whether it is a finding (fixed here) or a property that held."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shlex
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from host_listener import host_listener
from leftover_mounts import remove_home
from local_runner import ended, process_tag, tagger, workspace_processes
from mount_table import host_points_below, points_below
from runner_daemon_fixture import start_daemon

from conftest import kill_server, stop_server
from shellyard.contract.executions import ExecutionState
from shellyard.runner.local import LocalRunner
from shellyard.runner.protocol import SandboxPolicy, StartRequest
from shellyard.runner.sandbox import launch
from shellyard.runner.sandbox.bwrap import Detach
from shellyard.sdk.client import Client

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(os.geteuid() != 0, reason="mounts and mount namespaces are root's"),
]

eid = tagger(process_tag())
_count = itertools.count()


async def _monitor_table(workspace_id: str, root: str) -> str:
    """The table the workspace's bwrap started from: its monitor stays in the launcher's
    namespace (the sandbox's own table holds only what bwrap bound, no host path)."""
    for _ in range(200):
        for pid in workspace_processes(workspace_id):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/comm").read_text().strip() != "bwrap":
                    continue
                text = Path(f"/proc/{pid}/mountinfo").read_text()
                if root in text:
                    return text
        await asyncio.sleep(0.05)
    raise AssertionError(f"no bwrap monitor of {workspace_id} found")


@contextlib.asynccontextmanager
async def _busy(
    tmp_path: Path, policy: SandboxPolicy, others_run: list[str]
) -> AsyncIterator[tuple[LocalRunner, list[str], str]]:
    """A root runner (``policy``) with one execution running in each of
    ``len(others_run)`` (at least 4) other workspaces, their trees, homes and networks
    mounted below its folder, and a fifth workspace, the agent's, idle."""
    others = [eid(f"other{i}") for i in range(len(others_run))]
    mine = eid("mine")
    local = LocalRunner(tmp_path / "runner", policy)
    await local.startup()
    started = []
    try:
        for workspace in [*others, mine]:
            await local.ensure_workspace(workspace)
        for workspace, command in zip(others, others_run, strict=True):
            execution = eid(f"ex-{workspace}")
            await local.start(StartRequest(execution_id=execution, workspace_id=workspace,
                                           command=command))  # fmt: skip
            started.append(execution)
        root = os.path.realpath(local.root)
        if os.path.realpath(local.workspace_path(others[0])) not in host_points_below(root):
            pytest.skip("this kernel mounted no overlay per workspace (own mounts off)")
        yield local, others, mine
    finally:
        try:
            for execution in started:
                await local.cancel(execution)
            # A cancel ends its execution after the runner answers (E7) and a closed runner
            # leaves running sandboxes for its next start (E11): closed at once, the
            # listener's sandbox outlived every run of this suite.
            for execution in started:
                await ended(local, execution)
        finally:
            await local.aclose()


@pytest.fixture
def quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    """Own overlays on, no warm sandbox (each start a cold spawn through the launcher)."""
    monkeypatch.setenv("SHELLYARD_OWN_MOUNTS", "on")
    monkeypatch.setenv("SHELLYARD_WARM_SANDBOXES", "0")


def _detached_from_the_others(table: str, local: LocalRunner, others: list[str], mine: str) -> None:
    root = os.path.realpath(local.root)
    below = points_below(table, root)
    assert os.path.realpath(local.workspace_path(mine)) in below, below
    for other in others:
        assert not {p for p in below if p.endswith("/" + other)}, below


async def _output(local: LocalRunner, execution_id: str) -> str:
    return (await local.read_log(execution_id, "stdout", 0, 1 << 20)).data.decode()


# --- (d) a mount appearing between the launcher's read of the table and its unshare -------

#: Put before the launcher by LD_PRELOAD: its unshare(CLONE_NEWNS) mounts a tmpfs on
#: $LATE_MOUNT first, in the caller's namespace: a workspace's overlay or network namespace
#: the runner mounted in the microseconds between the launcher's read of mountinfo and its
#: unshare, made certain.
LATE_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/mount.h>
int unshare(int flags) {
    const char *late = getenv("LATE_MOUNT");
    if (late && (flags & CLONE_NEWNS))
        mount("late", late, "tmpfs", 0, NULL);
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "unshare");
    return real(flags);
}
"""


def test_a_mount_made_between_the_read_and_the_unshare_is_detached_too(tmp_path: Path) -> None:
    """Finding (R2 tenants): the launcher read the host's table, then took its namespace; a
    mount made below the runner's folder between the two (another workspace's overlay or
    network namespace, mounted by the runner for that workspace's start) was copied into
    the launcher's namespace and never unmounted there. bwrap's monitor stays in that
    namespace for the sandbox's life: it held the other workspace's overlay (its upper
    layer "in use") and network namespace alive after the host let them go. Now the table
    is read again inside the namespace. The host (the test's own namespace here) keeps it."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    assert compiler is not None, "no C compiler on this host"
    # built dynamically here: the runner's own build is static where it can be (§79), and a
    # static program takes no LD_PRELOAD
    launcher = tmp_path / "launch-dynamic"
    subprocess.run([compiler, "-O2", "-o", str(launcher), str(launch.SOURCE)], check=True)
    (tmp_path / "shim.c").write_text(LATE_SHIM)
    shim = tmp_path / "shim.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(shim), str(tmp_path / "shim.c"),
                    "-ldl"], check=True)  # fmt: skip
    root = tmp_path / "runner"
    folders = [root / f"ws{i}" for i in range(5)]
    late = root / "late"
    script = [
        "set -e",
        *(f"mkdir -p {f}; mount -t tmpfs t {f}" for f in folders),
        f"mkdir -p {late}",
        f"echo mine > {folders[0]}/file",
        shlex.join(["env", f"LD_PRELOAD={shim}", f"LATE_MOUNT={late}", str(launcher),
                    "--detach", str(root), "--keep", str(folders[0] / "file"),
                    "--", "/bin/cat", "/proc/self/mountinfo"]),
        "echo '#host'",
        "cat /proc/self/mountinfo",
    ]  # fmt: skip
    unshare = ["unshare", "-m", "--propagation", "private", "sh", "-c", "\n".join(script)]
    done = subprocess.run(unshare, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    sandbox, host = done.stdout.split("#host\n")
    assert str(late) in points_below(host, str(root)), "the shim mounted nothing: no race made"
    assert points_below(sandbox, str(root)) == {str(folders[0])}, sandbox


def test_a_keep_list_at_the_runners_bound_is_one_the_launcher_takes(tmp_path: Path) -> None:
    """Held (R2 tenants; many prefixes, views, binds): the runner passes at most
    ``launch.MAX_KEEPS`` keeps and past it none (``Detach.keeps`` None: no ``--detach``, the
    table stays whole, a cost); the launcher takes exactly that many and refuses one more
    (exit 127 before anything runs). Bounds that drifted apart would fail every spawn with
    that many binds, or detach with keeps left off."""
    launcher = launch.build(tmp_path / "bin")
    assert launcher is not None, "the host's C compiler built no launcher"
    root = tmp_path / "runner"
    detach = Detach.of(root)
    sources = [str(root / f"p{i}") for i in range(launch.MAX_KEEPS + 1)]

    def options(count: int) -> list[str]:
        return [word for source in sources[:count] for word in ("--ro-bind", source, "/x")]

    at_bound = detach.keeps(options(launch.MAX_KEEPS))
    assert at_bound is not None and len(at_bound) == launch.MAX_KEEPS
    assert detach.keeps(options(launch.MAX_KEEPS + 1)) is None
    for count, code in ((launch.MAX_KEEPS, 0), (launch.MAX_KEEPS + 1, 127)):
        keeps = [word for source in sources[:count] for word in ("--keep", source)]
        done = subprocess.run([str(launcher), "--detach", str(root), *keeps, "--", "/bin/true"],
                              capture_output=True, text=True, check=False)  # fmt: skip
        assert done.returncode == code, (count, done.stderr)


# --- (c) interactive executions on a terminal ---------------------------------------------


async def test_a_terminal_under_the_detach_takes_input_output_and_resize(
    tmp_path: Path, quiet: None, request: pytest.FixtureRequest
) -> None:
    """Held (E13 under R2 tenants): four busy workspaces, the agent's execution on a
    pseudo-terminal is launched detached (its bwrap's table holds none of their mounts): it
    reads a line sent to it, its output arrives, a resize reaches the program (stty size),
    and nothing of a host path shows in its terminal."""
    request.addfinalizer(lambda: remove_home(tmp_path / "runner"))
    policy = SandboxPolicy()
    async with _busy(tmp_path, policy, ["sleep 120"] * 4) as (local, others, mine):
        execution = eid("tty")
        command = 'stty size; read x; stty size; echo "got=$x"; cat /proc/self/mountinfo'
        start = StartRequest(execution_id=execution, workspace_id=mine, command=command,
                             interactive=True, tty=True, tty_rows=20, tty_cols=60)  # fmt: skip
        await local.start(start)
        table = await _monitor_table(mine, os.path.realpath(local.root))
        _detached_from_the_others(table, local, others, mine)
        for _ in range(200):
            if "20 60" in await _output(local, execution):
                break
            await asyncio.sleep(0.05)
        await local.resize(execution, 33, 101)
        await local.send_input(execution, b"hello\n", False)
        record = await ended(local, execution)
        out = await _output(local, execution)
        assert record.exit_code == 0, out
        assert "20 60" in out and "33 101" in out and "got=hello" in out, out
        for root in {str(local.root), os.path.realpath(local.root)}:
            assert root not in out, out


# --- (b) egress executions ----------------------------------------------------------------


@pytest.fixture
def loopback_server() -> Iterator[int]:
    """An HTTP listener on this host's 127.0.0.1 (the operator's egress exception); its port."""
    with host_listener(b"hello-from-host\n") as port:
        yield port


#: An HTTP listener on 127.0.0.1:PORT inside another workspace's own network namespace.
_LISTENER = (
    "python3 -c 'import http.server as h; "
    'h.HTTPServer(("127.0.0.1", {port}), h.SimpleHTTPRequestHandler).serve_forever()\''
)


@pytest.mark.skipif(shutil.which("socat") is None, reason="network 'egress' needs socat")
async def test_egress_under_the_detach_keeps_the_proxy_socket_and_no_other_network(
    tmp_path: Path, quiet: None, request: pytest.FixtureRequest, loopback_server: int
) -> None:
    """Held (R2 ``egress`` under R2 tenants): four busy workspaces, one of them listening on
    its own 127.0.0.1:8765; the agent's egress execution is launched detached: its table
    keeps the proxy socket's tmpfs (the one bind source of the egress), none of the other
    workspaces' trees, homes or network namespaces. Egress works (the operator's exception
    answers through the proxy), the other workspace's listener is reached neither directly
    nor through the proxy, and /run/shellyard holds only the proxy's socket."""
    request.addfinalizer(lambda: remove_home(tmp_path / "runner"))
    policy = SandboxPolicy(network="egress", egress_exceptions=[f"127.0.0.1:{loopback_server}"])
    others_run = [_LISTENER.format(port=8765), *["sleep 120"] * 3]
    async with _busy(tmp_path, policy, others_run) as (local, others, mine):
        root = os.path.realpath(local.root)
        assert any(p.endswith("/egress") for p in host_points_below(root))
        curl = "curl -sS -m 10"
        execution = eid("egress")
        await local.start(StartRequest(execution_id=execution, workspace_id=mine, command=(
            f"sleep 1; ls /run/shellyard; {curl} --noproxy '' http://127.0.0.1:{loopback_server}/;"
            f" {curl} --noproxy '*' http://127.0.0.1:8765/ 2>&1 | tail -1 | cut -c1-40;"
            f" {curl} --noproxy '' -o /dev/null -w '%{{http_code}}\\n' http://127.0.0.1:8765/"
        )))  # fmt: skip
        table = await _monitor_table(mine, root)
        _detached_from_the_others(table, local, others, mine)
        below = points_below(table, root)
        assert {p for p in below if p.endswith("/egress")}, below
        assert not {p for p in below if "/netns/" in p}, below
        record = await ended(local, execution)
        out = await _output(local, execution)
        assert record.exit_code == 0, out
        lines = out.splitlines()
        assert lines[:2] == ["egress.sock", "hello-from-host"], out
        assert lines[2].startswith("curl: (7)"), out  # nothing listens in this namespace
        assert lines[3] == "403", out  # the proxy refuses loopback but the exception


# --- (a) SIGKILL of the service with detached sandboxes running, restart, adoption ---------


def _home_lines(home: Path) -> list[str]:
    """The host's mount lines naming the home (field 4 or 5)."""
    real = str(home.resolve())
    return [
        line
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if str(home) in line or real in line
    ]


def test_kill9_with_detached_sandboxes_then_adoption_leaks_nothing(
    served_home: Path, quiet: None, request: pytest.FixtureRequest
) -> None:
    """Held (E11 under R2 tenants): ``shellyard serve`` (control plane and local runner) is
    killed with SIGKILL while five workspaces each run a detached sandbox that writes after
    the kill; a new serve adopts them: each ends with exit 0 and its files are in its
    workspace's next commit, the agent's sandbox saw (after the restart) nothing of another
    workspace and no host path, its launcher's table held none of the others' mounts, and
    once the service stops cleanly the host is left no mount of the home."""
    home = served_home

    def clean() -> None:  # a failed run's service and mounts, not left for the suite
        with contextlib.suppress(Exception):
            stop_server(home)
        remove_home(home)

    request.addfinalizer(clean)
    client = Client.for_home(home)
    agents = [client.create_session().main_agent_id for _ in range(5)]
    script = (
        "sleep 3; echo {n} > after.txt; echo h > ~/h.txt; "
        "cat /proc/self/mountinfo > seen.txt; ls -a / /workspace > ls.txt"
    )
    runs = []
    for n, agent in enumerate(agents):  # the last one's spawn sees four busy workspaces
        runs.append(client.as_agent(agent).run(script.format(n=n), background=True))
    runner = (home / "runners" / "local").resolve()
    workspaces = [r.workspace_id for r in runs]
    assert len(set(workspaces)) == 5, workspaces
    table = asyncio.run(_monitor_table(workspaces[-1], str(runner)))
    below = points_below(table, str(runner))
    assert not {p for p in below for w in workspaces[:-1] if p.endswith("/" + w)}, below
    kill_server(home)
    client = Client.for_home(home)  # a new serve on the same home: the restart (E11)
    for run, agent in zip(runs, agents, strict=True):
        done = client.as_agent(agent).wait(run.execution_id, 30)
        assert done.state == ExecutionState.completed and done.exit_code == 0, done
    for n, (run, agent) in enumerate(zip(runs, agents, strict=True)):
        seen = client.as_agent(agent).run(
            "cat after.txt ~/h.txt; cat seen.txt ls.txt", wait_ms=30000, read_only=True
        )
        assert seen.exit_code == 0 and seen.stdout.startswith(f"{n}\nh\n"), seen
        for other in workspaces:
            if other != run.workspace_id:
                assert other not in seen.stdout, seen.stdout
        assert str(home) not in seen.stdout and str(runner) not in seen.stdout, seen.stdout
    stop_server(home)
    left = _home_lines(home)
    assert not left, left


async def test_kill9_of_the_runner_daemon_with_detached_sandboxes_then_adoption(
    tmp_path: Path, quiet: None, request: pytest.FixtureRequest
) -> None:
    """Held (E11, R3 under R2 tenants): a runner daemon (its own process, a root
    ``LocalRunner``) is killed with SIGKILL while five workspaces each run a detached
    sandbox that writes after the kill; the restarted daemon adopts them: each ends with exit
    0 and its files are in its next commit, the agent's sandbox saw (after the restart)
    nothing of another workspace and no host path, its launcher's table held none of the
    others' mounts, and a clean stop leaves no mount of the runner's folder."""
    root = tmp_path / "daemon"
    request.addfinalizer(lambda: remove_home(root))
    daemon = await start_daemon(root, SandboxPolicy(), subprocess=True)
    try:
        runner = daemon.runner
        workspaces = [eid(f"d{i}") for i in range(5)]
        script = (
            "sleep 3; echo {n} > after.txt; echo h > ~/h.txt; "
            "cat /proc/self/mountinfo > seen.txt; ls -a / /workspace > ls.txt"
        )
        for n, workspace in enumerate(workspaces):  # the last spawn sees four busy ones
            await runner.ensure_workspace(workspace)
            await runner.start(StartRequest(execution_id=eid(f"dx{n}"), workspace_id=workspace,
                                            command=script.format(n=n)))  # fmt: skip
        real = os.path.realpath(root)
        below = points_below(await _monitor_table(workspaces[-1], real), real)
        assert not {p for p in below for w in workspaces[:-1] if p.endswith("/" + w)}, below
        daemon.kill()
        await daemon.restart()
        for n, workspace in enumerate(workspaces):
            record = await ended(runner, eid(f"dx{n}"))
            assert record.exit_code == 0, record
            await runner.commit(workspace)
            files = {}
            for name in ("after.txt", "seen.txt", "ls.txt"):
                chunk = await runner.read_file(workspace, None, name, 0, 1 << 20)
                files[name] = chunk.data.decode()
            assert files["after.txt"] == f"{n}\n", files
            seen = files["seen.txt"] + files["ls.txt"]
            assert str(root) not in seen and real not in seen, seen
            assert not [w for w in workspaces if w != workspace and w in seen], seen
    finally:
        await daemon.stop()
    left = [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if str(root) in line or os.path.realpath(root) in line]  # fmt: skip
    assert not left, left
