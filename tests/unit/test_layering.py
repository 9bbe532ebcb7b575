"""The shape of the package, as docs/architecture.md draws it: no import circle inside
``src/shellyard`` and no import across the layers the document forbids.

Every ``import`` counts, at any depth: module level, inside a function, and under
``if TYPE_CHECKING:`` (a type-only import is still a tie of design: it makes the two modules one
unit to understand). Edges into a package's ``__init__`` are left out of the circle search
only: ``shellyard/__init__.py`` re-exports the SDK lazily for ``from shellyard import Client``,
which is a facade, not a dependency of design.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "shellyard"

#: Which layer may import which (besides itself). A layer is a folder of ``src/shellyard`` or
#: one of its top-level modules. The same table is drawn in docs/architecture.md.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    # Every SHELLYARD_* variable, declared and checked once (docs/operations.md): light, for
    # the CLI's fast path as much as the server and the runner.
    "settings_env": {"errors"},
    "listen": set(),
    # The event loop of the long-running processes (serve, mcp, runner serve), chosen once
    # from SHELLYARD_LOOP: uvloop when importable (docs/operations.md).
    "loops": {"settings_env", "errors"},
    # The address rules shared by the runner's egress proxy and the control plane's webhook
    # delivery (docs/security.md "Network"): pure, so both sides of the wire may use them.
    "netrules": set(),
    "paths": {"errors"},
    # The modes of the home's files (0700/0600 and the sandbox uid's ACL entries): light, for
    # every part that creates files in the home (docs/security.md "The home's files").
    "filemodes": set(),
    "contract": {"errors"},
    "config": {"settings_env", "errors", "contract", "home", "netrules"},
    "home": {"settings_env", "errors", "filemodes"},
    "store": {"errors", "paths", "filemodes"},
    # The runner answers with public models where its results reach the caller unchanged.
    "runner": {
        "settings_env",
        "errors",
        "paths",
        "listen",
        "loops",
        "contract",
        "filemodes",
        "netrules",
    },
    "control": {
        "settings_env",
        "errors",
        "paths",
        "contract",
        "config",
        "store",
        "runner",
        "filemodes",
        "netrules",
    },
    "api": {
        "settings_env",
        "errors",
        "paths",
        "contract",
        "config",
        "home",
        "listen",
        "loops",
        "control",
        "web",
        "filemodes",
    },
    # The web door: the page's static assets and its server half (login, the page's cookie
    # session, the panel's reads), routers the REST app mounts; api/auth.py reads its cookie.
    "web": {
        "settings_env",
        "errors",
        "paths",
        "contract",
        "config",
        "home",
        "listen",
        "control",
        "api",
    },
    # Client-side doors: the public models, the errors and the SDK; where the home's server is.
    "sdk": {"settings_env", "errors", "contract", "config", "home"},
    "shell_call": {"settings_env", "errors", "contract", "config", "home", "sdk"},
    "mcp": {"settings_env", "errors", "loops", "contract", "config", "home", "sdk"},
    "cli": {"settings_env", "errors", "loops", "contract", "config", "home", "sdk", "shell_call"},
    # Backup and restore of a home: an operator's tool that reads the store and the runner's
    # folders directly (docs/operations.md), launched by the CLI's backup verbs.
    "backup": {
        "settings_env",
        "errors",
        "config",
        "home",
        "control",
        "store",
        "runner",
        "filemodes",
    },
    "__main__": {"cli"},
    "__init__": {"sdk"},
}

#: Narrow passages between layers, by module, each named in docs/architecture.md.
PASSAGES: set[tuple[str, str]] = {
    # control/ speaks to runners through runner/protocol.py; only the wiring builds concrete
    # runners: the control plane its LocalRunner, the registry a RemoteRunner per daemon.
    ("control.plane", "runner.local"),
    ("control.runners", "runner.transport.client"),
    ("control.runners", "runner.transport.ssh"),
    ("control.runners", "runner.transport.tls"),
    # The settings name the local runner's policy: a model of its own, not the runner wire.
    ("config", "runner.policy"),
    ("config", "runner.limits.settings"),
    # MCP over streamable HTTP is served by the REST app: it mounts the MCP door's HTTP half,
    # which takes each request's principal from the REST app's auth.
    ("api.app", "mcp.mount"),
    ("mcp.mount", "mcp.http"),
    ("mcp.http", "api.auth"),
}

#: The CLI is also the program that runs the servers: ``serve``, ``mcp`` and ``runner serve``
#: import their entry module inside the verb's function (never at module level), and use only
#: that entry point.
LAUNCHES: set[tuple[str, str]] = {
    ("cli.app", "api.server"),
    ("cli.app", "mcp.server"),
    ("cli.runners", "runner.transport.daemon"),
    ("cli.maintenance", "backup"),
    ("cli.app", "runner.policy"),
    # A base environment is built on the runner's host by that host's CLI (env prepare).
    ("cli.environments", "runner.environments.bases"),
}

#: Imports that break the rules today and are being removed (issue 10: the public models and
#: the settings still take their runner types from the runner's wire module). The test fails
#: when one of them is gone, so that this list only shrinks: delete the line then.
KNOWN_EXCEPTIONS: set[tuple[str, str]] = set()

#: Circles being removed right now (issue 10: the MCP tool modules share helpers through
#: mcp/server.py, and the HTTP mount and its app name each other). Same rule: when one is gone
#: the test says so, and the line goes.
KNOWN_CIRCLES: list[list[str]] = []


#: The rooms of the two big layers, as docs/architecture.md draws them: a room is a subfolder
#: (``runner/sandbox/``) or a module at the layer's top (``runner/protocol.py``). Which other
#: rooms of its layer each may import; imports of other layers follow ALLOWED above.
ROOMS: dict[str, set[str]] = {
    # runner/: the protocol and the policy at the bottom, LocalRunner on top, the transport
    # (daemon and client) above it.
    "runner.policy": {"runner.network"},  # the egress rules' parsers (network/egress_rules.py)
    "runner.protocol": {"runner.policy"},
    "runner.processes": set(),
    "runner.workspace_paths": set(),
    # backup's and restore's walk of a tree someone may be changing (descriptors only)
    "runner.tree_walk": {"runner.workspace_paths"},
    # a background thread that ends with its owner (the removal and unmount threads)
    "runner.reaper": set(),
    "runner.state_id": set(),  # the runner folder's state id (E9)
    "runner.volume": set(),  # the file system under the runner's folder (§76)
    "runner.kept": set(),  # a bounded memo of paths derived from ids
    "runner.own_mounts": {"runner.reaper"},
    # its overlay mount, the linger; a holder kept by pid and start time without a pidfd
    "runner.prefix_mounts": {"runner.own_mounts", "runner.processes", "runner.reaper"},
    "runner.tool_mounts": {"runner.own_mounts"},  # a package tool's writable overlays
    "runner.snapshots": {
        "runner.kept",
        "runner.own_mounts",
        "runner.protocol",
        "runner.workspace_paths",
    },
    "runner.edits": {"runner.protocol", "runner.snapshots", "runner.workspace_paths"},
    "runner.network": {"runner.kept", "runner.processes"},
    "runner.limits": {
        "runner.protocol",
        "runner.processes",
        "runner.reaper",  # the cgroup tree's removal thread
        "runner.workspace_paths",
    },
    "runner.sandbox": {
        "runner.limits",
        "runner.reaper",  # the clean namespace's follower (sandbox/clean_namespace.py)
        "runner.network",
        "runner.own_mounts",
        "runner.policy",
        "runner.prefix_mounts",
        "runner.processes",
        "runner.protocol",
        "runner.snapshots",
        "runner.tool_mounts",
    },
    "runner.environments": {
        "runner.edits",
        "runner.limits",  # package tools are held to the free-space reserve
        "runner.network",  # an operator's base build starts its own egress proxy
        "runner.own_mounts",  # whether an operator build may mount its tools' overlays
        "runner.policy",
        "runner.processes",
        "runner.protocol",
        "runner.sandbox",
        "runner.snapshots",
        "runner.tool_mounts",
        "runner.workspace_paths",  # a base's copies: descriptor flags and copy_fd
    },
    # a runner's close, every step taken; the egress proxy's step
    "runner.closing": {"runner.network"},
    "runner.local": {
        "runner.closing",
        "runner.edits",
        "runner.kept",
        "runner.environments",
        "runner.limits",
        "runner.network",
        "runner.own_mounts",
        "runner.prefix_mounts",
        "runner.processes",
        "runner.protocol",
        "runner.sandbox",
        "runner.snapshots",
        "runner.state_id",
        "runner.volume",
        "runner.tool_mounts",
    },
    "runner.transport": {"runner.limits", "runner.local", "runner.policy", "runner.protocol"},
    # control/: services that never import each other sideways except as drawn; plane.py
    # builds them all, each given its collaborators; replicas/ builds their publish hooks and
    # hands the fan-out's messages to them.
    "control.agents": set(),
    "control.tokens": {"control.agents"},  # a session token checks its agent's session
    "control.metrics": set(),
    "control.runners": set(),
    "control.notify": {"control.agents"},
    "control.executions": {"control.agents", "control.runners"},
    "control.files": {"control.executions", "control.runners"},
    "control.environments": {"control.agents", "control.executions", "control.runners"},
    "control.ports": {"control.files"},
    "control.retention": {"control.files", "control.runners"},
    "control.replicas": {
        "control.environments",
        "control.executions",
        "control.files",
        "control.metrics",
        "control.notify",
    },
    "control.panel": {
        "control.executions",
        "control.files",
        "control.notify",
        "control.plane",  # type-only: the plane it reads through
        "control.tokens",
    },
    "control.plane": {
        "control.agents",
        "control.environments",
        "control.executions",
        "control.files",
        "control.metrics",
        "control.notify",
        "control.ports",
        "control.replicas",
        "control.retention",
        "control.runners",
        "control.tokens",
    },
}

#: A folder holds at most this many modules: beyond it, it wants rooms of its own.
MAX_MODULES_PER_FOLDER = 20


@dataclass(frozen=True)
class Edge:
    source: str  # module name without the package prefix, e.g. "control.plane"
    target: str
    line: int
    in_function: bool


@cache
def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        if "migrations" in path.parts:  # Alembic's scripts, loaded by Alembic, not imported
            continue
        parts = list(path.relative_to(SRC / PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _function_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for sub in ast.walk(node):
                if isinstance(sub, ast.Import | ast.ImportFrom):
                    lines.add(sub.lineno)
    return lines


@cache
def _all_edges() -> list[Edge]:
    return list(_walk(_modules()))


def _walk(modules: dict[str, Path]) -> Iterator[Edge]:
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        in_function = _function_lines(tree)
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = f"{PACKAGE}.{name}".split(".")
                    if not _is_package(path):
                        anchor = anchor[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            for target in targets:
                if target != PACKAGE and not target.startswith(f"{PACKAGE}."):
                    continue
                short = target.removeprefix(PACKAGE).removeprefix(".") or "__init__"
                if short in modules and short != name:
                    yield Edge(name, short, node.lineno, node.lineno in in_function)


def _layer(module: str) -> str:
    return module.split(".")[0]


def _broken(edge: Edge) -> bool:
    source, target = _layer(edge.source), _layer(edge.target)
    if source == target or target == "__init__":  # ``from shellyard import __version__``
        return False
    if target not in ALLOWED[source]:
        return True
    # control/ sees runner/ only through its protocol (and the PASSAGES above).
    return source == "control" and target == "runner" and edge.target != "runner.protocol"


def _allowed_anyway(edge: Edge) -> bool:
    pair = (edge.source, edge.target)
    return pair in PASSAGES or (pair in LAUNCHES and edge.in_function)


def test_every_layer_of_the_tree_has_a_rule() -> None:
    layers = {_layer(m) for m in _modules()}
    assert layers == set(ALLOWED), (
        "a folder or top-level module without a rule in ALLOWED (and docs/architecture.md): "
        f"{sorted(layers ^ set(ALLOWED))}"
    )


def test_no_import_crosses_the_layers() -> None:
    modules = _modules()
    broken = sorted(
        f"{modules[e.source].relative_to(SRC)}:{e.line} imports shellyard.{e.target}"
        for e in _all_edges()
        if _broken(e) and not _allowed_anyway(e) and (e.source, e.target) not in KNOWN_EXCEPTIONS
    )
    assert not broken, (
        "imports that break the layering of docs/architecture.md (move the shared piece down a "
        "layer, or pass it in from the wiring):\n" + "\n".join(broken)
    )


def _room(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] not in ("runner", "control") or len(parts) < 2:
        return None
    return ".".join(parts[:2])


def _room_edges() -> set[tuple[str, str]]:
    pairs: set[tuple[str, str]] = set()
    for e in _all_edges():
        source, target = _room(e.source), _room(e.target)
        if source and target and source != target and _layer(source) == _layer(target):
            pairs.add((source, target))
    return pairs


def test_every_room_has_a_rule() -> None:
    rooms = {r for m in _modules() if (r := _room(m))}
    assert rooms == set(ROOMS), (
        "a room of runner/ or control/ without a rule in ROOMS (and docs/architecture.md), or a "
        f"rule for a room that is gone: {sorted(rooms ^ set(ROOMS))}"
    )


def test_rooms_import_only_the_rooms_drawn() -> None:
    broken = sorted(f"{a} imports {b}" for a, b in _room_edges() if b not in ROOMS[a])
    assert not broken, (
        "imports between rooms that docs/architecture.md does not draw (add the arrow there and "
        "in ROOMS, or move the shared piece down):\n" + "\n".join(broken)
    )


def test_no_circle_between_rooms() -> None:
    graph: dict[str, set[str]] = {r: set() for r in ROOMS}
    for a, b in _room_edges():
        graph[a].add(b)
    assert not _circles(graph), f"rooms importing each other: {_circles(graph)}"


def test_no_folder_holds_more_than_its_share_of_modules() -> None:
    counts: dict[Path, int] = {}
    for path in (SRC / PACKAGE).rglob("*.py"):
        if path.name != "__init__.py" and "migrations" not in path.parts:
            counts[path.parent] = counts.get(path.parent, 0) + 1
    crowded = sorted(
        f"{p.relative_to(SRC)}: {n} modules"
        for p, n in counts.items()
        if n > MAX_MODULES_PER_FOLDER
    )
    assert not crowded, "folders that want rooms of their own:\n" + "\n".join(crowded)


def test_known_exceptions_still_exist() -> None:
    pairs = {(e.source, e.target) for e in _all_edges()}
    gone = sorted(KNOWN_EXCEPTIONS - pairs)
    assert not gone, f"no longer imported, delete from KNOWN_EXCEPTIONS: {gone}"


def test_launched_servers_are_imported_only_where_they_run() -> None:
    eager = [
        f"{e.source} imports {e.target} at module level (import it inside the verb)"
        for e in _all_edges()
        if (e.source, e.target) in LAUNCHES and not e.in_function
    ]
    assert not eager, "\n".join(eager)


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circle() -> None:
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for edge in _all_edges():
        if not _is_package(modules[edge.target]):
            graph[edge.source].add(edge.target)
    circles = _circles(graph)
    new = [c for c in circles if c not in KNOWN_CIRCLES]
    assert not new, "import circles (type-only imports count):\n" + "\n".join(
        " <-> ".join(c) for c in new
    )
    gone = [c for c in KNOWN_CIRCLES if c not in circles]
    assert not gone, f"circles no longer there, delete from KNOWN_CIRCLES: {gone}"


def test_the_circle_search_finds_a_circle() -> None:
    """The guard itself: a made-up graph with one circle and one chain."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _circles(graph) == [["a", "b", "c"]]
