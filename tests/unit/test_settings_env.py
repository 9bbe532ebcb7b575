"""One settings module (docs/operations.md "Environment variables"): every ``SHELLYARD_*``
variable the code names is declared in ``shellyard.settings_env`` and listed in the docs' table;
a bad value is refused at start, naming the variable and the values it takes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from shellyard import settings_env
from shellyard.config import Settings
from shellyard.errors import InvalidInput

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"SHELLYARD_[A-Z0-9_]*[A-Z0-9]")


def _names_in_src() -> set[str]:
    found: set[str] = set()
    for path in (ROOT / "src" / "shellyard").rglob("*.py"):
        found |= set(NAME.findall(path.read_text()))
    return found


def test_every_variable_the_code_names_is_declared_and_in_the_docs_table() -> None:
    names = _names_in_src()
    assert len(names) > 30  # the search found them (a broken pattern finds none)
    assert not names - set(settings_env.VARIABLES), "declare them in settings_env.py"
    docs = (ROOT / "docs" / "operations.md").read_text()
    section = docs.split("## Environment variables", 1)[1]
    listed = set(re.findall(r"^\| `(SHELLYARD_[A-Z0-9_]+)` \|", section, re.MULTILINE))
    assert listed == set(settings_env.VARIABLES), "regenerate the table: settings_env.table()"
    # The notification settings are read by field name (SHELLYARD_<FIELD>): declared too.
    from dataclasses import fields

    from shellyard.config import NotificationSettings

    for item in fields(NotificationSettings):
        assert f"SHELLYARD_{item.name.upper()}" in settings_env.VARIABLES


@pytest.mark.parametrize(
    ("name", "bad", "good"),
    [
        ("SHELLYARD_LAUNCHER", "yes", "chain"),
        ("SHELLYARD_CGROUPS", "v3", "v2"),
        ("SHELLYARD_PORT", "http", "8080"),
        ("SHELLYARD_NETWORK_LINGER_S", "soon", "0"),
        ("SHELLYARD_PACKAGES_OFFLINE", "maybe", "yes"),
        ("SHELLYARD_LOG_LEVEL", "loud", "debug"),
        ("SHELLYARD_DEFAULT_ENVIRONMENT", "python", "none"),
        ("SHELLYARD_WORKSPACE_QUOTA", "lots", "10G"),
        ("SHELLYARD_UID_RANGE", "5-10", "20000-20999"),
        ("SHELLYARD_LOOP", "fast", "asyncio"),
    ],
)
def test_a_bad_value_is_refused_at_start_naming_the_variable_and_its_values(
    name: str, bad: str, good: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(name, bad)
    with pytest.raises(InvalidInput) as caught:
        Settings.from_env(home=tmp_path)
    # named with the value; what it takes in the words of the one module, or of the reader that
    # turns it into a setting (sizes, the uid range)
    message = str(caught.value)
    assert (name in message and repr(bad) in message) or f"{name} must" in message, message
    monkeypatch.setenv(name, good)
    settings_env.check_environment()


def test_the_server_refuses_to_start_with_a_bad_launcher(tmp_path: Path) -> None:
    """``serve`` itself (a real process): SHELLYARD_LAUNCHER took every value but ``chain``
    for "build the launcher"; now anything but auto or chain stops the start."""
    import os

    env = {**os.environ, "SHELLYARD_HOME": str(tmp_path), "SHELLYARD_LAUNCHER": "chian"}
    done = subprocess.run(
        [sys.executable, "-m", "shellyard", "serve", "--port", "0"],
        env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode != 0
    assert "SHELLYARD_LAUNCHER='chian'" in done.stderr and "auto, chain" in done.stderr
