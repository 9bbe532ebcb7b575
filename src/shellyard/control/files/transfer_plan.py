"""Planning a transfer (T2): the request checked, and its paths (files, folders, globs with
``*``, ``?``, ``[...]`` and ``**``) expanded against the source's committed snapshot into one
row per entry, each with its target path. control/files/transfers.py copies the rows."""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from shellyard.contract.files import TransferRequest
from shellyard.errors import InvalidInput, NotFound, validation_message
from shellyard.paths import normalize_relative
from shellyard.runner.protocol import PathEntry, Runner

#: Most entries one transfer may name by default (each gets a row with its outcome; a
#: million rows made the database 320 MB larger): ``Settings.transfer_max_entries``,
#: ``SHELLYARD_TRANSFER_MAX_ENTRIES`` (docs/limits.md "Full disk, long commands and bounded
#: records"). Beyond it the transfer is refused with the count.
MAX_TRANSFER_ENTRIES = 100_000
#: A refused transfer's entries are counted on (nothing kept) up to this many times the cap.
COUNT_FACTOR = 10
#: Entries one listing page of the source holds while a transfer is planned.
_PLAN_PAGE = 2000
_GLOB = frozenset("*?[")
#: Longest glob text (a path's own bound, PATH_MAX).
MAX_GLOB_CHARS = 4096


def parse_request(data: Mapping[str, Any]) -> TransferRequest:
    from pydantic import ValidationError

    try:
        return TransferRequest.model_validate(dict(data))
    except ValidationError as exc:
        raise InvalidInput(validation_message(exc)) from None


def is_glob(path: str) -> bool:
    return any(ch in _GLOB for ch in path)


def glob_text(pattern: str) -> str:
    """Check a glob's text like a path (relative, no escape, no NUL) and its length."""
    if len(pattern) > MAX_GLOB_CHARS:
        raise InvalidInput(
            f"a glob of {len(pattern)} characters is longer than {MAX_GLOB_CHARS}; "
            f"name a folder or a shorter pattern"
        )
    rel = normalize_relative(pattern)
    if not rel:
        raise InvalidInput(f"glob {pattern!r} matches nothing; give a pattern such as 'data/*.csv'")
    return rel


def _match(parts: list[str], names: list[str]) -> bool:
    """Whether path components ``names`` match pattern components ``parts`` (``**`` matches
    any number of folders, the rest as ``fnmatch`` within one component).

    A simulation of the pattern as an automaton, one state per pattern component: each name
    moves every live state once, so the cost is at most ``len(parts) * len(names)`` component
    matches (a recursion over ``**`` took exponential time: docs/security.md "Limits at each
    door")."""
    width = len(parts)

    def closure(states: set[int]) -> set[int]:
        # a ``**`` may match no folder: its state also stands for the next one
        out = set(states)
        for i in sorted(states):
            while i < width and parts[i] == "**":
                i += 1
                out.add(i)
        return out

    states = closure({0})
    for name in names:
        moved: set[int] = set()
        for i in states:
            if i == width:
                continue
            if parts[i] == "**":
                moved.add(i)
            elif fnmatch.fnmatchcase(name, parts[i]):
                moved.add(i + 1)
        if not moved:
            return False
        states = closure(moved)
    return width in states


async def _pages(runner: Runner, ws: str, seq: int, path: str) -> AsyncIterator[list[PathEntry]]:
    after: str | None = None
    while True:
        page = await runner.list_dir(ws, seq, path, True, after, _PLAN_PAGE)
        yield [entry for entry in page.entries if entry.path != path]
        if page.next_after is None:
            return
        after = page.next_after


async def _walk(runner: Runner, ws: str, seq: int, path: str) -> AsyncIterator[PathEntry]:
    async for page in _pages(runner, ws, seq, path):
        for entry in page:
            yield entry


