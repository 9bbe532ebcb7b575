"""Help pages kept once rendered (cli/helppage/cache.py, docs/benchmarks.md "CLI start-up"): the
kept page is the very page typer prints, printed again only while nothing it depended on
changed, and never for anything but a help page. Each case is the console script's entry
(``python -m shellyard``) as a subprocess. Contract: docs/cli.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shellyard.cli.helppage.cache import is_help


def _cli(cache: Path, *argv: str, columns: str = "100") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "COLUMNS": columns}
    env.pop("SHELLYARD_HOME", None)
    return subprocess.run(
        [sys.executable, "-m", "shellyard", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _kept(cache: Path) -> list[Path]:
    return sorted((cache / "shellyard" / "help").glob("*.json"))


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["runner", "add", "--help"]])
def test_the_kept_page_is_the_rendered_page(tmp_path: Path, argv: list[str]) -> None:
    first = _cli(tmp_path, *argv)
    assert first.returncode == 0 and first.stderr == "", first.stderr
    assert "Usage:" in first.stdout
    (entry,) = _kept(tmp_path)
    assert json.loads(entry.read_text())["page"] == first.stdout
    again = _cli(tmp_path, *argv)
    assert (again.returncode, again.stdout, again.stderr) == (0, first.stdout, "")


def test_a_kept_page_is_what_is_printed_and_a_changed_module_renders_anew(
    tmp_path: Path,
) -> None:
    """The second call prints the kept file (altered here, it prints the alteration); once a
    module the page was rendered from has another size or time, the page is rendered again
    and the file replaced."""
    real = _cli(tmp_path, "run", "--help").stdout
    (entry,) = _kept(tmp_path)
    kept = json.loads(entry.read_text())
    kept["page"] = "a kept page\n"
    entry.write_text(json.dumps(kept))
    assert _cli(tmp_path, "run", "--help").stdout == "a kept page\n"
    verbs = next(m for m in kept["modules"] if m[0].endswith("shellyard/cli/executions.py"))
    verbs[1] = [verbs[1][0], verbs[1][1] - 1]  # as after an edit or an upgrade
    entry.write_text(json.dumps(kept))
    assert _cli(tmp_path, "run", "--help").stdout == real
    assert json.loads(entry.read_text())["page"] == real


def test_each_terminal_width_has_its_own_page(tmp_path: Path) -> None:
    narrow = _cli(tmp_path, "--help", columns="60").stdout
    wide = _cli(tmp_path, "--help", columns="160").stdout
    assert narrow != wide and len(_kept(tmp_path)) == 2
    assert max(len(line) for line in narrow.splitlines()) <= 60
    assert _cli(tmp_path, "--help", columns="60").stdout == narrow


def test_a_failed_call_and_a_verb_keep_nothing(tmp_path: Path) -> None:
    """A usage error (exit 2, on stderr) is no page to keep; words after ``--`` are a
    command's, so ``--help`` there asks for no page."""
    wrong = _cli(tmp_path, "no-such-verb", "--help")
    assert wrong.returncode == 2 and "no-such-verb" in wrong.stderr
    assert _kept(tmp_path) == []
    assert is_help(["--help"]) and is_help(["run", "--help"]) and is_help(["a", "--help", "b"])
    assert not is_help(["run", "--", "grep", "--help"]) and not is_help(["status"])


def test_a_cache_folder_that_cannot_be_written_only_costs_time(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    first = _cli(blocked, "--help")
    assert first.returncode == 0 and "Usage:" in first.stdout and first.stderr == ""
    assert _cli(blocked, "--help").stdout == first.stdout
