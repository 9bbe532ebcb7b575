"""Attack pass of session 45: ``shellyard files get`` of a folder an agent wrote (R2: nothing
an agent sends reaches more than its sandbox; here the operator's own machine, where the CLI
unpacks the agent's tree). docs/security.md "Attack pass (session 45)"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import sy

#: A tree only real paths can make (what a workspace holds and its tar export names): folders
#: of 247-byte names 16 deep, a one-letter link at each level to the next folder, a link at
#: the bottom back up to the top (``lll``), and ``escape`` through all of them and one ``..``
#: further. Resolved by the kernel, ``escape`` is the folder above the download's target;
#: ``os.path.realpath`` (what tarfile's ``data`` filter checks with) gives up past PATH_MAX
#: and reads the rest lexically, inside (CVE-2025-4517's shape; Python < 3.11.13).
TREE = r"""python3 - <<'PY'
import json
import os
D, steps, cur = "d" * 247, "abcdefghijklmnop", "out"
os.makedirs(cur, exist_ok=True)
for s in steps:
    os.mkdir(os.path.join(cur, D))
    os.symlink(D, os.path.join(cur, s))
    cur = os.path.join(cur, D)
os.symlink("/".join([".."] * len(steps)), os.path.join(cur, "l" * 110))
os.symlink("/".join(steps) + "/" + "l" * 110 + "/../victim", "out/escape")
PY"""


def _get(home: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``shellyard files get out`` run in ``cwd``: unpacked into ``./out``, the default."""
    return subprocess.run(
        [sys.executable, "-m", "shellyard", "files", "get", "out"],
        env={**os.environ, "SHELLYARD_HOME": str(home), "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
    )


def test_a_folder_downloaded_twice_never_writes_outside_its_target(
    served_home: Path, tmp_path: Path
) -> None:
    """R2 (the operator's machine): the agent's folder is downloaded with ``files get`` into
    the same target twice; between the two the agent replaces ``escape`` (a link that leaves
    the target) with a file. The file above the target must be untouched, and no link in the
    target may lead out of it. Before: the first download made the link (the ``data`` filter
    passed it), the second wrote the agent's bytes through it into ``victim``."""
    victim = tmp_path / "victim"
    victim.write_text("intact\n")
    made = sy(served_home, "run", "--", TREE)
    assert made.returncode == 0, made.stderr
    first = _get(served_home, tmp_path)
    escape = tmp_path / "out" / "escape"
    if escape.is_symlink():  # made: it must not lead out of the target
        assert not escape.exists() or escape.resolve().is_relative_to(tmp_path / "out"), (
            escape.resolve()
        )
    replaced = sy(served_home, "run", "--", "rm out/escape && echo PWNED > out/escape")
    assert replaced.returncode == 0, replaced.stderr
    second = _get(served_home, tmp_path)
    assert victim.read_text() == "intact\n", (first.stderr[-500:], second.stderr[-500:])


def test_an_artifacts_name_never_chooses_where_artifact_get_writes(
    served_home: Path, tmp_path: Path
) -> None:
    """R2 (the operator's machine): an artifact's name is the agent's (1 to 255 characters).
    Declared as ``../victim`` and as an absolute path, ``shellyard artifact get ID`` with no
    DEST must write into the current folder, never where the name points. Before: the name
    was the target path, so the agent's bytes replaced any file the operator may write."""
    victim = tmp_path / "victim"
    victim.write_text("intact\n")
    here = tmp_path / "here"
    here.mkdir()
    made = sy(served_home, "run", "--", "echo PWNED > deliverable.txt")
    assert made.returncode == 0, made.stderr
    for name in ("../victim", str(victim)):
        declared = sy(
            served_home, "artifact", "declare", "deliverable.txt", "--name", name, "--json"
        )
        assert declared.returncode == 0, declared.stderr
        artifact_id = json.loads(declared.stdout)["artifact_id"]
        got = subprocess.run(
            [sys.executable, "-m", "shellyard", "artifact", "get", artifact_id, "--json"],
            env={**os.environ, "SHELLYARD_HOME": str(served_home), "COLUMNS": "200"},
            capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL, cwd=here,
        )  # fmt: skip
        assert got.returncode == 0, got.stderr
        written = Path(json.loads(got.stdout)["path"])
        assert (here / written).resolve().parent == here.resolve(), written
        assert victim.read_text() == "intact\n", name


def test_an_agents_names_never_reach_the_operators_terminal_as_control_codes(
    served_home: Path,
) -> None:
    """R2 (the operator's terminal): a file name holding ``ESC ] 52 ; c ; …`` (set the
    clipboard: what the operator pastes next would be the agent's command) and a title
    sequence, listed by ``shellyard files ls``, is printed with its control characters shown
    as ``\\x1b``, never sent. Before: the table printed the name's ESC as it was."""
    made = sy(
        served_home, "run", "--",
        "mkdir -p names && touch \"names/a$(printf '\\033]52;c;cm0gLXJmIH4K\\033\\\\')b\" "
        "\"names/t$(printf '\\033]0;owned\\007')\"",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    listed = sy(served_home, "files", "ls", "names")
    assert listed.returncode == 0, listed.stderr
    assert "\x1b" not in listed.stdout and "\x07" not in listed.stdout, repr(listed.stdout)
    assert "\\x1b]52;c;cm0gLXJmIH4K" in listed.stdout, listed.stdout


def test_an_agents_names_are_printed_literally_never_as_rich_markup(
    served_home: Path, tmp_path: Path
) -> None:
    """R2 (the operator's terminal): names the agent chose holding rich markup (``[bold]``,
    ``[link=…]``: a link the operator would click; a file name cannot hold ``/``, so
    ``mailto:``) are printed as written, in a listing (``files ls``), a table (``status``: the
    command) and the message ``files get`` prints for a link it left out (which also shows
    control codes as ``\\x1b``). Before: the status table ate the markup, and the left-out
    message was a plain ``print`` (ESC sent)."""
    made = sy(
        served_home, "run", "--",
        "mkdir -p names out && touch 'names/[bold]x' 'names/[link=mailto:a@evil]y' "
        "&& ln -s /etc \"out/[link=mailto:a@evil]e$(printf '\\033]0;owned\\007')\" "
        "&& echo '[link=https://evil]click[/link]' >/dev/null",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    listed = sy(served_home, "files", "ls", "names")
    assert listed.returncode == 0, listed.stderr
    assert "names/[bold]x" in listed.stdout, listed.stdout
    assert "names/[link=mailto:a@evil]y" in listed.stdout, listed.stdout
    table = subprocess.run(
        [sys.executable, "-m", "shellyard", "status"],
        env={**os.environ, "SHELLYARD_HOME": str(served_home), "COLUMNS": "400"},
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert table.returncode == 0, table.stderr
    assert "[link=https://evil]click[/link]" in table.stdout, table.stdout
    got = _get(served_home, tmp_path)
    assert got.returncode == 0, got.stderr
    assert "\x1b" not in got.stderr, repr(got.stderr)
    assert "[link=mailto:a@evil]e\\x1b]0;owned" in got.stderr, got.stderr
    # an error naming the agent's link: its name as written, control codes shown
    refused = sy(served_home, "files", "cat", "out/[link=mailto:a@evil]e\x1b]0;owned\x07/x")
    assert refused.returncode != 0
    assert "\x1b" not in refused.stderr, repr(refused.stderr)
    assert "[link=mailto:a@evil]e\\x1b]0;owned" in refused.stderr, refused.stderr
