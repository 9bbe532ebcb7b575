"""S1: the ``shell_call`` adapter. It takes a ``shell_call`` item (seed 003, the OpenAI
Responses shape) and returns the ``shell_call_output`` item.

Each command is a fresh execution in the agent's workspace (E2: nothing carries over), run in
order. ``timeout_ms`` applies to each command: on expiry the execution is cancelled on the
caller's behalf (E5), its outcome is ``{type: "timeout"}`` with the output it produced, and the
remaining commands are not run. ``max_output_length`` caps all output together
(``shell_call/cap.py``). Logs are read in pages, so memory stays bounded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
)

from shellyard.contract.executions import MAX_WAIT_MS, ExecutionState, ExecutionView
from shellyard.errors import InvalidInput, NotFound
from shellyard.sdk.client import AsyncClient
from shellyard.shell_call.cap import DEFAULT_CAP, MAX_CAP, OutputCap

#: control.runners.LOCAL_RUNNER_ID (not imported: that module pulls in the store).
LOCAL_RUNNER = "local"
#: The longest single wait the REST wait endpoint takes (and run_shell's wait_ms).
MAX_WAIT_S = MAX_WAIT_MS / 1000
#: Bytes asked for per log page.
PAGE_BYTES = 65_536
#: How long one cancel request waits for the sandbox to be gone (E7: grace period, then kill).
CANCEL_WAIT_S = 30.0
#: Exit codes reported for executions that did not exit on their own (as the CLI's).
EXIT_BY_STATE = {
    ExecutionState.cancelled: 130,
    ExecutionState.unknown: 124,
    ExecutionState.failed: 125,
}


def _call_id(value: str) -> str:
    if not 1 <= len(value) <= 64:
        raise ValueError(f"must be 1 to 64 characters long (got {len(value)})")
    return value


CallId = Annotated[StrictStr, AfterValidator(_call_id)]
Positive = Annotated[StrictInt, Field(gt=0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ShellCallAction(_Strict):
    commands: list[StrictStr] = Field(min_length=1)
    timeout_ms: Positive | None = None
    max_output_length: Positive | None = None


class LocalSkill(_Strict):
    description: StrictStr
    name: StrictStr
    path: StrictStr


class LocalEnvironment(_Strict):
    type: Literal["local"]
    skills: list[LocalSkill] | None = None


class ContainerReference(_Strict):
    type: Literal["container_reference"]
    container_id: Annotated[StrictStr, Field(min_length=1)]


class CallerDirect(_Strict):
    type: Literal["direct"]


class CallerProgram(_Strict):
    type: Literal["program"]
    caller_id: CallId


class AgentRef(_Strict):
    agent_name: StrictStr


class ShellCall(_Strict):
    """The ``shell_call`` item (seed 003; ``created_by`` as the openai package has it)."""

    type: Literal["shell_call"]
    call_id: CallId
    action: ShellCallAction
    environment: Annotated[
        LocalEnvironment | ContainerReference | None, Field(discriminator="type")
    ] = None
    id: StrictStr | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None
    agent: AgentRef | None = None
    caller: Annotated[CallerDirect | CallerProgram | None, Field(discriminator="type")] = None
    created_by: StrictStr | None = None


class ExitOutcome(BaseModel):
    type: Literal["exit"] = "exit"
    exit_code: int


class TimeoutOutcome(BaseModel):
    type: Literal["timeout"] = "timeout"


class ShellCallOutputContent(BaseModel):
    stdout: str
    stderr: str
    outcome: Annotated[ExitOutcome | TimeoutOutcome, Field(discriminator="type")]


class ShellCallOutput(BaseModel):
    """The ``shell_call_output`` item. ``status`` is ``completed`` when every command ran and
    ``incomplete`` when a timeout stopped the call."""

    type: Literal["shell_call_output"] = "shell_call_output"
    call_id: str
    output: list[ShellCallOutputContent]
    status: Literal["completed", "incomplete"]
    max_output_length: int | None = None
    caller: CallerDirect | CallerProgram | None = None

    def item(self) -> dict[str, Any]:
        """The JSON item; fields the call did not have are left out, not null."""
        return self.model_dump(mode="json", exclude_none=True)


_ALLOWED = {
    "call_id": "a string of 1 to 64 characters",
    "action": "an object with commands, and optional timeout_ms and max_output_length",
    "action.commands": "a non-empty list of strings, one shell command each",
    "action.timeout_ms": "a positive integer number of milliseconds, or absent",
    "action.max_output_length": "a positive integer number of characters, or absent",
    "environment": "{type: 'local', skills?} or {type: 'container_reference', container_id}",
    "id": "a string, or absent",
    "status": "'in_progress', 'completed' or 'incomplete', or absent",
    "agent": "{agent_name: string}, or absent",
    "caller": "{type: 'direct'} or {type: 'program', caller_id}, or absent",
    "created_by": "a string, or absent",
}
_FIELDS = "type, call_id, action, environment, id, status, agent, caller, created_by"


def _where(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc)


def _problem(error: Mapping[str, Any]) -> str:
    loc = tuple(error.get("loc", ()))
    where = _where(loc)
    message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    if error.get("type") == "extra_forbidden":
        parent = _where(loc[:-1])
        allowed = "commands, timeout_ms, max_output_length" if parent == "action" else _FIELDS
        return f"{where}: is not a field of a shell_call item here (allowed: {allowed})"
    key = next((k for k in (_where(loc[:2]), _where(loc[:1])) if k in _ALLOWED), None)
    hint = f" (allowed: {_ALLOWED[key]})" if key else ""
    return f"{where or 'item'}: {message}{hint}"


def parse_shell_call(item: Any) -> ShellCall:
    """Validate a ``shell_call`` item (a dict, our model, or the openai package's model)."""
    if isinstance(item, ShellCall):
        return item
    if isinstance(item, BaseModel):
        item = item.model_dump(mode="json")
    try:
        return ShellCall.model_validate(item)
    except ValidationError as exc:
        problems = "; ".join(_problem(e) for e in exc.errors())
        raise InvalidInput(f"malformed shell_call item: {problems}") from None


async def _runner_for(call: ShellCall, backend: AsyncClient) -> str:
    """``local`` (or none) → the local runner; ``container_reference`` → the runner it names,
    or the runner of the agent's workspace it names."""
    environment = call.environment
    if not isinstance(environment, ContainerReference):
        return LOCAL_RUNNER
    wanted = environment.container_id
    runner_ids = [runner.runner_id for runner in await backend.runners()]
    if wanted in runner_ids:
        return wanted
    workspaces = await backend.workspaces()
    for workspace in workspaces:
        if workspace.workspace_id == wanted and workspace.relation == "own":
            return workspace.runner_id
    own = sorted(w.workspace_id for w in workspaces if w.relation == "own")
    raise NotFound(
        f"environment.container_id {wanted!r} names no runner and none of this agent's "
        f"workspaces. Runners: {', '.join(sorted(runner_ids)) or 'none'}; the agent's "
        f"workspaces: {', '.join(own) or 'none yet'}. Use one of them, or environment "
        "{type: 'local'} for the agent's workspace on the local runner"
    )


async def _finish(
    backend: AsyncClient, command: str, runner_id: str, timeout_ms: int | None
) -> tuple[ExecutionView, bool]:
    """Run one command to its end. Returns its final record and whether it timed out."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout_ms is None else loop.time() + timeout_ms / 1000
    first_wait_ms = MAX_WAIT_MS if timeout_ms is None else min(timeout_ms, MAX_WAIT_MS)
    # Foreground with a wait: a command that ends within it is a result seen at once (N3),
    # and max_output_length 0 keeps the inline copy of the output out of the response.
    view: ExecutionView = await backend.run(
        command, runner_id=runner_id, wait_ms=first_wait_ms, max_output_length=0
    )
    while not view.state.terminal:
        remaining = MAX_WAIT_S if deadline is None else deadline - loop.time()
        if remaining <= 0:
            break
        view = await backend.wait(view.execution_id, min(MAX_WAIT_S, remaining))
    if view.state.terminal:
        return view, False
    # E5: the timeout is an explicit cancel on the caller's behalf; the record is terminal
    # only once the sandbox is gone and the snapshot committed (E7).
    view = await backend.cancel(view.execution_id, CANCEL_WAIT_S)
    while not view.state.terminal:
        view = await backend.wait(view.execution_id, MAX_WAIT_S)
    return view, view.state == ExecutionState.cancelled


async def _read_log(
    backend: AsyncClient, execution_id: str, stream: str, cap: OutputCap, segment: int
) -> None:
    offset = 0
    while True:
        chunk = await backend.logs(execution_id, stream, offset, PAGE_BYTES)
        cap.add(segment, chunk.data)
        # An undecodable tail never advances the offset: stop rather than spin.
        if chunk.complete or chunk.next_offset == offset:
            return
        offset = chunk.next_offset


def _outcome(view: ExecutionView, timed_out: bool) -> tuple[ExitOutcome | TimeoutOutcome, str]:
    """The outcome, and a note for stderr when the process did not exit on its own."""
    if timed_out:
        return TimeoutOutcome(), ""
    if view.state == ExecutionState.completed and view.exit_code is not None:
        return ExitOutcome(exit_code=view.exit_code), ""
    note = f"\n[shellyard: execution {view.execution_id} {view.state.value}"
    note += f": {view.error}]\n" if view.error else "]\n"
    return ExitOutcome(exit_code=EXIT_BY_STATE.get(view.state, 1)), note


async def run_shell_call(
    item: Mapping[str, Any] | ShellCall | BaseModel, backend: AsyncClient
) -> dict[str, Any]:
    """Run a ``shell_call`` item and return its ``shell_call_output`` item (S1)."""
    call = parse_shell_call(item)
    runner_id = await _runner_for(call, backend)
    action = call.action
    cap = OutputCap(min(action.max_output_length or DEFAULT_CAP, MAX_CAP))
    outcomes: list[ExitOutcome | TimeoutOutcome] = []
    status: Literal["completed", "incomplete"] = "completed"
    for index, command in enumerate(action.commands):
        view, timed_out = await _finish(backend, command, runner_id, action.timeout_ms)
        outcome, note = _outcome(view, timed_out)
        await _read_log(backend, view.execution_id, "stdout", cap, 2 * index)
        await _read_log(backend, view.execution_id, "stderr", cap, 2 * index + 1)
        cap.add(2 * index + 1, note)
        outcomes.append(outcome)
        if timed_out:
            status = "incomplete"
            break
    texts = cap.texts(2 * len(outcomes))
    output = ShellCallOutput(
        call_id=call.call_id,
        output=[
            ShellCallOutputContent(stdout=texts[2 * i], stderr=texts[2 * i + 1], outcome=o)
            for i, o in enumerate(outcomes)
        ],
        status=status,
        max_output_length=action.max_output_length,
        caller=call.caller,
    )
    return output.item()
