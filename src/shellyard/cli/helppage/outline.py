"""The app's outline for its top-level help page (docs/benchmarks.md: ``shellyard --help`` within
200 ms). typer builds every verb's click parameters before it prints any page, about a third of
``--help`` (docs/benchmarks.md); the top-level page shows only each verb's and group's name, help
and panel. The outline is the same app with those, every verb taking no parameters and every group
no subcommands, so the page is the same, built from a fraction of the work."""

from __future__ import annotations

import copy
from typing import Any

import typer
from typer.models import CommandInfo, DefaultPlaceholder, TyperInfo


def _without_parameters(callback: Any) -> Any:
    if callback is None or isinstance(callback, DefaultPlaceholder):
        return callback

    def verb() -> None:  # pragma: no cover - the outline only prints help
        raise RuntimeError("the help outline runs no verb")

    verb.__name__ = callback.__name__
    verb.__doc__ = callback.__doc__
    return verb


def _command(info: CommandInfo) -> CommandInfo:
    outlined = copy.copy(info)
    outlined.callback = _without_parameters(info.callback)
    return outlined


def _group(info: TyperInfo) -> TyperInfo:
    outlined = copy.copy(info)
    outlined.callback = _without_parameters(info.callback)
    if info.typer_instance is not None:
        outlined.typer_instance = outline(info.typer_instance, nested=True)
    return outlined


def outline(app: typer.Typer, *, nested: bool = False) -> typer.Typer:
    """A copy of ``app`` whose verbs take no parameters (and, ``nested``, a group with no
    verbs); only for printing the top-level help page."""
    outlined = copy.copy(app)
    outlined.registered_commands = [] if nested else [_command(c) for c in app.registered_commands]
    outlined.registered_groups = [] if nested else [_group(g) for g in app.registered_groups]
    callback = app.registered_callback
    if callback is not None:
        outlined.registered_callback = _group(callback)
    return outlined


def is_top_level_help(argv: list[str]) -> bool:
    """``shellyard --help``, or no words at all (the app shows its help then)."""
    return argv in ([], ["--help"])
