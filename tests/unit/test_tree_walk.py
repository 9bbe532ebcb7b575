"""The descriptor walker backups and restores copy with (R4: nothing done on an agent's behalf
runs with more than its sandbox's rights): a folder swapped for a link between its listing and
its descent is never entered, so root never lists a host folder for the agent."""

from __future__ import annotations

import os
from pathlib import Path

from shellyard.runner.tree_walk import Step, walk_at


def _host_and_tree(tmp_path: Path) -> tuple[Path, Path]:
    host = tmp_path / "host"
    host.mkdir()
    (host / "secret").write_text("host only")
    tree = tmp_path / "tree"
    (tree / "d").mkdir(parents=True)
    (tree / "d" / "mine").write_text("agent")
    (tree / "top").write_text("agent")
    return host, tree


def test_a_folder_swapped_for_a_link_between_listing_and_descent_is_not_entered(
    tmp_path: Path,
) -> None:
    host, tree = _host_and_tree(tmp_path)
    seen: list[tuple[Step, str]] = []
    fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for walked in walk_at(fd):
            seen.append((walked.step, walked.rel))
            if walked.step is Step.ENTER and walked.rel == "d":
                # the agent's swap, in the window a path-based copy had: listed as a folder,
                # not yet entered
                os.rename(tree / "d", tree / "d.old")
                os.symlink(host, tree / "d")
    finally:
        os.close(fd)
    assert (Step.GONE, "d") in seen
    assert not any(rel.startswith("d/") for _step, rel in seen), seen
    assert (Step.LEAF, "top") in seen


def test_a_folder_swapped_for_another_folder_is_left_out_like_one_that_vanished(
    tmp_path: Path,
) -> None:
    _host, tree = _host_and_tree(tmp_path)
    (tree / "other").mkdir()
    (tree / "other" / "elsewhere").write_text("x")
    seen: list[tuple[Step, str]] = []
    fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for walked in walk_at(fd, frozenset({"other"})):
            seen.append((walked.step, walked.rel))
            if walked.step is Step.ENTER and walked.rel == "d":
                os.rename(tree / "d", tree / "d.old")
                os.rename(tree / "other", tree / "d")
    finally:
        os.close(fd)
    assert (Step.GONE, "d") in seen
    assert (Step.LEAF, "d/elsewhere") not in seen


def test_links_are_listed_never_followed(tmp_path: Path) -> None:
    host, tree = _host_and_tree(tmp_path)
    os.symlink(host, tree / "lnk")
    fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    try:
        walked = {w.rel: w.step for w in walk_at(fd)}
    finally:
        os.close(fd)
    assert walked["lnk"] is Step.LEAF
    assert "lnk/secret" not in walked
    assert walked["d/mine"] is Step.LEAF and walked["d"] is Step.DONE
