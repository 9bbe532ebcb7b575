"""CLI verbs of managed environments (V1–V8): ``shellyard env create|install|uninstall|list|
show|revisions|status``. Each takes ``--json``; ``install`` and ``uninstall`` show a live line
with the change's state, what it waits for and the runner's progress until it ends.

Exit codes: 0 done; 1 the change failed (the environment is unchanged); 2 bad input or another
shellyard error (the same as the other verbs). ``cli/app.py`` calls ``register``."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from shellyard.cli.common import HomeOption, JsonOption, err, escaped, fail, new_table, out
from shellyard.cli.common import print_json as _json
from shellyard.errors import ShellyardError

env_app = typer.Typer(
    help=(
        "Managed package environments: create one, add packages with conda, pip, cran or "
        "bioconductor (each change is a new revision), and pass it to 'shellyard run --env'."
    ),
    no_args_is_help=True,
)

if TYPE_CHECKING:
    from rich.table import Table

    from shellyard.contract.environments import ChangeView, EnvironmentView

AgentOption = Annotated[
    str | None,
    typer.Option("--agent", envvar="SHELLYARD_AGENT", help="Act for this agent."),
]
EnvArgument = Annotated[str, typer.Argument(help="The environment's id or name.")]
WaitOption = Annotated[
    bool,
    typer.Option(
        "--wait/--no-wait", help="Follow the change until it ends (default) or return at once."
    ),
]
#: How long one status request waits for the change to end before the display refreshes.
POLL_S = 1.0


def register(app: typer.Typer) -> None:
    app.add_typer(env_app, name="env")


def _run(home: Path | None, agent: str | None, action: Callable[[Any], Any]) -> Any:
    from shellyard.home import default_home
    from shellyard.sdk.client import Client

    try:
        with Client.for_home(home or default_home(), agent_id=agent) as client:
            return action(client)
    except ShellyardError as exc:
        if exc.details.get("change_id"):
            _change_failed(exc)
        fail(exc)


def _change_failed(exc: ShellyardError) -> NoReturn:
    err.print(
        f"[red]change failed[/red] ({exc.code}): {escaped(exc.message)}",
        highlight=False,
        markup=True,
    )
    raise typer.Exit(1)


def _resolve(client: Any, ref: str) -> str:
    """An id as given; a name looked up among the session's environments."""
    if ref.startswith("env_"):
        return ref
    matches = [e for e in client.environment_list() if e.name == ref]
    if len(matches) == 1:
        return str(matches[0].environment_id)
    if not matches:
        from shellyard.errors import NotFound

        raise NotFound(f"no environment named {ref!r}; 'shellyard env list' shows yours")
    from shellyard.errors import InvalidInput

    runners = ", ".join(f"{e.environment_id} on {e.runner_id}" for e in matches)
    raise InvalidInput(f"several environments are named {ref!r} ({runners}); give the id")


def _describe(change: ChangeView) -> str:
    what = change.action + (f" {change.manager}" if change.manager else "")
    if change.specs:
        what += " " + " ".join(change.specs)
    if change.state == "waiting":
        held = ", ".join(change.waiting_for) or "its turn"
        return f"{what}: waiting for {held}"
    if change.state == "running":
        return f"{what}: {change.progress or 'running'}"
    return f"{what}: {change.state}"


def _follow(client: Any, change: ChangeView, as_json: bool) -> ChangeView:
    """Poll the change until it ends, with a live status line on a terminal."""
    status = None
    if not as_json and err.is_terminal:
        status = err.status(_describe(change))
        status.start()
    try:
        while not change.done:
            change = client.environment_change_status(change.change_id, POLL_S)
            if status is not None:
                status.update(_describe(change))
            elif not change.done:
                time.sleep(0.05)  # the server already waited POLL_S; never spin
    finally:
        if status is not None:
            status.stop()
    return change


def _unchanged(client: Any, change: ChangeView) -> str:
    """What a failed change left, in the plane's words (``control.environments._error_for``):
    the same whether the change failed within the first call's wait or was followed."""
    if change.action == "create":
        return "the environment was not created"
    revision = client.environment_show(change.environment_id).revision
    return f"environment {change.environment_id} is unchanged (still revision {revision})"


