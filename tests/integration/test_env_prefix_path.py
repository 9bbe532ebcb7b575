"""V4, R2 (docs/security.md "Host paths"): an environment's prefix is seen at /env in every
sandbox that uses it, so no host path of the home shows inside: not in /proc/self/mountinfo,
$PATH, /proc/1/cmdline, a console script's shebang, conda's relocated files, nor anywhere in
the prefix's files. An environment built before (its files name its host path, no
``built-at`` beside it) keeps being bound at that path, and still runs.

Real components only: a LocalRunner with bubblewrap, uv, py-rattler and a local conda channel
and wheels built here, named by the agent as /workspace folders.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from conda_channel import CondaPackage, PackageFile, build_test_channel_sync, script
from env_fixtures import make_wheel

from conftest import make_home
from shellyard.errors import Conflict
from shellyard.runner.environments import seen
from shellyard.runner.local import LocalRunner
from shellyard.runner.protocol import (
    EnvChangeState,
    EnvironmentChange,
    EnvironmentChangeRequest,
    RunnerExecState,
    StartRequest,
)

CHANGE_TIMEOUT_S = 180.0
#: A placeholder as long as conda wants (longer than any prefix it is replaced with).
PLACEHOLDER = "/opt/shellyard-placeholder-prefix-" + "p" * 60


@pytest.fixture
def home() -> Iterator[Path]:
    folder = make_home()
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
async def runner(home: Path) -> AsyncIterator[LocalRunner]:
    r = LocalRunner(home / "runner")
    await r.startup()
    await r.ensure_workspace("ws")
    yield r
    await r.aclose()


async def change(runner: LocalRunner, **fields: object) -> EnvironmentChange:
    request = EnvironmentChangeRequest.model_validate({"workspace_id": "ws", **fields})
    await runner.environment_change(request)
    done = await runner.environment_change_wait(request.change_id, CHANGE_TIMEOUT_S)
    assert done.state == EnvChangeState.succeeded, done.error
    return done


async def run(runner: LocalRunner, execution_id: str, command: str, **env: str) -> str:
    request = StartRequest(
        execution_id=execution_id, workspace_id="ws", command=command, environment_id="env1",
        env=env,
    )  # fmt: skip
    await runner.start(request)
    result = await runner.wait(execution_id, 120)
    assert result.state == RunnerExecState.finished, result
    out = (await runner.read_log(execution_id, "stdout", 0, 1 << 20)).data.decode()
    err = (await runner.read_log(execution_id, "stderr", 0, 1 << 20)).data.decode()
    assert result.exit_code == 0, (out, err)
    return out


def tool_wheel(folder: Path) -> None:
    """``sy-tool`` with a console script ``sy-tool`` (its shebang names the interpreter)."""
    make_wheel(
        folder, "sy-tool", "1.0",
        modules={
            "sy_tool.py": "def main():\n    print('sy-tool ran')\n",
            "sy_tool-1.0.dist-info/entry_points.txt": "[console_scripts]\nsy-tool = sy_tool:main\n",
        },
    )  # fmt: skip


def conda_channel(folder: Path) -> None:
    build_test_channel_sync(
        folder,
        [
            CondaPackage("sy-hello", "1.0", {"bin/sy-hello": script("echo hello from conda")}),
            CondaPackage(
                "sy-placed",
                "1.0",
                {
                    "etc/sy-placed.conf": PackageFile(
                        f"prefix={PLACEHOLDER}\n".encode(), prefix_placeholder=PLACEHOLDER
                    )
                },
            ),
        ],
    )


def files_naming(prefix: Path, needles: set[str]) -> list[str]:
    """``grep -rl`` of each needle over the prefix (no link followed)."""
    found = []
    for folder, _dirs, names in os.walk(prefix):
        for name in names:
            path = Path(folder, name)
            if path.is_symlink():
                if any(n in os.readlink(path) for n in needles):
                    found.append(str(path))
                continue
            data = path.read_bytes()
            if any(n.encode() in data for n in needles):
                found.append(str(path))
    return found


async def test_an_environment_shows_no_host_path_of_the_home(
    runner: LocalRunner, home: Path
) -> None:
    """V4, R2: a python environment with a pip package that has a console script, and conda
    packages (a script, a file whose prefix placeholder conda replaces) in it: inside the
    command neither mountinfo (the prefix is an overlay of its own), PATH, pid 1's command line, the
    script's shebang, conda's file nor any file of the prefix names the home; the package
    imports and both scripts run. On the host, no file of the prefix names the home either."""
    workspace = runner.workspace_path("ws")
    tool_wheel(workspace / "wheels")
    conda_channel(workspace / "chan")
    await change(runner, change_id="c", environment_id="env1", action="create", language="python")
    await change(
        runner, change_id="i1", environment_id="env1", action="install", manager="pip",
        specs=["sy-tool"], index_url="none", find_links=["/workspace/wheels"],
    )  # fmt: skip
    await change(
        runner, change_id="i2", environment_id="env1", action="install", manager="conda",
        specs=["sy-hello", "sy-placed"], channels=["/workspace/chan"],
    )  # fmt: skip
    info = await runner.environment_info("env1")
    prefix = Path(info.prefix)
    needles = {str(home), str(home.resolve())}
    script_text = (
        'cat /proc/self/mountinfo /proc/self/mounts; echo "PATH=$PATH"; '
        'tr "\\0" " " </proc/1/cmdline; echo; '
        'head -1 "$(command -v sy-tool)"; cat /env/etc/sy-placed.conf; '
        'echo "GREP=$(grep -rl "$SY_HOME" /env; grep -rl "$SY_REAL" /env)"; '
        "python -c 'import sy_tool, sys; print(sys.prefix)'; sy-tool; sy-hello"
    )
    out = await run(runner, "x1", script_text, SY_HOME=str(home), SY_REAL=str(home.resolve()))
    leaks = [line for line in out.splitlines() if any(n in line for n in needles)]
    assert leaks == []
    # R2: a root runner binds an overlay of the prefix (runner/prefix_mounts.py): its root is
    # "/", its layers descriptors (field 4, and the options after " - ")
    (line,) = [line for line in out.splitlines() if line.split()[4:5] == ["/env"]]
    assert line.split()[3] == "/" and " - overlay overlay ro,lowerdir=/proc/self/fd/" in line
    assert "#!/env/bin/python" in out
    assert "prefix=/env\n" in out  # conda replaced its placeholder with /env
    assert "GREP=\n" in out
    assert "\n/env\nsy-tool ran\nhello from conda\n" in out
    assert " /env " in out  # mountinfo: the prefix's mount point
    assert "PATH=/env/bin:" in out
    assert files_naming(prefix, needles) == []
    assert info.mounted_at == "/env" and info.env["CONDA_PREFIX"] == "/env"
    assert (prefix.parent / seen.BUILT_AT).read_text() == "/env\n"


async def test_an_environment_built_before_keeps_its_host_path(runner: LocalRunner) -> None:
    """V4 compatibility: a prefix without ``built-at`` (built before, its scripts naming its
    host path) is bound at that path, in commands and in its package tools: it still runs
    ``python -c 1`` and its console script, and a later install still works."""
    workspace = runner.workspace_path("ws")
    tool_wheel(workspace / "wheels")
    await change(runner, change_id="c", environment_id="env1", action="create", language="python")
    await change(
        runner, change_id="i1", environment_id="env1", action="install", manager="pip",
        specs=["sy-tool"], index_url="none", find_links=["/workspace/wheels"],
    )  # fmt: skip
    prefix = Path((await runner.environment_info("env1")).prefix)
    # what an older runner left: no record, every script naming the host path
    (prefix.parent / seen.BUILT_AT).unlink()
    for path in (prefix / "bin").iterdir():
        if path.is_file() and not path.is_symlink() and path.stat().st_size < 1 << 20:
            data = path.read_bytes()
            if data.startswith(b"#!/env/"):
                path.write_bytes(data.replace(b"#!/env/", f"#!{prefix}/".encode(), 1))
    info = await runner.environment_info("env1")
    assert info.mounted_at == str(prefix) and info.env["VIRTUAL_ENV"] == str(prefix)
    out = await run(
        runner, "x1", "python -c 1 && sy-tool && python -c 'import sys; print(sys.prefix)'"
    )
    assert out == f"sy-tool ran\n{prefix}\n"
    make_wheel(workspace / "wheels", "sy-more", "1.0")
    await change(
        runner, change_id="i2", environment_id="env1", action="install", manager="pip",
        specs=["sy-more"], index_url="none", find_links=["/workspace/wheels"],
    )  # fmt: skip
    out = await run(
        runner, "x2", "python -c 'import sy_more; print(sy_more.VERSION)'; pip --version"
    )
    assert out.startswith("1.0\n") and str(prefix) in out


async def test_every_door_shows_the_prefix_where_commands_see_it(served_home: Path) -> None:
    """V4 (contract: ``prefix`` is where the prefix is mounted inside commands): REST (the
    SDK), the CLI's ``env show`` (text and --json) and MCP's ``environment_show`` all show
    /env, no host path; the host prefix is the runner's (``EnvironmentStore.prefix``)."""
    import asyncio
    import json

    from env_fixtures import host_prefix

    from conftest import sy
    from shellyard.home import read_info
    from shellyard.mcp.server import build_server
    from shellyard.sdk.client import AsyncClient, Client

    client = Client.for_home(served_home)
    created = client.environment_create("main", wait_ms=30_000)
    assert created.state == "ready", created
    environment_id = created.environment_id
    assert client.environment_show(environment_id).prefix == "/env"
    text = await asyncio.to_thread(sy, served_home, "env", "show", environment_id)
    assert text.returncode == 0, text.stderr
    assert "prefix: /env\n" in text.stdout and str(served_home) not in text.stdout
    shown = await asyncio.to_thread(sy, served_home, "env", "show", environment_id, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["prefix"] == "/env"
    info = read_info(served_home)
    assert info is not None
    backend = AsyncClient(info.url, info.token)
    try:
        result = await build_server(backend).call_tool(
            "environment_show", {"environment_id": environment_id}
        )
        assert not getattr(result, "is_error", False), result
        answer = json.dumps(getattr(result, "structured_content", None) or str(result))
        assert '"prefix": "/env"' in answer and str(served_home) not in answer, answer
    finally:
        await backend.aclose()
    prefix = host_prefix(served_home / "runners" / "local", environment_id)
    assert (prefix / "bin" / "python").exists()


async def test_a_command_after_an_install_sees_the_new_package(runner: LocalRunner) -> None:
    """V5, V6 through the prefix's own overlay (runner/prefix_mounts.py): a command's
    lookups of a missing module are cached by the overlay it binds, kept mounted after it
    (kept here for the whole test); an install requested while a command runs is refused
    (V5: the control plane queues it), and a command started after the install sees the new
    package: it binds a new overlay of the changed prefix, not the stale one."""
    runner._prefixes.linger_s = 3600.0  # the overlay of the first command stays mounted
    workspace = runner.workspace_path("ws")
    tool_wheel(workspace / "wheels")
    make_wheel(workspace / "wheels", "sy-more", "1.0")
    await change(runner, change_id="c", environment_id="env1", action="create", language="python")
    # each name looked up while missing: a negative entry in the overlay's cache
    missing = (
        "python -c 'import sy_more' 2>/dev/null || echo missing; ls /env/bin | grep -c sy- || :; "
        "test -e /env/bin/sy-tool || echo no-tool; cat /env/bin/sy-tool 2>/dev/null || :"
    )
    assert await run(runner, "x1", missing) == "missing\n0\nno-tool\n"
    await runner.start(
        StartRequest(
            execution_id="x2", workspace_id="ws", environment_id="env1",
            command=f"sleep 2; {missing}",
        )
    )  # fmt: skip
    request = EnvironmentChangeRequest.model_validate(
        {
            "workspace_id": "ws", "change_id": "i1", "environment_id": "env1",
            "action": "install", "manager": "pip", "specs": ["sy-more", "sy-tool"],
            "index_url": "none", "find_links": ["/workspace/wheels"],
        }
    )  # fmt: skip
    with pytest.raises(Conflict, match="in use by running executions x2"):
        await runner.environment_change(request)  # V5: no prefix changes under a command
    during = await runner.wait("x2", 60)
    assert during.state == RunnerExecState.finished and during.exit_code == 0
    assert (await runner.read_log("x2", "stdout", 0, 1 << 16)).data == b"missing\n0\nno-tool\n"
    await runner.environment_change(request)
    done = await runner.environment_change_wait("i1", CHANGE_TIMEOUT_S)
    assert done.state == EnvChangeState.succeeded, done.error
    after = (
        "python -c 'import sy_more; print(sy_more.VERSION)'; ls /env/bin | grep sy-; "
        "test -e /env/bin/sy-tool && /env/bin/sy-tool"
    )
    assert await run(runner, "x3", after) == "1.0\nsy-tool\nsy-tool ran\n"


#: A runner that starts a long command using env1, says where its prefix's overlay is, and
#: is then killed (SIGKILL) by the test.
KILLED_RUNNER = """
import asyncio, sys
from pathlib import Path
from shellyard.runner.local import LocalRunner
from shellyard.runner.protocol import StartRequest

async def main(root: str) -> None:
    runner = LocalRunner(Path(root))
    await runner.startup()
    await runner.start(StartRequest(
        execution_id="x1", workspace_id="ws", environment_id="env1",
        command="sleep 600",
    ))
    print(*runner._prefixes.holds(), flush=True)
    await asyncio.sleep(600)

asyncio.run(main(sys.argv[1]))
"""


def mounts_below(folder: Path) -> list[str]:
    with open("/proc/self/mountinfo") as lines:
        points = [line.split(" ")[4] for line in lines]
    return [point for point in points if point.startswith(f"{folder}/")]


async def test_a_restart_after_kill_9_leaves_no_prefix_overlay(home: Path) -> None:
    """R2: a runner killed (SIGKILL) while a command using an environment runs leaves the
    prefix's overlay mounted in the host's namespace; the restart adopts it as idle (the
    command may still be binding it) and its reaper unmounts it a linger later, while the
    command, re-attached (E11), runs on with its own copy."""
    root = home / "runner"
    first = LocalRunner(root)
    await first.startup()
    await first.ensure_workspace("ws")
    await change(first, change_id="c", environment_id="env1", action="create", language="python")
    enabled = first._prefixes.enabled  # (a stop turns it off)
    await first.aclose()
    if not enabled:
        pytest.skip("no overlays of their own on this runner (not root, or refused)")
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_RUNNER, str(root)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        point = child.stdout.readline().strip()
        assert point and mounts_below(root / "sandbox" / "prefixes") == [point]
    finally:
        child.kill()
        child.wait()
    assert mounts_below(root / "sandbox" / "prefixes") == [point]  # what kill -9 left
    again = LocalRunner(root)
    await again.startup()
    try:
        for _ in range(300):  # the reaper's round after the linger (5 s)
            if not mounts_below(root / "sandbox" / "prefixes"):
                break
            await asyncio.sleep(0.1)
        assert mounts_below(root / "sandbox" / "prefixes") == []
        status = await again.status("x1")
        assert status.state == RunnerExecState.running, status  # E11: its /env its own
        await again.ensure_workspace("ws2")  # ws is x1's
        await again.start(
            StartRequest(
                execution_id="x2", workspace_id="ws2", environment_id="env1",
                command="test -x /env/bin/python",
            )
        )  # fmt: skip
        assert (await again.wait("x2", 60)).exit_code == 0
        assert (
            len(mounts_below(root / "sandbox" / "prefixes")) == 1
        )  # mounted again for x2 (lingering)
    finally:
        await again.cancel("x1")
        await again.wait("x1", 30)
        await again.aclose()
    assert mounts_below(root / "sandbox" / "prefixes") == []
