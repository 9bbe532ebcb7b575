"""E13: input to a running command, its terminal's screen and size (docs/contract.md).

Keys are named as tmux names them (``send-keys``): ``Enter``, ``Tab``, ``Escape``, ``Up``,
``C-c``, ``M-x`` … ; ``key_bytes`` turns one name into what a terminal would send.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: E13 terminal size: the default and the bounds of ``tty_rows`` / ``tty_cols``.
DEFAULT_TTY_ROWS = 24
DEFAULT_TTY_COLS = 80
MIN_TTY_SIZE = 2
MAX_TTY_ROWS = 500
MAX_TTY_COLS = 1000
#: E13: the most bytes one ``execution_input`` may send (text and keys together).
MAX_INPUT_BYTES = 65_536
#: E13: how much of what was typed the ``stdin`` log stream keeps (the rest is still sent).
MAX_STDIN_LOG_BYTES = 1 << 20

#: Named keys: what a VT100/xterm terminal sends for each (tmux's names and aliases).
NAMED_KEYS: dict[str, bytes] = {
    "Enter": b"\r",
    "Tab": b"\t",
    "BTab": b"\x1b[Z",
    "Escape": b"\x1b",
    "Space": b" ",
    "BSpace": b"\x7f",
    "Up": b"\x1b[A",
    "Down": b"\x1b[B",
    "Right": b"\x1b[C",
    "Left": b"\x1b[D",
    "Home": b"\x1b[H",
    "End": b"\x1b[F",
    "IC": b"\x1b[2~",
    "DC": b"\x1b[3~",
    "PPage": b"\x1b[5~",
    "NPage": b"\x1b[6~",
    "F1": b"\x1bOP",
    "F2": b"\x1bOQ",
    "F3": b"\x1bOR",
    "F4": b"\x1bOS",
    "F5": b"\x1b[15~",
    "F6": b"\x1b[17~",
    "F7": b"\x1b[18~",
    "F8": b"\x1b[19~",
    "F9": b"\x1b[20~",
    "F10": b"\x1b[21~",
    "F11": b"\x1b[23~",
    "F12": b"\x1b[24~",
}
_ALIASES = {
    "Insert": "IC",
    "Delete": "DC",
    "PageUp": "PPage",
    "PgUp": "PPage",
    "PageDown": "NPage",
    "PgDn": "NPage",
    "Backspace": "BSpace",
    "Esc": "Escape",
    "Return": "Enter",
}
#: C-x for the keys that are not letters (C-@ is NUL, C-[ is Escape …).
_CONTROL_SYMBOLS = {"@": 0, "[": 27, "\\": 28, "]": 29, "^": 30, "_": 31, "?": 127}


def key_bytes(name: str, tty: bool = True) -> bytes:
    """The bytes of one named key; ValueError naming the accepted forms. On a pipe
    (``tty=False``) Enter is a newline: no line discipline turns a carriage return into one."""
    canonical = _ALIASES.get(name, name)
    if canonical in NAMED_KEYS:
        if canonical == "Enter" and not tty:
            return b"\n"
        return NAMED_KEYS[canonical]
    if canonical.startswith("C-") and len(canonical) == 3:
        char = canonical[2]
        if char.isascii() and char.isalpha():
            return bytes([ord(char.lower()) - 96])
        if char in _CONTROL_SYMBOLS:
            return bytes([_CONTROL_SYMBOLS[char]])
    if canonical == "C-Space":
        return b"\x00"
    if canonical.startswith("M-") and len(canonical) > 2:
        rest = canonical[2:]
        inner = rest.encode() if len(rest) == 1 and rest.isascii() else key_bytes(rest, tty)
        return b"\x1b" + inner
    raise ValueError(
        f"unknown key {name[:40]!r}: use a tmux key name (Enter, Tab, BTab, Escape, Space, "
        "BSpace, Up, Down, Left, Right, Home, End, IC, DC, PPage, NPage, F1-F12), C-<letter> "
        "(C-c, C-d, C-z …) or M-<key>; send plain characters as text"
    )


def check_terminal_size(rows: int, cols: int) -> None:
    """ValueError unless both fit the bounds (E13)."""
    if not MIN_TTY_SIZE <= rows <= MAX_TTY_ROWS or not MIN_TTY_SIZE <= cols <= MAX_TTY_COLS:
        raise ValueError(
            f"terminal size {rows}x{cols} is out of range: tty_rows must be "
            f"{MIN_TTY_SIZE}..{MAX_TTY_ROWS} and tty_cols {MIN_TTY_SIZE}..{MAX_TTY_COLS}"
        )


class ExecutionInputRequest(BaseModel):
    """E13: what to send to a running interactive execution: ``text`` as typed, then each of
    ``keys`` in order, then (``eof``) the end of input."""

    model_config = ConfigDict(extra="forbid")

    text: str | None = Field(default=None, description="as typed")
    keys: list[str] = Field(default_factory=list, max_length=1024, description="key names")
    eof: bool = Field(default=False, description="end of input (on a terminal: C-d)")

    @model_validator(mode="after")
    def _check(self) -> ExecutionInputRequest:
        if not self.text and not self.keys and not self.eof:
            raise ValueError("nothing to send: give text, keys or eof")
        for key in self.keys:
            key_bytes(key)
        return self

    def data(self, tty: bool) -> bytes:
        """The bytes to write (the end of input is separate: ``eof``)."""
        typed = (self.text or "").encode("utf-8")
        keys = b"".join(key_bytes(key, tty) for key in self.keys)
        data = typed + keys
        if len(data) > MAX_INPUT_BYTES:
            raise ValueError(
                f"input of {len(data)} bytes is over the {MAX_INPUT_BYTES}-byte limit of one "
                "execution_input; send it in parts (or write a file and redirect it)"
            )
        return data


class InputResult(BaseModel):
    accepted_bytes: int


class TerminalSize(BaseModel):
    """E13: a terminal's size (``execution_resize``)."""

    model_config = ConfigDict(extra="forbid")

    rows: int = Field(description=f"rows, {MIN_TTY_SIZE}..{MAX_TTY_ROWS}")
    cols: int = Field(description=f"columns, {MIN_TTY_SIZE}..{MAX_TTY_COLS}")

    @model_validator(mode="after")
    def _check(self) -> TerminalSize:
        check_terminal_size(self.rows, self.cols)
        return self


class Cursor(BaseModel):
    row: int
    col: int


class ScreenView(BaseModel):
    """E13: the terminal as a person would see it now: ``rows`` lines of ``text`` (trailing
    blanks cut), the cursor 0-based."""

    rows: int
    cols: int
    text: str
    cursor: Cursor


class ExecutionInputCall(ExecutionInputRequest):
    """E13 as one call (MCP ``execution_input``): the execution and what to send it."""

    execution_id: str = Field(description="an execution id (ex_...) from run_shell")