def _finish_change(client: Any, change: ChangeView, as_json: bool) -> None:
    if as_json:
        _json(change)
    elif change.state == "succeeded":
        out.print(
            f"{change.change_id} succeeded: {change.environment_id} is now at revision "
            f"{change.revision}",
            highlight=False,
        )
    elif change.state == "failed":
        err.print(
            f"[red]change {change.change_id} failed[/red] ({escaped(change.error_kind)}): "
            f"{escaped(change.error)}; {escaped(_unchanged(client, change))}",
            highlight=False,
            soft_wrap=True,  # one line, as the plane's own error is printed
            markup=True,
        )
    else:
        out.print(f"{change.change_id} {_describe(change)}", highlight=False)
    if change.state == "failed":
        raise typer.Exit(1)


def _env_table(views: Sequence[EnvironmentView]) -> Table:
    table = new_table("environment_id", "name", "language", "runner", "state", "revision")
    for view in views:
        table.add_row(
            view.environment_id,
            view.name,
            view.language,
            view.runner_id,
            view.state,
            str(view.revision),
        )
    return table


# ---------------------------------------------------------------------- verbs


@env_app.command("create")
def env_create(
    name: Annotated[str, typer.Argument(help="A name, unique in your session on the runner.")],
    language: Annotated[str, typer.Option("--language", "-l", help="python or r.")] = "python",
    runner: Annotated[str | None, typer.Option("--runner", help="Default: local.")] = None,
    wait: WaitOption = True,
    home: HomeOption = None,
    agent: AgentOption = None,
    as_json: JsonOption = False,
    from_base: Annotated[
        str | None,
        typer.Option("--from", help="Start with a prepared base's packages (python-base)."),
    ] = None,
) -> None:
    """Create an environment (revision 1 once its tools are in)."""

    def create(client: Any) -> None:
        view = client.environment_create(
            name, language, runner, wait_ms=1000 if wait else 0, base=from_base
        )
        if wait and view.state == "creating" and view.change_id:
            first = client.environment_change_status(view.change_id)
            _follow(client, first, as_json)
            change = view.change_id
            view = client.environment_show(view.environment_id)
            view.change_id = change
        if as_json:
            _json(view)
        elif view.state == "failed":
            err.print(
                f"[red]creation failed[/red]: {escaped(view.error)}", highlight=False, markup=True
            )
        else:
            out.print(
                f"{view.environment_id} ({view.name}, {view.language} on {view.runner_id}): "
                f"{view.state}, revision {view.revision}",
                highlight=False,
            )
        if view.state == "failed":
            raise typer.Exit(1)

    _run(home, agent, create)


@env_app.command("install")
def env_install(
    environment: EnvArgument,
    manager: Annotated[str, typer.Argument(help="conda, pip, cran or bioconductor.")],
    specs: Annotated[list[str], typer.Argument(help="Package specs.")],
    channel: Annotated[
        list[str] | None, typer.Option("--channel", "-c", help="conda: a channel (repeat).")
    ] = None,
    index_url: Annotated[str | None, typer.Option("--index-url", help="pip: the index.")] = None,
    extra_index_url: Annotated[
        list[str] | None, typer.Option("--extra-index-url", help="pip: another index.")
    ] = None,
    find_links: Annotated[
        list[str] | None, typer.Option("--find-links", help="pip: a folder or URL of wheels.")
    ] = None,
    repo: Annotated[
        list[str] | None, typer.Option("--repo", help="cran/bioconductor: a repository.")
    ] = None,
    wait: WaitOption = True,
    home: HomeOption = None,
    agent: AgentOption = None,
    as_json: JsonOption = False,
) -> None:
    """Install packages into an environment (a new revision when it succeeds)."""

    def install(client: Any) -> None:
        change = client.environment_install(
            _resolve(client, environment),
            manager,
            specs,
            channels=channel,
            index_url=index_url,
            extra_index_urls=extra_index_url,
            find_links=find_links,
            repos=repo,
            wait_ms=1000 if wait else 0,
        )
        if wait:
            change = _follow(client, change, as_json)
        _finish_change(client, change, as_json)

    _run(home, agent, install)


@env_app.command("uninstall")
def env_uninstall(
    environment: EnvArgument,
    manager: Annotated[str, typer.Argument(help="conda, pip, cran or bioconductor.")],
    specs: Annotated[list[str], typer.Argument(help="Package names.")],
    wait: WaitOption = True,
    home: HomeOption = None,
    agent: AgentOption = None,
    as_json: JsonOption = False,
) -> None:
    """Remove packages from an environment (a new revision when it succeeds)."""

    def uninstall(client: Any) -> None:
        change = client.environment_uninstall(
            _resolve(client, environment), manager, specs, wait_ms=1000 if wait else 0
        )
        if wait:
            change = _follow(client, change, as_json)
        _finish_change(client, change, as_json)

    _run(home, agent, uninstall)


