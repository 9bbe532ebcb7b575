"""The OpenAI Agents SDK's ``ShellTool`` backed by shellyard (S1).

``shellyard_shell_tool(client)`` is a ready ``ShellTool``; ``shellyard_shell_executor(client)``
is the executor alone. The SDK hands the executor a ``ShellCommandRequest``; it is turned into
a ``shell_call`` item, run by ``run_shell_call``, and the ``shell_call_output`` item comes back
as the SDK's ``ShellResult``. The ``agents`` package (the ``agents`` extra) is imported only
when a tool is built, so shellyard works without it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from shellyard.sdk.client import AsyncClient
from shellyard.shell_call.adapter import run_shell_call

if TYPE_CHECKING:
    from agents import ShellCallData, ShellCommandRequest, ShellResult, ShellTool

ShellExecutor = Callable[["ShellCommandRequest"], Awaitable["ShellResult"]]


def _require_agents() -> None:
    try:
        import agents  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "the OpenAI Agents SDK is not installed; install it with "
            "pip install 'shellyard[agents]' (the openai-agents package)"
        ) from exc


def _field(raw: Any, name: str) -> Any:
    value = raw.get(name) if isinstance(raw, Mapping) else getattr(raw, name, None)
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else value


def shell_call_item(
    data: ShellCallData, environment: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The ``shell_call`` item of the SDK's normalised call data. The environment is the
    given one, else the one on the model's raw item, else none (the local workspace)."""
    action: dict[str, Any] = {"commands": list(data.action.commands)}
    if data.action.timeout_ms is not None:
        action["timeout_ms"] = data.action.timeout_ms
    if data.action.max_output_length is not None:
        action["max_output_length"] = data.action.max_output_length
    item: dict[str, Any] = {"type": "shell_call", "call_id": data.call_id, "action": action}
    chosen = environment if environment is not None else _field(data.raw, "environment")
    if chosen is not None:
        item["environment"] = dict(chosen)
    return item


def shellyard_shell_executor(
    client: AsyncClient, *, environment: Mapping[str, Any] | None = None
) -> ShellExecutor:
    """The executor ``ShellTool`` wants. ``environment`` pins every call to one place
    (``{"type": "container_reference", "container_id": RUNNER_OR_WORKSPACE_ID}``)."""
    _require_agents()

    async def execute(request: ShellCommandRequest) -> ShellResult:
        from agents import ShellCallOutcome, ShellCommandOutput, ShellResult

        commands = list(request.data.action.commands)
        result = await run_shell_call(shell_call_item(request.data, environment), client)
        return ShellResult(
            output=[
                ShellCommandOutput(
                    stdout=entry["stdout"],
                    stderr=entry["stderr"],
                    outcome=ShellCallOutcome(
                        type=entry["outcome"]["type"],
                        exit_code=entry["outcome"].get("exit_code"),
                    ),
                    command=commands[index],
                )
                for index, entry in enumerate(result["output"])
            ],
            max_output_length=result.get("max_output_length"),
        )

    return execute


def shellyard_shell_tool(
    client: AsyncClient,
    *,
    environment: Mapping[str, Any] | None = None,
    **options: Any,
) -> ShellTool:
    """A ``ShellTool`` whose commands run in the client's agent's shellyard workspace.
    ``options`` go to ``ShellTool`` (``name``, ``needs_approval``, ...)."""
    _require_agents()
    from agents import ShellTool

    return ShellTool(executor=shellyard_shell_executor(client, environment=environment), **options)
