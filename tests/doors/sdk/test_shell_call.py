"""S1: the ``shell_call`` adapter against a real ``shellyard serve`` process, through the async
REST client, the ``shellyard shell-call`` verb, and the OpenAI Agents SDK's own tool loop.
Every test asserts the exact ``shell_call_output`` item."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import make_home
from shellyard.errors import InvalidInput, NotFound
from shellyard.home import ServerInfo, ensure_server, is_served, read_info
from shellyard.sdk.client import AsyncClient, Client
from shellyard.shell_call.adapter import run_shell_call


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Path, ServerInfo]]:
    """One server for the module (starting one per test would dominate the run time)."""
    home = make_home()
    info = ensure_server(home)
    yield home, info
    stop_server(home)


def stop_server(home: Path) -> None:
    current = read_info(home)
    if current is not None and is_served(home):
        os.kill(current.pid, signal.SIGTERM)
        for _ in range(200):  # let it close its database before the folder goes
            if not is_served(home):
                break
            time.sleep(0.05)
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
async def client(served: tuple[Path, ServerInfo]) -> AsyncIterator[AsyncClient]:
    _home, info = served
    async_client = AsyncClient(info.url, info.token)
    yield async_client
    await async_client.aclose()


@pytest.fixture
def sync_client(served: tuple[Path, ServerInfo]) -> Iterator[Client]:
    _home, info = served
    with Client(info.url, info.token) as sync:
        yield sync


def shell_call(call_id: str, *commands: str, **action: Any) -> dict[str, Any]:
    return {
        "type": "shell_call",
        "call_id": call_id,
        "action": {"commands": list(commands), **action},
    }


def exited(stdout: str, code: int = 0, stderr: str = "") -> dict[str, Any]:
    return {"stdout": stdout, "stderr": stderr, "outcome": {"type": "exit", "exit_code": code}}


def tag() -> str:
    """A word that makes a test's commands unique in the shared server's execution list."""
    return uuid.uuid4().hex[:10]


async def test_a_timeout_cancels_the_command_and_skips_the_rest(
    client: AsyncClient, sync_client: Client
) -> None:
    """S1, E5, E7: timeout_ms cancels the command, reports {type: timeout} with the output it
    had produced, and the remaining commands never run; status is incomplete."""
    word = tag()
    first, second = f"echo started-{word}; sleep 30", f"echo never-{word}"
    item = shell_call("call_timeout", first, second, timeout_ms=1500)
    assert await run_shell_call(item, client) == {
        "type": "shell_call_output",
        "call_id": "call_timeout",
        "output": [
            {"stdout": f"started-{word}\n", "stderr": "", "outcome": {"type": "timeout"}},
        ],
        "status": "incomplete",
    }
    commands = {view.command: view for view in sync_client.list(limit=1000)}
    assert second not in commands  # never submitted
    view = sync_client.status(commands[first].execution_id)
    assert view.state == "cancelled"
    assert view.exit_code is None


async def test_commands_that_end_in_time_report_their_exit_codes(client: AsyncClient) -> None:
    """S1: each command's own exit code and streams; a failing command does not stop the
    next; status completed when every command ran."""
    item = shell_call("call_exit", "echo out; echo err >&2; exit 3", "echo next", timeout_ms=20_000)
    assert await run_shell_call(item, client) == {
        "type": "shell_call_output",
        "call_id": "call_exit",
        "output": [exited("out\n", 3, "err\n"), exited("next\n")],
        "status": "completed",
    }


async def test_output_over_the_limit_keeps_head_and_tail_with_a_marker(
    client: AsyncClient,
) -> None:
    """S1: `seq 1 100` prints 292 characters; with max_output_length 100 the output is the
    first 33 and last 33 characters around a 34-character marker (100 in all)."""
    full = "".join(f"{n}\n" for n in range(1, 101))
    assert len(full) == 292
    item = shell_call("call_cap", "seq 1 100", max_output_length=100)
    result = await run_shell_call(item, client)
    marker = "\n[... 226 characters omitted ...]\n"
    assert result == {
        "type": "shell_call_output",
        "call_id": "call_cap",
        "output": [exited(full[:33] + marker + full[-33:])],
        "status": "completed",
        "max_output_length": 100,
    }
    assert len(result["output"][0]["stdout"]) == 100


async def test_the_limit_covers_all_commands_and_both_streams_together(
    client: AsyncClient,
) -> None:
    """S1: 60 a's (command 1), 60 b's and 20 c's on stderr (command 2) are 140 characters in
    one stream; with 100 kept: 33 head, a 33-character marker, 34 tail."""
    item = shell_call(
        "call_cap_two",
        "printf 'a%.0s' $(seq 1 60)",
        "printf 'b%.0s' $(seq 1 60); printf 'c%.0s' $(seq 1 20) >&2",
        max_output_length=100,
    )
    assert await run_shell_call(item, client) == {
        "type": "shell_call_output",
        "call_id": "call_cap_two",
        "output": [
            exited("a" * 33 + "\n[... 73 characters omitted ...]\n"),
            exited("b" * 14, 0, "c" * 20),
        ],
        "status": "completed",
        "max_output_length": 100,
    }


async def test_the_limit_counts_characters_not_bytes(client: AsyncClient) -> None:
    """S1: 150 'é' (300 bytes) are 150 characters: 33 + marker + 34 of them are kept."""
    item = shell_call("call_utf8", "printf 'é%.0s' $(seq 1 150)", max_output_length=100)
    assert await run_shell_call(item, client) == {
        "type": "shell_call_output",
        "call_id": "call_utf8",
        "output": [exited("é" * 33 + "\n[... 83 characters omitted ...]\n" + "é" * 34)],
        "status": "completed",
        "max_output_length": 100,
    }


@pytest.mark.parametrize("length", [0, 65])
async def test_call_id_outside_1_to_64_characters_is_refused(
    client: AsyncClient, length: int
) -> None:
    """S1: call_id of 0 or 65 characters is refused with a message naming the field."""
    with pytest.raises(InvalidInput) as refused:
        await run_shell_call(shell_call("x" * length, "echo hi"), client)
    assert refused.value.message == (
        f"malformed shell_call item: call_id: must be 1 to 64 characters long (got {length}) "
        "(allowed: a string of 1 to 64 characters)"
    )


@pytest.mark.parametrize("length", [1, 64])
async def test_call_id_of_1_and_64_characters_is_accepted(client: AsyncClient, length: int) -> None:
    """S1: the bounds themselves are valid and echoed."""
    call_id = "c" * length
    assert await run_shell_call(shell_call(call_id, "echo hi"), client) == {
        "type": "shell_call_output",
        "call_id": call_id,
        "output": [exited("hi\n")],
        "status": "completed",
    }


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (
            {"action": {"commands": "ls"}},
            "action.commands: Input should be a valid list (allowed: a non-empty list of "
            "strings, one shell command each)",
        ),
        (
            {"action": {"commands": ["ls"], "timeout_ms": "500"}},
            "action.timeout_ms: Input should be a valid integer (allowed: a positive integer "
            "number of milliseconds, or absent)",
        ),
        (
            {"action": {"commands": ["ls"], "max_output_length": 0}},
            "action.max_output_length: Input should be greater than 0 (allowed: a positive "
            "integer number of characters, or absent)",
        ),
        ({"type": "function_call"}, "type: Input should be 'shell_call'"),
        (
            {"call_id": 7},
            "call_id: Input should be a valid string (allowed: a string of 1 to 64 characters)",
        ),
        (
            {"surprise": 1},
            "surprise: is not a field of a shell_call item here (allowed: type, call_id, "
            "action, environment, id, status, agent, caller, created_by)",
        ),
    ],
)
async def test_wrong_types_are_refused_naming_the_field(
    client: AsyncClient, change: dict[str, Any], problem: str
) -> None:
    """S1: a malformed item is refused with a clear error; nothing runs."""
    item = {**shell_call("call_bad", "echo hi"), **change}
    with pytest.raises(InvalidInput) as refused:
        await run_shell_call(item, client)
    assert refused.value.message == f"malformed shell_call item: {problem}"


async def test_optional_fields_of_the_item_are_accepted_and_caller_is_echoed(
    client: AsyncClient,
) -> None:
    """Seed 003: id, status, agent, caller and a local environment with skills are allowed;
    the caller is echoed on the output item (as the Responses API pairs them)."""
    item = {
        **shell_call("call_full", "echo full"),
        "id": "sh_1",
        "status": "in_progress",
        "agent": {"agent_name": "coder"},
        "caller": {"type": "program", "caller_id": "prog_1"},
        "environment": {
            "type": "local",
            "skills": [{"description": "d", "name": "n", "path": "skills/n"}],
        },
    }
    assert await run_shell_call(item, client) == {
        "type": "shell_call_output",
        "call_id": "call_full",
        "output": [exited("full\n")],
        "status": "completed",
        "caller": {"type": "program", "caller_id": "prog_1"},
    }


async def test_container_reference_names_a_runner_or_the_agents_workspace(
    client: AsyncClient,
) -> None:
    """S1: container_id may name a registered runner (`local`) or one of the agent's own
    workspace ids; an unknown id is refused, naming what exists."""
    by_runner = {
        **shell_call("call_runner", "echo via-runner"),
        "environment": {"type": "container_reference", "container_id": "local"},
    }
    assert await run_shell_call(by_runner, client) == {
        "type": "shell_call_output",
        "call_id": "call_runner",
        "output": [exited("via-runner\n")],
        "status": "completed",
    }
    own = [w for w in await client.workspaces() if w.relation == "own"]
    assert [w.runner_id for w in own] == ["local"]
    workspace_id = own[0].workspace_id
    by_workspace = {
        **shell_call("call_workspace", "echo via-workspace"),
        "environment": {"type": "container_reference", "container_id": workspace_id},
    }
    assert await run_shell_call(by_workspace, client) == {
        "type": "shell_call_output",
        "call_id": "call_workspace",
        "output": [exited("via-workspace\n")],
        "status": "completed",
    }
    unknown = {
        **shell_call("call_unknown", "echo never"),
        "environment": {"type": "container_reference", "container_id": "cntr_nope"},
    }
    with pytest.raises(NotFound) as refused:
        await run_shell_call(unknown, client)
    assert refused.value.message == (
        "environment.container_id 'cntr_nope' names no runner and none of this agent's "
        f"workspaces. Runners: local; the agent's workspaces: {workspace_id}. Use one of "
        "them, or environment {type: 'local'} for the agent's workspace on the local runner"
    )


async def test_commands_run_in_order_in_one_workspace_without_shell_state(
    client: AsyncClient,
) -> None:
    """S1, E2: files persist from one command to the next (same workspace); the working
    directory and exported variables do not (each command is a fresh execution)."""
    root = (await client.run("pwd")).stdout
    name = f"f-{tag()}"
    item = shell_call(
        "call_order",
        f"echo a > {name}",
        f"cat {name}",
        "cd /tmp && pwd",
        "pwd",
        "export X=1",
        "echo ${X:-unset}",
    )
    assert await run_shell_call(item, client) == {
        "type": "shell_call_output",
        "call_id": "call_order",
        "output": [
            exited(""),
            exited("a\n"),
            exited("/tmp\n"),
            exited(root),
            exited(""),
            exited("unset\n"),
        ],
        "status": "completed",
    }


def shell_call_cli(home: Path, stdin: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shellyard", "shell-call", "--home", str(home)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_cli_prints_the_output_item_as_json(served: tuple[Path, ServerInfo]) -> None:
    """S1 through `shellyard shell-call`: the item on stdin, the output item on stdout."""
    home, _info = served
    item = shell_call("call_cli", "echo from-cli; exit 4", max_output_length=1000)
    done = shell_call_cli(home, json.dumps(item))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "type": "shell_call_output",
        "call_id": "call_cli",
        "output": [exited("from-cli\n", 4)],
        "status": "completed",
        "max_output_length": 1000,
    }


def test_the_cli_refuses_bad_input_as_json_with_exit_code_2(
    served: tuple[Path, ServerInfo],
) -> None:
    """Bad JSON and a malformed item: the error as JSON on stderr, nothing on stdout, exit 2."""
    home, _info = served
    done = shell_call_cli(home, "{not json")
    assert done.returncode == 2
    assert done.stdout == ""
    error = json.loads(done.stderr)["error"]
    assert error["code"] == "invalid_input"
    assert error["message"].startswith("stdin is not JSON (")
    assert error["message"].endswith("); give one shell_call item as a JSON object")
    done = shell_call_cli(home, json.dumps(shell_call("x" * 65, "echo hi")))
    assert done.returncode == 2
    assert json.loads(done.stderr) == {
        "error": {
            "code": "invalid_input",
            "message": "malformed shell_call item: call_id: must be 1 to 64 characters long "
            "(got 65) (allowed: a string of 1 to 64 characters)",
        }
    }


class ScriptedModel:
    """An Agents SDK model with no network: the first turn asks for one shell_call, the
    second records what the SDK sends back and answers with a message."""

    def __init__(self, call: dict[str, Any]) -> None:
        self.call = call
        self.inputs: list[Any] = []

    def build(self) -> Any:
        from agents.items import ModelResponse
        from agents.models.interface import Model
        from agents.usage import Usage
        from openai.types.responses import ResponseOutputMessage, ResponseOutputText
        from openai.types.responses.response_function_shell_tool_call import (
            ResponseFunctionShellToolCall,
        )

        script = self

        class _Model(Model):
            async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
                script.inputs.append(kwargs.get("input", args[1] if len(args) > 1 else None))
                if len(script.inputs) == 1:
                    item = ResponseFunctionShellToolCall.model_validate(script.call)
                else:
                    item = ResponseOutputMessage(  # type: ignore[assignment]
                        id="msg_1",
                        type="message",
                        role="assistant",
                        status="completed",
                        content=[
                            ResponseOutputText(type="output_text", text="done", annotations=[])
                        ],
                    )
                return ModelResponse(output=[item], usage=Usage(), response_id=None)

            def stream_response(self, *args: Any, **kwargs: Any) -> Any:
                raise NotImplementedError

        return _Model()


async def test_the_agents_sdk_runs_our_shell_tool_through_its_own_loop(
    client: AsyncClient,
) -> None:
    """S1: the real Agents SDK runner (a scripted model, no network) invokes the ShellTool
    executor the way it does for a model's shell_call; the shell_call_output item it sends
    back to the model carries our output: the timeout stopped the second command."""
    from agents import Agent, RunConfig, Runner

    from shellyard.shell_call.agents import shellyard_shell_tool

    word = tag()
    script = ScriptedModel(
        {
            "type": "shell_call",
            "id": "sh_sdk",
            "call_id": "call_sdk",
            "status": "completed",
            "action": {
                "commands": [f"echo sdk-{word}; echo warn >&2", f"echo late-{word}; sleep 30"],
                "timeout_ms": 1500,
                "max_output_length": 1000,
            },
            "environment": {"type": "local"},
        }
    )
    agent = Agent(name="coder", tools=[shellyard_shell_tool(client)])
    result = await Runner.run(
        agent,
        "list the files",
        run_config=RunConfig(model=script.build(), tracing_disabled=True),
    )
    assert result.final_output == "done"
    sent_back = [
        entry
        for entry in script.inputs[1]
        if isinstance(entry, dict) and entry.get("type") == "shell_call_output"
    ]
    assert sent_back == [
        {
            "type": "shell_call_output",
            "call_id": "call_sdk",
            "output": [
                exited(f"sdk-{word}\n", 0, "warn\n"),
                {"stdout": f"late-{word}\n", "stderr": "", "outcome": {"type": "timeout"}},
            ],
            # The SDK sends no status back to the model (its own raw item says "completed"
            # for any executor that returned); the timeout outcome carries the news.
            "max_output_length": 1000,
        }
    ]


async def test_the_executor_takes_the_sdks_request_and_returns_its_result_types(
    client: AsyncClient,
) -> None:
    """S1: the executor called with the request object the SDK builds (ShellCommandRequest
    around coerce_shell_call's data), pinned to a container_reference; the SDK's types come
    back."""
    from agents import RunContextWrapper, ShellCallOutcome, ShellCommandOutput, ShellResult
    from agents.run_internal.tool_execution import coerce_shell_call
    from agents.tool import ShellCommandRequest

    from shellyard.shell_call.agents import shellyard_shell_executor

    executor = shellyard_shell_executor(
        client, environment={"type": "container_reference", "container_id": "local"}
    )
    raw = shell_call("call_exec", "echo one", "echo two >&2; exit 1", max_output_length=50)
    request = ShellCommandRequest(ctx_wrapper=RunContextWrapper(None), data=coerce_shell_call(raw))
    assert await executor(request) == ShellResult(
        output=[
            ShellCommandOutput("one\n", "", ShellCallOutcome("exit", 0), "echo one"),
            ShellCommandOutput("", "two\n", ShellCallOutcome("exit", 1), "echo two >&2; exit 1"),
        ],
        max_output_length=50,
    )


async def test_container_reference_reaches_a_remote_runner_and_its_workspace() -> None:
    """S1, R1: container_id naming a registered runner daemon runs there; naming the agent's
    workspace on that runner runs there too (the workspace decides the runner)."""
    from runner_daemon_fixture import running_daemon

    home = make_home()
    info = ensure_server(home)
    try:
        async with running_daemon(home / "remote-root") as daemon:
            registered = await asyncio.to_thread(
                httpx.post,
                f"{info.url}/v1/runners",
                headers={"Authorization": f"Bearer {info.token}"},
                json={"runner_id": "far", "address": daemon.url, "token": daemon.token},
            )
            assert registered.status_code == 200, registered.text
            client = AsyncClient(info.url, info.token)
            by_runner = {
                **shell_call("call_far", "echo far-runner"),
                "environment": {"type": "container_reference", "container_id": "far"},
            }
            assert (await run_shell_call(by_runner, client))["output"] == [exited("far-runner\n")]
            far = [w for w in await client.workspaces() if w.runner_id == "far"]
            assert len(far) == 1
            by_workspace = {
                **shell_call("call_far_ws", "echo far-workspace"),
                "environment": {
                    "type": "container_reference",
                    "container_id": far[0].workspace_id,
                },
            }
            assert await run_shell_call(by_workspace, client) == {
                "type": "shell_call_output",
                "call_id": "call_far_ws",
                "output": [exited("far-workspace\n")],
                "status": "completed",
            }
            ran = {v.command: v.runner_id for v in await asyncio.to_thread(_list, info)}
            assert ran["echo far-runner"] == ran["echo far-workspace"] == "far"
            await client.aclose()
    finally:
        stop_server(home)


def _list(info: ServerInfo) -> list[Any]:
    with Client(info.url, info.token) as sync:
        return sync.list(limit=100)


async def test_items_are_the_openai_packages_shapes(client: AsyncClient) -> None:
    """S1: an item the openai package produces (its model, with every optional field) is
    accepted as is, and our output item validates as its shell_call_output type."""
    from openai.types.responses.response_function_shell_tool_call import (
        ResponseFunctionShellToolCall,
    )
    from openai.types.responses.response_function_shell_tool_call_output import (
        ResponseFunctionShellToolCallOutput,
    )

    produced = ResponseFunctionShellToolCall.model_validate(
        {
            "type": "shell_call",
            "id": "sh_openai",
            "call_id": "call_openai",
            "status": "completed",
            "action": {"commands": ["echo typed"], "timeout_ms": 20_000, "max_output_length": 64},
            "environment": {"type": "container_reference", "container_id": "local"},
            "caller": {"type": "direct"},
            "created_by": "model",
        }
    )
    result = await run_shell_call(produced, client)
    assert result == {
        "type": "shell_call_output",
        "call_id": "call_openai",
        "output": [exited("typed\n")],
        "status": "completed",
        "max_output_length": 64,
        "caller": {"type": "direct"},
    }
    typed = ResponseFunctionShellToolCallOutput.model_validate({**result, "id": "out_1"})
    assert typed.output[0].outcome.type == "exit"
