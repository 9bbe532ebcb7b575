"""Every third-party module the package imports comes from a distribution its own
requirements bring (pyproject's ``dependencies`` and what they require, not the test extras):
CI installs the test tools, so a module that only a test tool brought in (sniffio, once
anyio 4.16 stopped requiring it) passed the suite while ``bash scripts/demo`` on a fresh
clone failed at the server's start."""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
import sys
from pathlib import Path

from packaging.requirements import Requirement

SOURCE = Path(__file__).resolve().parents[2] / "src" / "shellyard"
#: modules the package reaches only where they exist (guarded imports), named with why
OPTIONAL = {
    "agents": "the agents extra (openai-agents): imported when a ShellTool is built "
    "(shell_call/agents.py), which says to install the extra where it is missing",
}


def _closure(name: str) -> set[str]:
    """The distributions ``name`` needs, itself included, without any extra."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        current = todo.pop()
        key = re.sub(r"[-_.]+", "-", current).lower()
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = metadata.requires(current) or []
        except metadata.PackageNotFoundError:
            continue  # a marker-excluded requirement, not installed here
        for line in requires:
            requirement = Requirement(line)
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            todo.append(requirement.name)
    return seen


def _imported_top_levels() -> dict[str, str]:
    """Top-level module → one file importing it, over the package's sources."""
    found: dict[str, str] = {}
    for path in sorted(SOURCE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                found.setdefault(name.split(".")[0], str(path.relative_to(SOURCE.parent)))
    return found


def test_every_imported_module_comes_from_a_declared_requirement() -> None:
    needed = _closure("shellyard")
    providers = metadata.packages_distributions()
    missing = []
    for module, where in _imported_top_levels().items():
        if module in sys.stdlib_module_names or module == "shellyard" or module in OPTIONAL:
            continue
        distributions = {re.sub(r"[-_.]+", "-", d).lower() for d in providers.get(module, [])}
        assert distributions, f"{module} (imported by {where}) is not installed at all"
        if not distributions & needed:
            missing.append(f"{module} (imported by {where}) comes from {sorted(distributions)}")
    assert not missing, "add to pyproject's dependencies:\n" + "\n".join(missing)
