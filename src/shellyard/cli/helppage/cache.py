"""Help pages kept once rendered (docs/benchmarks.md "CLI start-up": ``--help`` within 150 ms).

Rendering a page takes typer, click and rich: about 0.2 s of imports and layout on this project's
machines, against the interpreter's own 20 ms. A page is a function of the words asked, the
code that renders it and the terminal it goes to, so it is kept under
``$XDG_CACHE_HOME/shellyard/help`` (``~/.cache`` by default) the first time it is printed, with
everything it depended on:

- the words (``argv``), the interpreter, the user, the terminal (whether each of stdin, stdout
  and stderr is one, and its size), stdout's encoding, and every environment variable that
  rich, typer or click read to lay out a page (``COLUMNS``, ``TERM``, ``NO_COLOR`` ...), plus
  all ``SHELLYARD_*`` ones (a default shown on a page may come from one): the file is named
  by a checksum of these and holds them, and is used only when they are the same;
- every module file loaded while the page was rendered, by size and modification time: a page
  is printed again only when none of them changed (an upgrade, an edited verb), else it is
  rendered anew and the file replaced.

A page that printed anything on stderr is not kept, and a cache folder that cannot be written
only costs the time saved. Only the standard library is imported on the way to a kept page.

A kept page goes to a terminal as it is, so only the user's own is printed: the folder and
the file must belong to the effective user and be writable by nobody else (``su`` without
``-`` or ``sudo -E`` keep another user's ``XDG_CACHE_HOME``; a page planted there could move
root's cursor or retitle its terminal). Such a folder is not written either: its owner could
point the scratch file at any path root may write (docs/security.md, "Attack pass on the
batch's new doors").
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

#: Variables rich, typer and click read when they lay out or colour a page.
_LAYOUT_VARIABLES = (
    "COLUMNS", "LINES", "TERM", "COLORTERM", "NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE",
    "TTY_INTERACTIVE", "TERMINAL_WIDTH", "_TYPER_FORCE_DISABLE_TERMINAL", "JUPYTER_COLUMNS",
    "JUPYTER_LINES", "JPY_PARENT_PID", "VSCODE_PID", "PYTHONIOENCODING", "LANG", "LC_ALL",
    "LC_CTYPE", "HOME",
)  # fmt: skip
_FORMAT = 1


def is_help(argv: list[str]) -> bool:
    """A call that asks for a help page (``argv`` without the program name): ``--help``
    before any ``--`` (after it, the words are a command's)."""
    words = argv[: argv.index("--")] if "--" in argv else argv
    return "--help" in words


def _folder() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "shellyard" / "help"


def _own_folder(create: bool) -> int | None:
    """The help folder opened (a descriptor), when it is the effective user's and nobody else
    may write to it; None otherwise (then nothing is read from it or written to it)."""
    folder = _folder()
    try:
        if create:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    if not _own(fd):
        os.close(fd)
        return None
    return fd


def _own(fd: int) -> bool:
    status = os.fstat(fd)
    return status.st_uid == os.geteuid() and not status.st_mode & 0o022


def _terminal(fd: int) -> list[int] | None:
    try:
        if not os.isatty(fd):
            return None
        size = os.get_terminal_size(fd)
    except OSError:
        return None
    return [size.columns, size.lines]


def _inputs(argv: list[str]) -> str:
    """Everything besides the code that a page for ``argv`` depends on, as one string."""
    inputs = {
        "format": _FORMAT,
        "argv": [sys.argv[0], *argv],
        "python": [sys.executable, sys.version],
        "uid": os.geteuid(),
        "terminals": [_terminal(fd) for fd in (0, 1, 2)],
        "encoding": getattr(sys.stdout, "encoding", None),
        "env": {
            name: value
            for name, value in os.environ.items()
            if name in _LAYOUT_VARIABLES or name.startswith("SHELLYARD_")
        },
    }
    return json.dumps(inputs, sort_keys=True)


def _name(inputs: str) -> str:
    """The kept file's name: a checksum, not a digest (hashlib loads OpenSSL, a third of a
    kept page's time); the file holds ``inputs`` whole and is used only when they match."""
    data = inputs.encode()
    return f"{zlib.crc32(data):08x}{zlib.adler32(data):08x}"


def _stamp(path: str) -> list[int] | None:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return [status.st_size, status.st_mtime_ns]


def replay(argv: list[str]) -> int | None:
    """Print the kept page for ``argv`` and return its exit code; None when there is none
    that still holds (nothing printed then)."""
    inputs = _inputs(argv)
    folder = _own_folder(create=False)
    if folder is None:
        return None
    try:
        fd = os.open(
            f"{_name(inputs)}.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder
        )
        with open(fd, encoding="utf-8") as handle:
            if not _own(handle.fileno()):
                return None
            kept: dict[str, Any] = json.loads(handle.read())
    except (OSError, ValueError):
        return None
    finally:
        os.close(folder)
    if kept.get("inputs") != inputs:
        return None
    for path, stamp in kept["modules"]:
        if _stamp(path) != stamp:
            return None
    sys.stdout.write(kept["page"])
    sys.stdout.flush()
    return int(kept["code"])


class _Tee:
    """Writes through to ``real`` and keeps a copy; asked anything else, answers as ``real``
    (rich asks ``isatty``, ``fileno`` and ``encoding`` to lay the page out; click writes
    around a stream whose ``encoding`` it does not find, so nothing is inherited)."""

    def __init__(self, real: TextIO) -> None:
        self.real = real
        self.kept = io.StringIO()

    def write(self, text: str) -> int:
        self.kept.write(text)
        return self.real.write(text)

    def flush(self) -> None:
        self.real.flush()

    def isatty(self) -> bool:
        return self.real.isatty()

    def fileno(self) -> int:
        return self.real.fileno()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def _watch_help() -> list[bool]:
    """A list that gets an item when click renders a help page (its help option's answer):
    ``--help`` taken as another option's value runs the verb instead, whose output is no
    page to keep. Empty for ever when click's context is not where this release has it."""
    shown: list[bool] = []
    try:
        from typer._click.core import Context
    except ImportError:
        return shown
    render = Context.get_help

    def get_help(self: Context) -> str:
        shown.append(True)
        return render(self)

    Context.get_help = get_help  # type: ignore[method-assign]
    return shown


@contextlib.contextmanager
def recording(argv: list[str]) -> Iterator[None]:
    """Around rendering the page for ``argv``: keep what it printed when click rendered a
    help page, the call ended with exit code 0 and printed nothing on stderr."""
    inputs = _inputs(argv)
    shown = _watch_help()
    real_out, real_err = sys.stdout, sys.stderr
    out, err = _Tee(real_out), _Tee(real_err)
    sys.stdout, sys.stderr = out, err
    code: object = 0
    try:
        yield
    except SystemExit as exit_:
        code = exit_.code
        raise
    except BaseException:
        code = 1
        raise
    finally:
        sys.stdout, sys.stderr = real_out, real_err
        if shown and not code and not err.kept.getvalue():
            _keep(inputs, out.kept.getvalue(), 0)


def _keep(inputs: str, page: str, code: int) -> None:
    modules = []
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        stamp = _stamp(path) if isinstance(path, str) else None
        if stamp is not None:
            modules.append([path, stamp])
    entry = {"inputs": inputs, "code": code, "page": page, "modules": modules}
    folder = _own_folder(create=True)
    if folder is None:
        return
    name = _name(inputs)
    scratch = f".{name}.{os.getpid()}.tmp"
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        with open(os.open(scratch, flags, 0o600, dir_fd=folder), "w", encoding="utf-8") as out:
            out.write(json.dumps(entry))
        # a reader sees the old file or the new
        os.replace(scratch, f"{name}.json", src_dir_fd=folder, dst_dir_fd=folder)
    except OSError:
        return
    finally:
        os.close(folder)
