"""CLI verbs of artifacts, the deliverable files of a workspace: ``shellyard artifact
declare|list|get``. Each takes ``--json``. ``cli/app.py`` calls ``register``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from shellyard.cli.common import (
    AgentOption,
    HomeOption,
    JsonOption,
    SeqOption,
    WorkspaceOption,
    counted,
    out,
    print_json,
    progress_bar,
    run_as,
    show,
    wrote,
)
from shellyard.cli.unpack import no_link

artifact_app = typer.Typer(help="Deliverable files (artifacts).", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(artifact_app, name="artifact")


ARTIFACT_COLUMNS = ("artifact_id", "name", "path", "seq", "size", "sha256")


@artifact_app.command("declare")
def artifact_declare(
    path: str,
    name: Annotated[str | None, typer.Option(help="Default: the file's name.")] = None,
    workspace: WorkspaceOption = None,
    seq: SeqOption = None,
    home: HomeOption = None,
    agent: AgentOption = None,
    as_json: JsonOption = False,
) -> None:
    """Declare a committed file of your local workspace as an artifact."""
    view = run_as(
        home, agent, lambda c: c.artifact_declare(path, name, workspace_id=workspace, seq=seq)
    )
    if as_json:
        print_json(view)
        return
    out.print(f"{view.artifact_id} {view.name} ({view.size} bytes, sha256 {view.sha256})")


@artifact_app.command("list")
def artifact_list(
    home: HomeOption = None, agent: AgentOption = None, as_json: JsonOption = False
) -> None:
    """Your artifacts."""
    views = run_as(home, agent, lambda c: c.artifacts())
    show(views, as_json, ARTIFACT_COLUMNS)


@artifact_app.command("get")
def artifact_get(
    artifact_id: str,
    dest: Annotated[Path | None, typer.Argument(help="Default: its name.")] = None,
    home: HomeOption = None,
    agent: AgentOption = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print what was written as JSON on stdout.")
    ] = False,
) -> None:
    """Download an artifact's bytes."""

    def get(client: Any) -> dict[str, Any]:
        view = client.artifact(artifact_id)
        target = dest or own_name(view.name, artifact_id)
        with progress_bar() as progress, open(target, "wb", opener=no_link) as handle:
            task = progress.add_task(f"get {view.name}", total=view.size)
            for chunk in counted(client.iter_artifact(artifact_id), progress, task):
                handle.write(chunk)
        return {"path": str(target), "kind": "file", "size": view.size}

    wrote(run_as(home, agent, get), as_json)


def own_name(name: str, artifact_id: str) -> Path:
    """Where ``artifact get`` writes without a DEST: the artifact's name is the agent's (any
    1 to 255 characters, ``../x`` and ``/root/x`` included), so only its last component, in
    the current folder; the artifact's id when that is empty, ``.`` or ``..``."""
    last = name.rsplit("/", 1)[-1]
    return Path(last if last not in ("", ".", "..") else artifact_id)
