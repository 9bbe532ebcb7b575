"""Code comments cite contract ids (docs/contract.md) and docs/ pages, never "issue N": the
tracker those numbers name is not in the repository, so a reader could not follow them."""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "shellyard"


def test_no_source_file_cites_an_issue_number() -> None:
    found = [
        f"{path.relative_to(SRC.parent)}:{n}: {line.strip()}"
        for path in sorted(SRC.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bissues? \d+", line)
    ]
    assert not found, "cite the contract id or the docs/ page instead:\n" + "\n".join(found)