@env_app.command("list")
def env_list(
    runner: Annotated[str | None, typer.Option("--runner", help="Only this runner's.")] = None,
    home: HomeOption = None,
    agent: AgentOption = None,
    as_json: JsonOption = False,
) -> None:
    """The environments of your session."""
    views = _run(home, agent, lambda client: client.environment_list(runner))
    if as_json:
        _json(views)
    else:
        out.print(_env_table(views))


@env_app.command("show")
def env_show(
    environment: EnvArgument,
    home: HomeOption = None,
    agent: AgentOption = None,
    as_json: JsonOption = False,
) -> None:
    """One environment: revisions summary and pending changes."""
    view: EnvironmentView = _run(
        home, agent, lambda client: client.environment_show(_resolve(client, environment))
    )
    if as_json:
        _json(view)
        return
    out.print(_env_table([view]))
    if view.prefix:
        out.print(f"prefix: {view.prefix}", highlight=False)
    revisions = new_table("revision", "change", "request", "packages")
    for rev in view.revisions or []:
        request = " ".join(filter(None, [rev.action, rev.manager, *rev.specs]))
        revisions.add_row(str(rev.revision), rev.change_id, request, str(rev.packages))
    out.print(revisions)
    for change in view.pending_changes:
        out.print(f"pending {change.change_id}: {_describe(change)}", highlight=False)


@env_app.command("revisions")
def env_revisions(
    environment: EnvArgument,
    revision: Annotated[int | None, typer.Option("--revision", "-r", help="Only this one.")] = None,
    home: HomeOption = None,
    agent: AgentOption = None,
    as_json: JsonOption = False,
) -> None:
    """Every revision with its full package list per manager and the request that made it."""
    views = _run(
        home,
        agent,
        lambda client: client.environment_revisions(_resolve(client, environment), revision),
    )
    if as_json:
        _json(views)
        return
    for view in views:
        out.print(
            f"[bold]revision {view.revision}[/bold] ({view.change_id}): "
            f"{escaped(json.dumps(view.request))}",
            highlight=False,
            markup=True,
        )
        table = new_table("manager", "name", "version", "source")
        for pkg in view.packages:
            table.add_row(pkg.manager, pkg.name, pkg.version, pkg.source or "")
        out.print(table)


@env_app.command("status")
def env_status(
    change_id: Annotated[str, typer.Argument(help="A change id (chg_…).")],
    wait: Annotated[bool, typer.Option("--wait", help="Follow the change until it ends.")] = False,
    home: HomeOption = None,
    agent: AgentOption = None,
    as_json: JsonOption = False,
) -> None:
    """A change's state, what it waits for and its progress. Exit 1 if it failed."""

    def status(client: Any) -> None:
        change = client.environment_change_status(change_id)
        if wait:
            change = _follow(client, change, as_json)
        _finish_change(client, change, as_json)

    _run(home, agent, status)


@env_app.command("prepare")
def env_prepare(
    upgrade: Annotated[
        bool,
        typer.Option("--upgrade", help="Build a new revision even when one is prepared."),
    ] = False,
    name: Annotated[str, typer.Option("--name", help="The base to build.")] = "python-base",
    find_links: Annotated[
        list[Path] | None,
        typer.Option("--find-links", help="A local folder of wheels or sdists (repeat)."),
    ] = None,
    with_packages: Annotated[
        list[str] | None,
        typer.Option("--with", help="python-base: one more package for the base (repeat)."),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Build the runner host's base environment (docs/environments.md) once: a read-only python-base
    (numpy, pandas, scipy, matplotlib) shared by every home here, the default of commands
    without --env. Run it on the runner's host; quick when already built. The package tools
    run sandboxed, as the sandbox uid (docs/security.md, "Operator builds")."""
    import asyncio

    from shellyard.runner.environments.bases import prepare

    def progress(line: str) -> None:
        if not as_json:
            sys.stderr.write(f"  {line}\n")
            sys.stderr.flush()

    try:
        base, built = asyncio.run(
            prepare(
                name,
                upgrade=upgrade,
                progress=progress,
                find_links=[folder.absolute() for folder in find_links or []],
                extra=with_packages or [],
            )
        )
    except ShellyardError as exc:
        fail(exc)
    record = {
        "name": base.name,
        "revision": base.revision,
        "prefix": str(base.prefix),
        "built": built,
        "packages": base.packages,
    }
    if as_json:
        out.print_json(json.dumps(record))
        return
    verb = "built" if built else "already prepared:"
    # plain write: rich wraps long paths, and scripts read this line
    sys.stdout.write(f"{base.name} {verb} revision {base.revision} at {base.prefix}\n")
