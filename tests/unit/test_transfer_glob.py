"""Transfer globs (T2; docs/security.md "Limits at each door"): the matcher keeps the meaning
of ``*``, ``?``, ``[...]`` within one component and ``**`` over any number of folders, and
its cost is linear: ``**`` repeated over a deep path took exponential time."""

from __future__ import annotations

import fnmatch

from hypothesis import given, settings
from hypothesis import strategies as st

from shellyard.control.files.transfer_plan import _match


def reference(parts: list[str], names: list[str]) -> bool:
    """The recursive definition (exponential in the number of ``**``): the meaning kept."""
    if not parts:
        return not names
    head, rest = parts[0], parts[1:]
    if head == "**":
        return any(reference(rest, names[k:]) for k in range(len(names) + 1))
    return bool(names) and fnmatch.fnmatchcase(names[0], head) and reference(rest, names[1:])


components = st.sampled_from(["**", "*", "a", "b", "a*", "?", "[ab]", "*b", "[!a]"])
names = st.sampled_from(["a", "b", "ab", "ba", "c", "aa"])


@settings(max_examples=2000, deadline=None, database=None)
@given(st.lists(components, max_size=6), st.lists(names, max_size=6))
def test_glob_matching_keeps_its_meaning(parts: list[str], path: list[str]) -> None:
    assert _match(parts, path) == reference(parts, path)


def test_repeated_double_star_over_a_deep_path_is_linear() -> None:
    """40 ``**`` over a 40-deep path that does not match: the recursion would make about
    10^23 calls; the matcher makes at most 40 * 40 component matches."""
    calls = 0
    real = fnmatch.fnmatchcase

    def counting(name: str, pattern: str) -> bool:
        nonlocal calls
        calls += 1
        assert calls <= 2 * 41 * 41, "more component matches than linear"
        return real(name, pattern)

    fnmatch.fnmatchcase = counting  # type: ignore[assignment]
    try:
        assert not _match(["**"] * 40 + ["nothing"], ["d"] * 40)
        assert _match(["**"] * 40 + ["d"], ["d"] * 40)
    finally:
        fnmatch.fnmatchcase = real  # type: ignore[assignment]
