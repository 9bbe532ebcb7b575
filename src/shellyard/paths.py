"""Workspace-relative paths (W6): one normaliser used wherever a path comes in.

Every path a caller hands to shellyard is relative to a workspace root. ``normalize_relative``
turns it into a canonical POSIX relative path (``""`` is the root) or refuses it with a
``PathRefused`` error that says what was wrong and what to pass instead. It works on the text
only; whether a path crosses a symbolic link is checked where the filesystem is touched.

It also names ``StrPath``, the one annotation of a host file's path as ``os`` takes it.
"""

from __future__ import annotations

import os

from shellyard.errors import PathRefused

#: A host file's path as ``os`` takes it: a ``str`` where it is built on a hot path (an
#: f-string of its folder costs a fraction of a ``Path`` join, docs/benchmarks.md §72), a
#: ``Path`` elsewhere.
StrPath = str | os.PathLike[str]

#: Longest single path component, in bytes (NAME_MAX on Linux).
MAX_COMPONENT_BYTES = 255
#: Longest whole path, in bytes (PATH_MAX on Linux).
MAX_PATH_BYTES = 4096

_EXAMPLE = "pass a path relative to the workspace root, such as 'src/main.py' ('' is the root)"


def _encode(text: str, original: str) -> bytes:
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise PathRefused(
            f"path {original!r} is not valid text (it holds an unpaired surrogate); {_EXAMPLE}",
            path=original,
        ) from None


def normalize_relative(path: str) -> str:
    """Return ``path`` as a normalised relative POSIX path; ``""`` means the workspace root.

    ``"."``, ``""``, ``"./"`` → ``""``; ``"a//b/./c/"`` → ``"a/b/c"``; ``"a/../b"`` → ``"b"``.
    Refused (``PathRefused``): absolute paths, ``..`` that climbs above the root, NUL bytes,
    a component longer than 255 bytes, a path longer than 4096 bytes, non-text input.
    """
    if not isinstance(path, str):
        raise PathRefused(
            f"path must be a string, got {type(path).__name__}; {_EXAMPLE}", path=repr(path)
        )
    marked = from_marked(path)
    if marked is not None:
        # docs/files-and-transfers.md "Names that are not UTF-8": the marked form names
        # the raw bytes through doors whose wire is strict UTF-8 (MCP, a URL's query)
        path = marked
    if "\0" in path:
        raise PathRefused(
            f"path {path!r} contains a NUL byte, which no file name can hold; {_EXAMPLE}",
            path=path,
        )
    if len(_encode(path, path)) > MAX_PATH_BYTES:
        raise PathRefused(
            f"path is {len(_encode(path, path))} bytes long; the limit is {MAX_PATH_BYTES} "
            f"bytes; pass a shorter relative path",
            path=path[:200],
        )
    if path.startswith("/"):
        # Commands see the workspace at /workspace: /workspace/x is the relative path x.
        inside = (
            path.removeprefix("/workspace").lstrip("/")
            if (path == "/workspace" or path.startswith("/workspace/"))
            else path.lstrip("/")
        )
        raise PathRefused(
            f"path {path!r} is absolute; paths are relative to the workspace root (/workspace "
            f"inside commands), so pass {inside!r} for the same place inside the workspace",
            path=path,
        )
    parts: list[str] = []
    for component in path.split("/"):
        if component in ("", "."):
            continue
        if component == "..":
            if not parts:
                raise PathRefused(
                    f"path {path!r} uses '..' to leave the workspace root; "
                    f"{_EXAMPLE}, staying inside the workspace",
                    path=path,
                )
            parts.pop()
            continue
        size = len(_encode(component, path))
        if size > MAX_COMPONENT_BYTES:
            raise PathRefused(
                f"path {path!r} has a component of {size} bytes; a file or folder name may be "
                f"at most {MAX_COMPONENT_BYTES} bytes; pass a path with shorter names",
                path=path[:300],
            )
        parts.append(component)
    return "/".join(parts)


__all__ = ["MAX_COMPONENT_BYTES", "MAX_PATH_BYTES", "from_marked", "normalize_relative"]


# ---------------------------------------------------------------- names that are not UTF-8
# A Linux name is bytes; it is held as ``str`` the way ``os`` does (PEP 383
# ``surrogateescape``: each byte that is not part of valid UTF-8 is U+DC80 + byte).
# docs/files-and-transfers.md, "Names that are not UTF-8".

#: Marks the stored form (``/`` + ``escape(name)``) of a path that is not UTF-8: a leading
#: ``/`` is never part of a normalised relative path, so the form is unambiguous.
STORED_MARK = "/"


def not_utf8(text: str) -> bool:
    """Whether ``text`` holds a byte of a name that is not UTF-8 (a lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def escape(text: str) -> str:
    """``text`` as printable UTF-8: ``\\`` doubled, each raw byte as ``\\xNN``."""
    out = []
    for char in text:
        if char == "\\":
            out.append("\\\\")
        elif "\udc80" <= char <= "\udcff":
            out.append(f"\\x{ord(char) - 0xDC00:02x}")
        else:
            out.append(char)
    return "".join(out)


def unescape(text: str) -> str:
    """The inverse of ``escape``."""
    out = []
    i = 0
    while i < len(text):
        char = text[i]
        if char == "\\" and text[i + 1 : i + 2] == "\\":
            out.append("\\")
            i += 2
        elif char == "\\" and text[i + 1 : i + 2] == "x":
            out.append(chr(0xDC00 + int(text[i + 2 : i + 4], 16)))
            i += 4
        else:
            out.append(char)
            i += 1
    return "".join(out)


def from_marked(text: str) -> str | None:
    """The name a marked form (``contract.rawjson.marked``) stands for; None when ``text``
    is not one: it must start with ``/``, hold a ``\\xNN`` escape, and decode to a name
    that is not UTF-8 whose escape is exactly ``text`` (so no absolute path or real name is
    ever taken for one)."""
    if not text.startswith(STORED_MARK) or "\\x" not in text:
        return None
    body = text[len(STORED_MARK) :]
    try:
        name = unescape(body)
    except ValueError:
        return None
    if not not_utf8(name) or escape(name) != body:
        return None
    return name
