"""``shellyard --help`` is printed from the app's outline (cli/helppage/outline.py): the page
must be the very page the whole app prints, at any width, and with no words at all."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from shellyard.cli.app import app
from shellyard.cli.helppage.outline import is_top_level_help, outline


@pytest.mark.parametrize("columns", ["60", "100", "200"])
@pytest.mark.parametrize("argv", [["--help"], []])
def test_the_outline_prints_the_same_page(columns: str, argv: list[str]) -> None:
    runner = CliRunner()
    whole = runner.invoke(app, argv, env={"COLUMNS": columns})
    outlined = runner.invoke(outline(app), argv, env={"COLUMNS": columns})
    assert outlined.exit_code == whole.exit_code
    assert outlined.output == whole.output
    assert "shellyard run" in whole.output and "Exit codes" in whole.output


def test_only_the_top_level_page_is_outlined() -> None:
    assert is_top_level_help([]) and is_top_level_help(["--help"])
    for argv in (["run", "--help"], ["runner", "--help"], ["--version"], ["status"]):
        assert not is_top_level_help(argv)


def test_the_outline_leaves_the_app_whole() -> None:
    """Outlining copies: the real verbs keep their parameters."""
    outline(app)
    runner = CliRunner()
    page = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "120"})
    assert page.exit_code == 0 and "--wait-ms" in page.output
