"""The doors do work of their own: at most 15% of any door's functions are forwarders
(docs/architecture.md "The doors").

A *forwarder* is a function or method whose body, after an optional docstring, is one call -
``return f(...)``, ``return await f(...)``, ``await f(...)`` or ``f(...)`` - whose arguments are
exactly its own parameters passed on (by position, by keyword, ``*args``/``**kwargs``), each at
most once, and whose every parameter is used (as an argument, or in the called expression:
``cp.executions.start(body, agent)`` forwards a handler's ``cp``, ``body`` and ``agent``). Such a
layer adds a name and a signature to keep in step and nothing else: an operation that only
forwards is declared once, in a table its door derives its routes or methods from.

``self`` and ``cls`` need not be used. Every ``def`` counts, nested ones too; lambdas do not.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "shellyard"
DOORS = ("api", "sdk", "web", "mcp", "cli", "shell_call")
LIMIT = 0.15

Function = ast.FunctionDef | ast.AsyncFunctionDef


def _parameters(function: Function) -> list[str]:
    arguments = function.args
    names = [a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)]
    names += [a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None]
    return names


def _single_call(function: Function) -> ast.Call | None:
    body = function.body
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        body = body[1:]
    if len(body) != 1:
        return None
    statement = body[0]
    value: ast.expr | None
    if isinstance(statement, ast.Return | ast.Expr):
        value = statement.value
    else:
        return None
    if isinstance(value, ast.Await):
        value = value.value
    return value if isinstance(value, ast.Call) else None


def is_forwarder(function: Function) -> bool:
    call = _single_call(function)
    if call is None:
        return False
    parameters = _parameters(function)
    passed: list[str] = []
    for argument in call.args:
        inner = argument.value if isinstance(argument, ast.Starred) else argument
        if not (isinstance(inner, ast.Name) and inner.id in parameters):
            return False
        passed.append(inner.id)
    for keyword in call.keywords:
        if not (isinstance(keyword.value, ast.Name) and keyword.value.id in parameters):
            return False
        passed.append(keyword.value.id)
    if len(passed) != len(set(passed)):
        return False
    in_callee = {node.id for node in ast.walk(call.func) if isinstance(node, ast.Name)}
    used = set(passed) | in_callee
    return all(name in used for name in parameters if name not in ("self", "cls"))


@dataclass(frozen=True)
class Count:
    door: str
    functions: int
    forwarders: list[str]

    @property
    def share(self) -> float:
        return len(self.forwarders) / self.functions if self.functions else 0.0

    def line(self) -> str:
        return f"{self.door}: {len(self.forwarders)}/{self.functions} = {self.share:.0%} forwarders"


def count(door: str) -> Count:
    functions = 0
    forwarders: list[str] = []
    for path in sorted((SRC / door).rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                functions += 1
                if is_forwarder(node):
                    forwarders.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name}")
    return Count(door, functions, forwarders)


def _function(source: str) -> Function:
    node = ast.parse(source).body[0]
    assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    return node


def test_a_forwarder_is_one_call_passing_its_parameters_on() -> None:
    forwarders = [
        "def f(self, a, b):\n    return self._inner.f(a, b)",
        "async def f(self, a):\n    'doc'\n    return await self._inner.f(path=a)",
        "async def f(body, agent, cp):\n    return await cp.executions.start(body, agent)",
        "def f(*args, **kwargs):\n    g(*args, **kwargs)",
        "def close(self):\n    self._client.close()",
    ]
    others = [
        # something of its own: a constant, a built value, a parameter dropped or doubled
        "def f(self, a):\n    return self._get('/x', a)",
        "def f(self, a):\n    return self._inner.f(Model(a=a))",
        "def f(self, a, b):\n    return self._inner.f(a)",
        "def f(self, a):\n    return self._inner.f(a, a)",
        "def f(self, a):\n    x = a\n    return self._inner.f(x)",
        "def f(self, a):\n    return a.b",
    ]
    assert [is_forwarder(_function(s)) for s in forwarders] == [True] * len(forwarders)
    assert [is_forwarder(_function(s)) for s in others] == [False] * len(others)


def test_no_door_is_mostly_forwarding() -> None:
    counts = [count(door) for door in DOORS]
    assert all(c.functions for c in counts), "a door folder has no function: renamed?"
    over = [c for c in counts if c.share > LIMIT]
    assert not over, (
        f"at most {LIMIT:.0%} of a door's functions may only forward:\n"
        + "\n".join(c.line() for c in counts)
        + "\n\n"
        + "\n".join(f for c in over for f in c.forwarders)
    )
