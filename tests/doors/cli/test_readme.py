"""The README's REST example runs as written (its paths right for root and non-root: the
home is $SHELLYARD_HOME, else /var/lib/shellyard for root, ~/.shellyard for others), and its
Quick start is exactly two commands."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from conftest import sy

README = Path(__file__).resolve().parents[3] / "README.md"


def _blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", README.read_text(), re.DOTALL)


def test_the_rest_example_runs_as_written(served_home: Path) -> None:
    (curl,) = [b for b in _blocks() if "curl -s -H" in b]
    assert "~/.shellyard/admin.token" not in curl and "/var/lib/shellyard" in curl
    assert sy(served_home, "status").returncode == 0  # the home is served
    done = subprocess.run(
        ["bash", "-c", curl],
        env={**os.environ, "SHELLYARD_HOME": str(served_home)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["stdout"] == "hi\n" and answer["execution_id"].startswith("ex_")


def test_the_quick_start_is_two_commands() -> None:
    section = README.read_text().split("## Quick start", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert block is not None
    assert len([line for line in block.group(1).splitlines() if line.strip()]) == 2