def _matching(parts: list[str], page: list[PathEntry], matched_dirs: set[str]) -> list[PathEntry]:
    """The entries of ``page`` the glob takes: matched, or inside a matched folder (run on a
    worker thread, one page at a time, so a long expansion never holds the event loop)."""
    out = []
    for entry in page:
        path = entry.path
        cut = path.find("/")
        inside = False
        while cut > 0 and not inside:
            inside = path[:cut] in matched_dirs
            cut = path.find("/", cut + 1)
        if inside or _match(parts, path.split("/")):
            out.append(entry)
            if entry.kind == "dir":
                matched_dirs.add(path)
    return out


class _TooMany(Exception):
    pass


async def plan(
    runner: Runner,
    ws: str,
    seq: int,
    patterns: list[str],
    target_folder: str,
    max_entries: int | None = None,
) -> list[dict[str, Any]]:
    """One row per entry to copy, in source order, each with its target path. More than
    ``max_entries`` (default ``MAX_TRANSFER_ENTRIES``) is refused, saying how many it names
    (counted on, nothing kept, up to ``COUNT_FACTOR`` times the cap)."""
    cap = MAX_TRANSFER_ENTRIES if max_entries is None else max_entries
    out: dict[str, dict[str, Any]] = {}
    over = 0

    def add(entry: PathEntry, base: str) -> None:
        nonlocal over
        sub = entry.path[len(base) + 1 :] if base else entry.path
        target = f"{target_folder}/{sub}" if target_folder else sub
        if over or len(out) >= cap:
            over += 1  # no row kept; an entry named twice may count twice here
            if cap + over >= cap * COUNT_FACTOR:
                raise _TooMany
            return
        if target in out:
            return  # named twice (or by two patterns): copied once
        out[target] = {
            "idx": len(out),
            "source_path": entry.path,
            "target_path": target,
            "kind": entry.kind,
            "mode": entry.mode,
            "size": entry.size if entry.kind == "file" else 0,
            # the object to copy: its content id (the column is named for what it held first;
            # a runner older than content_id sent the id as sha256)
            "sha256": entry.content_id or entry.sha256,
            "link_target": entry.target,
        }

    with contextlib.suppress(_TooMany):
        await _expand(runner, ws, seq, patterns, add)
    if over:
        counted = len(out) + over
        many = f"at least {counted}" if counted >= cap * COUNT_FACTOR else str(counted)
        raise InvalidInput(
            f"the transfer names {many} entries, more than the {cap} one transfer "
            f"may hold (transfer_max_entries); split it into several transfers of fewer "
            f"paths, or copy a folder packed as one file",
            entries=counted,
            max_entries=cap,
        )
    return list(out.values())


async def _expand(
    runner: Runner,
    ws: str,
    seq: int,
    patterns: list[str],
    add: Callable[[PathEntry, str], None],
) -> None:
    for pattern in patterns:
        if not is_glob(pattern):
            entry = await runner.stat_path(ws, seq, pattern)
            if entry is None:
                raise NotFound(
                    f"no {pattern!r} in snapshot {seq} of workspace {ws} (its latest committed "
                    f"snapshot); check the path or list the folder",
                    path=pattern,
                )
            base = pattern.rpartition("/")[0]
            if pattern:
                add(entry, base)
            if entry.kind == "dir":
                async for child in _walk(runner, ws, seq, pattern):
                    add(child, base)
            continue
        parts = pattern.split("/")
        first = next(i for i, part in enumerate(parts) if is_glob(part))
        base = "/".join(parts[:first])
        head = await runner.stat_path(ws, seq, base) if base else None
        if base and (head is None or head.kind != "dir"):
            raise NotFound(
                f"glob {pattern!r} matches nothing: {base!r} is not a folder in snapshot {seq}",
                path=pattern,
            )
        matched_dirs: set[str] = set()
        found = False
        async for page in _pages(runner, ws, seq, base):
            for entry in await asyncio.to_thread(_matching, parts, page, matched_dirs):
                found = True
                add(entry, base)
        if not found:
            raise NotFound(
                f"glob {pattern!r} matches nothing in snapshot {seq} of workspace {ws}",
                path=pattern,
            )
