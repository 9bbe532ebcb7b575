"""Planning a transfer (T2): the request checked, and its paths (files, folders, globs with
``*``, ``?``, ``[...]`` and ``**``) expanded against the source's committed snapshot into one
row per entry, each with its target path. control/files/transfers.py copies the rows."""

from __future__ import annotations

import fnmatch
from collections.abc import AsyncIterator, Mapping
from typing import Any

from shellyard.contract.files import TransferRequest
from shellyard.errors import InvalidInput, NotFound, validation_message
from shellyard.paths import normalize_relative
from shellyard.runner.protocol import PathEntry, Runner

#: Most entries one transfer may name (each gets a row with its outcome).
MAX_TRANSFER_ENTRIES = 2_000_000
#: Entries one listing page of the source holds while a transfer is planned.
_PLAN_PAGE = 2000
_GLOB = frozenset("*?[")


def parse_request(data: Mapping[str, Any]) -> TransferRequest:
    from pydantic import ValidationError

    try:
        return TransferRequest.model_validate(dict(data))
    except ValidationError as exc:
        raise InvalidInput(validation_message(exc)) from None


def is_glob(path: str) -> bool:
    return any(ch in _GLOB for ch in path)


def glob_text(pattern: str) -> str:
    """Check a glob's text like a path (relative, no escape, no NUL)."""
    rel = normalize_relative(pattern)
    if not rel:
        raise InvalidInput(f"glob {pattern!r} matches nothing; give a pattern such as 'data/*.csv'")
    return rel


def _match(parts: list[str], names: list[str]) -> bool:
    """Whether path components ``names`` match pattern components ``parts`` (``**`` matches
    any number of folders, the rest as ``fnmatch`` within one component)."""
    if not parts:
        return not names
    head, rest = parts[0], parts[1:]
    if head == "**":
        return any(_match(rest, names[k:]) for k in range(len(names) + 1))
    return bool(names) and fnmatch.fnmatchcase(names[0], head) and _match(rest, names[1:])


async def _walk(runner: Runner, ws: str, seq: int, path: str) -> AsyncIterator[PathEntry]:
    after: str | None = None
    while True:
        page = await runner.list_dir(ws, seq, path, True, after, _PLAN_PAGE)
        for entry in page.entries:
            if entry.path != path:
                yield entry
        if page.next_after is None:
            return
        after = page.next_after


async def plan(
    runner: Runner, ws: str, seq: int, patterns: list[str], target_folder: str
) -> list[dict[str, Any]]:
    """One row per entry to copy, in source order, each with its target path."""
    out: dict[str, dict[str, Any]] = {}

    def add(entry: PathEntry, base: str) -> None:
        sub = entry.path[len(base) + 1 :] if base else entry.path
        target = f"{target_folder}/{sub}" if target_folder else sub
        if target in out:
            return  # named twice (or by two patterns): copied once
        if len(out) >= MAX_TRANSFER_ENTRIES:
            raise InvalidInput(
                f"the transfer names more than {MAX_TRANSFER_ENTRIES} entries; split it"
            )
        out[target] = {
            "idx": len(out),
            "source_path": entry.path,
            "target_path": target,
            "kind": entry.kind,
            "mode": entry.mode,
            "size": entry.size if entry.kind == "file" else 0,
            "sha256": entry.sha256,
            "link_target": entry.target,
        }

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
        async for entry in _walk(runner, ws, seq, base):
            names = entry.path.split("/")
            inside = any("/".join(names[:k]) in matched_dirs for k in range(1, len(names)))
            if inside or _match(parts, names):
                found = True
                add(entry, base)
                if entry.kind == "dir":
                    matched_dirs.add(entry.path)
        if not found:
            raise NotFound(
                f"glob {pattern!r} matches nothing in snapshot {seq} of workspace {ws}",
                path=pattern,
            )
    return list(out.values())
