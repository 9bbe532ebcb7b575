"""Code comments and docs cite contract ids (docs/contract.md) and docs/ pages, never "issue N":
the tracker those numbers name is not in the repository, so a reader could not follow them."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "shellyard"
ISSUE_NUMBER = re.compile(r"\bissues? #?\d+", re.IGNORECASE)


def citations_of_issue_numbers(paths: list[Path]) -> list[str]:
    return [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in paths
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if ISSUE_NUMBER.search(line)
    ]


def test_no_source_file_cites_an_issue_number() -> None:
    found = citations_of_issue_numbers(sorted(SRC.rglob("*.py")))
    assert not found, "cite the contract id or the docs/ page instead:\n" + "\n".join(found)


def test_no_doc_cites_an_issue_number() -> None:
    found = citations_of_issue_numbers([ROOT / "README.md", *sorted(ROOT.glob("docs/**/*.md"))])
    assert not found, "name the section or the contract id instead:\n" + "\n".join(found)
