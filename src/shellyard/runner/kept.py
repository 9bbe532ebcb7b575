"""A bounded memo of what a runner derives from an id on every ask (a workspace's folders,
its namespace file): the loop's thread joined the same paths ~80 times per execution
(docs/benchmarks.md §72). Only what ``make`` returned is kept (it raises for an id it
refuses, so no refused id is kept), and the table starts again when full: ids that name no
workspace fill it too."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

#: How many ids a table keeps before it starts again.
BOUND = 4096


class Kept(Generic[K, V]):
    """``make(key)`` once per key, while the table holds it."""

    def __init__(self, make: Callable[[K], V], bound: int = BOUND) -> None:
        self._make = make
        self._bound = bound
        self._table: dict[K, V] = {}

    def __call__(self, key: K) -> V:
        found = self._table.get(key)
        if found is None:
            found = self._make(key)
            if len(self._table) >= self._bound:
                self._table.clear()
            self._table[key] = found
        return found

    def __len__(self) -> int:
        return len(self._table)


def folders(check: Callable[[str], object], *parents: Path) -> Kept[str, tuple[Path, ...]]:
    """``id → (parent / id, ...)``, each id passed to ``check`` (which raises for one it
    refuses) before its paths are joined and kept."""

    def make(key: str) -> tuple[Path, ...]:
        check(key)
        return tuple(parent / key for parent in parents)

    return Kept(make)
