"""E13 in the SDK: input to a running interactive execution, its terminal's screen and size
(``client.input(id, text="y", keys=["Enter"])``, ``client.screen(id)``,
``client.resize(id, rows, cols)``)."""

from __future__ import annotations

from pydantic import TypeAdapter

from shellyard.contract.interactive import InputResult, ScreenView
from shellyard.sdk.base import Op, _Call, call

_INPUT = TypeAdapter(InputResult)
_SCREEN = TypeAdapter(ScreenView)


def _input(
    execution_id: str,
    text: str | None = None,
    keys: list[str] | None = None,
    eof: bool = False,
) -> _Call[InputResult]:
    """Send ``text`` as typed, then each of ``keys`` (tmux names: Enter, Tab, C-c, Up …),
    then, with ``eof``, the end of input (stdin closed; on a terminal C-d) to an execution
    started with ``interactive=True`` or ``tty=True``."""
    body = {"text": text, "keys": list(keys or []), "eof": eof}
    return call("POST", f"/v1/executions/{execution_id}/input", _INPUT, body=body)


def _screen(execution_id: str) -> _Call[ScreenView]:
    """The terminal of a ``tty=True`` execution as a person would see it now."""
    return call("GET", f"/v1/executions/{execution_id}/screen", _SCREEN)


def _resize(execution_id: str, rows: int, cols: int) -> _Call[ScreenView]:
    """Resize the terminal (the program gets SIGWINCH); the screen at the new size."""
    body = {"rows": rows, "cols": cols}
    return call("POST", f"/v1/executions/{execution_id}/resize", _SCREEN, body=body)


class InteractiveOps:
    """Interactive executions (E13)."""

    input = Op(_input)
    screen = Op(_screen)
    resize = Op(_resize)
