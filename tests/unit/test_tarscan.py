"""The bounded tar scan (runner/edits/tarscan.py; docs/security.md "Limits at each door"):
what it lets through reads the same as tarfile alone, and damaged or hostile archives end in
a clear refusal (InvalidInput, or tarfile's own TarError), never another exception, within a
bounded number of steps. A hypothesis pass over built and mutated archives."""

from __future__ import annotations

import contextlib
import io
import tarfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shellyard.errors import InvalidInput, TooLarge
from shellyard.runner.edits.tarscan import BoundedTar, TarLimits

FORMATS = [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]
MODES = ["w", "w:gz", "w:bz2", "w:xz"]

names = st.text(alphabet=st.sampled_from("abcé中_-. 0123456789"), min_size=1, max_size=120).filter(
    lambda s: s.strip(". ") != ""
)
members = st.lists(
    st.tuples(names, st.sampled_from(["file", "dir", "symlink"]), st.binary(max_size=2000)),
    min_size=1,
    max_size=6,
    unique_by=lambda m: m[0],
)


def build(items: list[tuple[str, str, bytes]], fmt: int, mode: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode, format=fmt) as tar:  # type: ignore[call-overload]
        for name, kind, data in items:
            info = tarfile.TarInfo(f"top/{name}")
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, "target"
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def read(raw: bytes, scan: bool, limits: TarLimits | None = None) -> list[tuple[str, bytes]]:
    source = BoundedTar(io.BytesIO(raw), limits or TarLimits()) if scan else io.BytesIO(raw)
    out = []
    with tarfile.open(fileobj=source, mode="r|" if scan else "r|*") as tar:  # type: ignore[call-overload]
        for member in tar:
            data = b""
            if member.isreg():
                extracted = tar.extractfile(member)
                assert extracted is not None
                data = extracted.read()
            out.append((f"{member.name}:{member.type!r}:{member.linkname}", data))
    return out


@settings(max_examples=150, deadline=None, database=None)
@given(members, st.sampled_from(FORMATS), st.sampled_from(MODES))
def test_the_scan_reads_what_tarfile_reads(
    items: list[tuple[str, str, bytes]], fmt: int, mode: str
) -> None:
    if fmt == tarfile.USTAR_FORMAT and any(len(n.encode()) > 90 for n, _, _ in items):
        return  # ustar cannot hold the name
    if fmt == tarfile.USTAR_FORMAT and any(not n.isascii() for n, _, _ in items):
        return
    raw = build(items, fmt, mode)
    assert read(raw, scan=True) == read(raw, scan=False)


@settings(
    max_examples=400,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    members,
    st.sampled_from(FORMATS[1:]),
    st.lists(st.tuples(st.integers(0, 4000), st.binary(min_size=1, max_size=24)), max_size=6),
)
def test_a_damaged_archive_is_refused_cleanly(
    items: list[tuple[str, str, bytes]], fmt: int, edits: list[tuple[int, bytes]]
) -> None:
    raw = bytearray(build(items, fmt, "w"))
    for at, data in edits:
        at %= len(raw)
        raw[at : at + len(data)] = data
    with contextlib.suppress(InvalidInput, tarfile.TarError):
        read(bytes(raw), scan=True, limits=TarLimits(max_bytes=1 << 20, max_entries=50))


def test_entries_and_bytes_are_bounded() -> None:
    raw = build([(f"f{i}", "file", b"x" * 100) for i in range(5)], tarfile.PAX_FORMAT, "w")
    with pytest.raises(TooLarge, match="more than 3 entries"):
        read(raw, scan=True, limits=TarLimits(max_entries=3))
    with pytest.raises(TooLarge, match="more than 250 bytes"):
        read(raw, scan=True, limits=TarLimits(max_bytes=250))
    assert len(read(raw, scan=True, limits=TarLimits(max_bytes=500, max_entries=5))) == 5
