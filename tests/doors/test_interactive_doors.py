"""E13 on every door against one real ``shellyard serve``: REST (plain HTTP), the SDK, MCP
over stdio (the official client) and the CLI (a subprocess) answer a prompt, show a
terminal's screen, refuse input to a command that did not ask for it, and keep another
session's agent out."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from conftest import sy
from shellyard.contract.executions import ExecutionState, ExecutionView
from shellyard.errors import Conflict, InvalidInput, NotFound
from shellyard.home import ensure_server, is_served, read_info
from shellyard.sdk.client import Client

PROMPT = 'read -p "name? " n; echo "hello $n"'


def settled(client: Client, execution_id: str) -> ExecutionView:
    for _ in range(4):
        view = client.wait(execution_id, 30)
        if view.state.terminal:
            return view
    raise AssertionError(f"{execution_id} did not end: {view}")


def screen_showing(client: Client, execution_id: str, text: str) -> str:
    deadline = time.monotonic() + 20
    while True:
        shown = client.screen(execution_id).text
        if text in shown or time.monotonic() > deadline:
            assert text in shown, shown
            return shown
        time.sleep(0.05)


@pytest.fixture
def served(home: Path) -> Iterator[Client]:
    client = Client.for_home(home)
    yield client
    agents = [client, *(client.as_agent(s.main_agent_id) for s in client.sessions())]
    for agent in agents:  # a failed test leaves no program waiting for input
        for view in agent.list():
            if not view.state.terminal:
                agent.cancel(view.execution_id, 20)
    info = read_info(home)
    if info is not None and is_served(home):
        os.kill(info.pid, signal.SIGTERM)


def test_rest(served: Client, home: Path) -> None:
    """E13 over REST: the run_shell fields, /input, /screen, /resize, the stdin log stream
    and the errors (a bad key, a bad size, a command that took no input)."""
    info = ensure_server(home)
    http = httpx.Client(
        base_url=info.url, headers={"Authorization": f"Bearer {info.token}"}, timeout=60
    )
    ran = http.post("/v1/executions", json={"command": PROMPT, "interactive": True}).json()
    assert ran["interactive"] is True and ran["awaiting_input"] is True, ran
    eid = ran["execution_id"]
    sent = http.post(f"/v1/executions/{eid}/input", json={"text": "rest", "keys": ["Enter"]})
    assert sent.status_code == 200 and sent.json() == {"accepted_bytes": 5}, sent.text
    assert settled(served, eid).exit_code == 0
    assert http.get(f"/v1/executions/{eid}/logs").json()["data"] == "hello rest\n"
    assert http.get(f"/v1/executions/{eid}/logs?stream=stdin").json()["data"] == "rest\n"
    late = http.post(f"/v1/executions/{eid}/input", json={"text": "x"})
    assert late.status_code == 409 and "has ended" in late.text, late.text

    body = {"command": "bash -i", "tty": True, "tty_rows": 10, "tty_cols": 50, "wait_ms": 0}
    term = http.post("/v1/executions", json=body).json()
    tid = term["execution_id"]
    assert term["tty"] is True
    bad = http.post(f"/v1/executions/{tid}/input", json={"keys": ["Hyper-q"]})
    assert bad.status_code == 400 and "unknown key" in bad.text, bad.text
    # a lone surrogate no text can hold: the body's parse says so (it was Python's codec
    # error, raised when the text was encoded for the terminal)
    lone = http.post(
        f"/v1/executions/{tid}/input",
        content=b'{"text": "\\ud800"}',
        headers={"Content-Type": "application/json"},
    )
    assert lone.status_code == 400 and "lone surrogate" in lone.text, lone.text
    http.post(f"/v1/executions/{tid}/input", json={"text": "echo $((6*7))", "keys": ["Enter"]})
    screen_showing(served, tid, "42")
    screen = http.get(f"/v1/executions/{tid}/screen").json()
    assert (screen["rows"], screen["cols"]) == (10, 50) and set(screen["cursor"]) == {"row", "col"}
    resized = http.post(f"/v1/executions/{tid}/resize", json={"rows": 12, "cols": 70}).json()
    assert (resized["rows"], resized["cols"]) == (12, 70)
    too_big = http.post(f"/v1/executions/{tid}/resize", json={"rows": 9999, "cols": 70})
    assert too_big.status_code == 400 and "tty_rows" in too_big.text, too_big.text
    http.post(f"/v1/executions/{tid}/input", json={"text": "stty size; exit 3", "keys": ["Enter"]})
    assert settled(served, tid).exit_code == 3
    assert "12 70" in http.get(f"/v1/executions/{tid}/logs").json()["data"]
    wrong = http.post("/v1/executions", json={"command": "true", "tty": True, "tty_cols": 1})
    assert wrong.status_code == 400 and "tty_cols" in wrong.text, wrong.text

    plain = http.post("/v1/executions", json={"command": "sleep 20", "wait_ms": 0}).json()
    refused = http.post(f"/v1/executions/{plain['execution_id']}/input", json={"text": "x"})
    assert refused.status_code == 409 and "did not ask for input" in refused.text
    http.post(f"/v1/executions/{plain['execution_id']}/cancel?wait_s=20")


def test_sdk(served: Client) -> None:
    """E13 in the SDK: input in parts and eof (wc -l), a terminal's screen, C-c."""
    ran = served.run("wc -l", interactive=True, wait_ms=0)
    served.input(ran.execution_id, text="a\nb\n")
    served.input(ran.execution_id, text="c", keys=["Enter"], eof=True)
    assert settled(served, ran.execution_id).exit_code == 0
    assert served.logs(ran.execution_id).data.strip() == "3"
    term = served.run("python3 -q -i", tty=True, wait_ms=0)
    screen_showing(served, term.execution_id, ">>>")
    served.input(term.execution_id, text="print(6*7)", keys=["Enter"])
    assert "42" in screen_showing(served, term.execution_id, "42").split("\n")
    served.input(term.execution_id, keys=["C-d"])
    view = settled(served, term.execution_id)
    assert view.state == ExecutionState.completed and view.exit_code == 0
    with pytest.raises(InvalidInput, match="nothing to send"):
        served.input(term.execution_id)
    sleeper = served.run("sleep 300", tty=True, wait_ms=0)
    time.sleep(0.5)
    served.input(sleeper.execution_id, keys=["C-c"])
    assert settled(served, sleeper.execution_id).exit_code == 130


