"""The retained-log cap on a real file (issue 12; R2, E6): a cut keeps the head and the
latest tail, frees the blocks between, keeps every offset, and reads as head, marker, tail;
a writer appending meanwhile loses nothing of the tail. Also the quota's tree measure."""

from __future__ import annotations

import os
from pathlib import Path

from shellyard.runner.limits import logcap
from shellyard.runner.limits.quota import tree_usage

KIB = 1 << 10


def page_through(log: Path, page: int) -> list[tuple[int, int, bytes]]:
    pages = []
    offset = 0
    while True:
        data, start, next_offset, size = logcap.read(log, offset, page)
        assert start == offset
        pages.append((start, next_offset, data))
        if next_offset >= size or not data:
            return pages
        offset = next_offset


def test_a_cut_keeps_head_and_tail_with_stable_offsets(tmp_path: Path) -> None:
    log = tmp_path / "stdout"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    content = b"".join(b"%08d\n" % i for i in range(100_000))  # 900,000 bytes
    os.write(fd, content[:600_000])
    limit = 64 * KIB
    cut = logcap.trim(log, limit, log.stat().st_size, None)
    assert cut is not None and cut.head == 32 * KIB
    os.write(fd, content[600_000:])  # the writer goes on appending after the punch
    cut = logcap.trim(log, limit, log.stat().st_size, cut)
    os.close(fd)
    assert cut is not None
    st = log.stat()
    assert st.st_size == len(content)  # offsets never move
    assert st.st_blocks * 512 <= limit + logcap.BLOCK
    pages = page_through(log, 16 * KIB)
    markers = [p for p in pages if b"of this log were dropped" in p[2]]
    assert len(markers) == 1
    start, end, text = markers[0]
    assert (start, end) == (cut.head, cut.end)
    assert f"{cut.dropped} bytes".encode() in text
    for s, e, data in pages:
        if (s, e) != (start, end):
            assert data == content[s:e]  # every other byte is the one written there
    assert pages[0][0] == 0 and pages[-1][1] == len(content)
    assert logcap.load_cut(log) == cut


def test_a_log_under_the_limit_is_left_alone(tmp_path: Path) -> None:
    log = tmp_path / "stderr"
    log.write_bytes(b"x" * 1000)
    assert logcap.trim(log, 64 * KIB, 1000, None) is None
    assert logcap.read(log, 0, 100) == (b"x" * 100, 0, 100, 1000)
    assert not logcap.cut_path(log).exists()


def test_tree_usage_counts_sizes_blocks_and_hard_links_once(tmp_path: Path) -> None:
    tree = tmp_path / "w"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "a").write_bytes(b"a" * 10_000)
    os.link(tree / "sub" / "a", tree / "b")
    with (tree / "sparse").open("wb") as handle:
        handle.truncate(50 << 20)  # no blocks, and whole MiB holes its commit never hashes
    (tree / "link").symlink_to("/etc/passwd")
    usage, entries = tree_usage(tree)
    assert entries == 5
    # the hard-linked 10,000 bytes once; the sparse file charged what its commit hashes: 0
    # (docs/limits.md "Sparse files"; before content ids it was charged its 50 MiB)
    assert 10_000 <= usage < 10_000 + 64 * KIB


def test_the_watcher_opens_no_cut_record_for_an_empty_log(tmp_path: Path) -> None:
    """docs/benchmarks.md §36: a cut needs bytes past its end (the size stays the bytes
    written), so the watcher takes an empty log for uncut without opening ``<log>.cut``
    (planted here, which only an open would read); a log with bytes is read as before."""
    from shellyard.runner.limits import watcher

    log = tmp_path / "stdout"
    log.write_bytes(b"")
    logcap._record(log, logcap.Cut(head=0, end=4096), 8192)
    assert logcap.load_cut(log) == logcap.Cut(head=0, end=4096)
    assert watcher._load_cut(log, log.stat()) is None
    log.write_bytes(b"x" * 8192)
    assert watcher._load_cut(log, log.stat()) == logcap.Cut(head=0, end=4096)
    assert watcher._load_cut(tmp_path / "gone", None) is None
    assert watcher._load_cut(log, None) == logcap.Cut(head=0, end=4096)  # unknown size: read
