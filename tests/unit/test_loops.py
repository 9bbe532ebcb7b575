"""The event loop chooser (shellyard/loops.py, docs/operations.md "The event loop"): uvloop
when importable unless ``SHELLYARD_LOOP`` says otherwise, asyncio's own loop for ``asyncio``
or where uvloop cannot be imported, and a clear refusal of any other value. The processes
that use it are checked from outside in tests/doors/cli/test_event_loop.py."""

from __future__ import annotations

import asyncio
import sys

import pytest

from shellyard import loops
from shellyard.errors import InvalidInput


async def _served_on() -> str:
    return loops.name(asyncio.get_running_loop())


def test_uvloop_by_default_and_asyncio_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHELLYARD_LOOP", raising=False)
    assert loops.chosen() == "uvloop"  # a dependency: importable wherever shellyard is
    assert loops.run(_served_on()) == "uvloop"
    for value, expected in [("asyncio", "asyncio"), (" AsyncIO ", "asyncio"), ("uvloop", "uvloop"),
                            ("auto", "uvloop"), ("", "uvloop")]:  # fmt: skip
        monkeypatch.setenv("SHELLYARD_LOOP", value)
        assert loops.chosen() == expected, value
        assert loops.run(_served_on()) == expected, value


def test_a_bad_value_is_refused_naming_the_values_it_takes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SHELLYARD_LOOP", "fast")
    coroutine = _served_on()
    with pytest.raises(InvalidInput) as caught:
        loops.run(coroutine)
    assert "SHELLYARD_LOOP='fast' is not valid: use auto, uvloop, asyncio" in str(caught.value)
    assert coroutine.cr_frame is None  # closed, never run: no loop was made for it


def test_without_uvloop_auto_is_asyncio_and_uvloop_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A host where uvloop is not installed (None in sys.modules: its import fails).
    monkeypatch.setitem(sys.modules, "uvloop", None)
    monkeypatch.delenv("SHELLYARD_LOOP", raising=False)
    assert loops.chosen() == "asyncio"
    assert loops.run(_served_on()) == "asyncio"
    monkeypatch.setenv("SHELLYARD_LOOP", "uvloop")
    with pytest.raises(InvalidInput) as caught:
        loops.chosen()
    assert "SHELLYARD_LOOP=uvloop but uvloop cannot be imported" in str(caught.value)