def test_another_sessions_agent_is_kept_out(served: Client) -> None:
    """E13, E4: another session's agent cannot type into, or look at, an execution."""
    mine = served.create_session().main_agent_id
    theirs = served.create_session().main_agent_id
    owner = served.as_agent(mine)
    ran = owner.run("cat", tty=True, wait_ms=0)
    intruder = served.as_agent(theirs)
    with pytest.raises(NotFound):
        intruder.input(ran.execution_id, text="whoami\n")
    with pytest.raises(NotFound):
        intruder.screen(ran.execution_id)
    owner.input(ran.execution_id, text="mine", keys=["Enter", "C-d"])
    assert settled(owner, ran.execution_id).exit_code == 0
    with pytest.raises(Conflict, match="has ended"):
        owner.input(ran.execution_id, text="more")


def test_cli(served: Client, home: Path) -> None:
    """E13 in the CLI: ``shellyard input ID --text --key --eof``, and its errors."""
    ran = served.run(PROMPT, interactive=True, wait_ms=0)
    shown = sy(home, "input", ran.execution_id, "--text", "cli", "--key", "Enter")
    assert shown.returncode == 0 and "sent 4 bytes" in shown.stdout, shown
    assert settled(served, ran.execution_id).exit_code == 0
    assert served.logs(ran.execution_id).data == "hello cli\n"
    fed = served.run("wc -l", interactive=True, wait_ms=0)
    shown = sy(home, "input", fed.execution_id, "--text", "x\ny\n", "--eof", "--json")
    assert shown.returncode == 0 and '"accepted_bytes": 4' in shown.stdout, shown
    assert settled(served, fed.execution_id).exit_code == 0
    assert served.logs(fed.execution_id).data.strip() == "2"
    shown = sy(home, "logs", fed.execution_id, "--stream", "stdin")
    assert shown.returncode == 0 and shown.stdout == "x\ny\n", shown
    shown = sy(home, "input", fed.execution_id, "--text", "late")
    assert shown.returncode != 0 and "has ended" in shown.stderr, shown
    shown = sy(home, "input", fed.execution_id, "--key", "Nope")
    assert shown.returncode != 0 and "unknown key" in shown.stderr, shown


async def test_mcp_stdio(served: Client, home: Path) -> None:
    """E13 over MCP: run_shell tty, execution_input, execution_screen, the refusal."""
    main = served.create_session().main_agent_id
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "shellyard", "mcp", "--home", str(home), "--agent", main],
        env={**os.environ, "SHELLYARD_HOME": str(home)},
    )
    agent = served.as_agent(main)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as tools:
        await tools.initialize()
        result = await tools.call_tool("run_shell", {"command": PROMPT, "interactive": True})
        assert isinstance(result.structured_content, dict), result.content
        assert result.structured_content["awaiting_input"] is True, result.structured_content
        eid = result.structured_content["execution_id"]
        sent = await tools.call_tool(
            "execution_input", {"execution_id": eid, "text": "mcp", "keys": ["Enter"]}
        )
        assert sent.structured_content == {"accepted_bytes": 4}, sent.content
        assert settled(agent, eid).exit_code == 0
        assert agent.logs(eid).data == "hello mcp\n"
        result = await tools.call_tool(
            "run_shell", {"command": "python3 -q -i", "tty": True, "wait_ms": 0}
        )
        assert isinstance(result.structured_content, dict), result.content
        tid = result.structured_content["execution_id"]
        screen_showing(agent, tid, ">>>")
        await tools.call_tool(
            "execution_input", {"execution_id": tid, "text": "6*7", "keys": ["Enter"]}
        )
        screen_showing(agent, tid, "42")
        shown = await tools.call_tool("execution_screen", {"execution_id": tid})
        assert isinstance(shown.structured_content, dict), shown.content
        assert "42" in shown.structured_content["text"].split("\n")
        await tools.call_tool("execution_input", {"execution_id": tid, "eof": True})
        assert settled(agent, tid).exit_code == 0
        plain = await tools.call_tool("run_shell", {"command": "true"})
        assert isinstance(plain.structured_content, dict)
        refused = await tools.call_tool(
            "execution_input",
            {"execution_id": plain.structured_content["execution_id"], "text": "x"},
        )
        assert refused.is_error and "did not ask for input" in str(refused.content)
