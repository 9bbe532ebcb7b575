"""A runner's state id (runner/state_id.py) and how a NO_TRACE answer is read with it
(control/executions/unstarted.py; E9, E10). The daemon's side, end to end, is in
tests/integration/test_start_state_replaced.py."""

from __future__ import annotations

import stat
from pathlib import Path

from shellyard.control.executions import unstarted
from shellyard.runner import state_id
from shellyard.runner.protocol import NO_TRACE, START_CUT, untraced


def test_a_state_folder_keeps_its_id_and_a_new_folder_gets_another(home: Path) -> None:
    (home / "a").mkdir()
    first = state_id.load_or_create(home / "a")
    assert state_id.load_or_create(home / "a") == first  # a restart on the same folder
    path = home / "a" / state_id.STATE_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in (home / "a").iterdir()] == [state_id.STATE_FILE]  # no temp left
    (home / "b").mkdir()
    assert state_id.load_or_create(home / "b") != first  # another folder, another state


def test_a_wiped_folder_gets_a_new_id(home: Path) -> None:
    before = state_id.load_or_create(home)
    (home / state_id.STATE_FILE).unlink()  # what a wipe of the whole folder leaves of it
    assert state_id.load_or_create(home) != before


def test_a_damaged_id_counts_as_a_new_state(home: Path) -> None:
    (home / state_id.STATE_FILE).write_text("")  # a half-written file of another tool
    made = state_id.load_or_create(home)
    assert len(made) == 32 and state_id.load_or_create(home) == made


def test_no_trace_reads_never_started_only_from_the_state_the_start_went_to() -> None:
    """E9/E10: "never started" (run it again) only when the runner answering NO_TRACE is the
    state the start was sent to; another state, or a runner without an id where the start
    had one, is not known. A record without an id keeps the reading of before."""
    same = untraced("ex_1", cut=False, state_id="a" * 32)
    other = untraced("ex_1", cut=False, state_id="b" * 32)
    older = untraced("ex_1", cut=False)
    assert same.error == other.error == older.error == NO_TRACE
    assert all(unstarted.never_took(r) for r in (same, other, older))
    assert not unstarted.replaced("a" * 32, same)
    assert unstarted.replaced("a" * 32, other)
    assert unstarted.replaced("a" * 32, older)
    assert not unstarted.replaced(None, other) and not unstarted.replaced(None, older)
    assert "never started" not in unstarted.STATE_REPLACED
    assert "run it again" not in unstarted.STATE_REPLACED
    # a cut start stays what it was: not "never took", whatever its state
    assert not unstarted.never_took(untraced("ex_1", cut=True, state_id="a" * 32))
    assert untraced("ex_1", cut=True).error == START_CUT
