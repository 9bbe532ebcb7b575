"""One ``from_row`` for every record (docs/architecture.md "Records at the store boundary"):
a frozen dataclass is built from a row over ``dataclasses.fields``, each field converted by
what its annotation says. Each class's plan is written out once as one function and cached
(``_builder``), since this runs for every row read (docs/benchmarks.md §30).

What each annotation does with a column's value, the same on SQLite and PostgreSQL:

- ``str``, ``int``, ``float``: ``str(v)``, ``int(v)``, ``float(v)``, only when ``v`` is not of
  that class already (times are UNIX seconds
  stored as ``Float``; a ``BigInteger`` comes back as ``int`` on both).
- ``bool``: ``bool(v)`` (SQLAlchemy's ``Boolean`` gives ``bool`` on both; a raw SQLite 0/1
  from a text statement is turned to one too).
- ``dict[...]`` / ``list[...]``: a ``JSON`` column comes back decoded on both; a ``Text``
  column holding JSON, when its field is typed so, is decoded here (``Execution``'s
  ``run_options`` is kept as its text); ``None`` gives ``{}`` / ``[]``.
- ``X | None``: ``None`` stays ``None``, anything else goes through ``X``'s converter.
- ``Literal[...]``, ``Any`` and any other annotation: the value as it is.

A column that is ``None`` or absent from the row takes the field's default when it has one
(a value an operation adds beside the columns, such as N6's ``timers_cancelled``).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar, Union

T = TypeVar("T")

Converter = Callable[[Any], Any]


@dataclasses.dataclass(frozen=True, slots=True)
class _Field:
    name: str
    #: None: the value as it is.
    convert: Converter | None
    #: What a NULL column gives: None for ``X | None``, ``{}``/``[]`` for JSON, else an error.
    on_null: Callable[[], Any] | None
    #: The field has a default, taken for a NULL or absent column.
    has_default: bool


Builder = Callable[[Mapping[str, Any]], Any]
_BUILDERS: dict[type[Any], Builder] = {}


def from_row(cls: type[T], row: Mapping[str, Any]) -> T:
    """The record ``cls`` (a dataclass) of ``row``."""
    build = _BUILDERS.get(cls)
    if build is None:
        build = _BUILDERS[cls] = _builder(cls)
    return typing.cast(T, build(row))


def from_rows(cls: type[T], rows: Iterable[Mapping[str, Any]]) -> list[T]:
    return [from_row(cls, row) for row in rows]


def maybe(cls: type[T], row: Mapping[str, Any] | None) -> T | None:
    return None if row is None else from_row(cls, row)


def field_names(cls: type[Any], among: Iterable[str] | None = None) -> tuple[str, ...]:
    """The record's fields, in order; with ``among`` (a view's fields, D3) only those the
    view declares too, so a view is built from the record over one shared list."""
    names = tuple(f.name for f in dataclasses.fields(cls))
    if among is None:
        return names
    wanted = set(among)
    return tuple(n for n in names if n in wanted)


def values_of(record: Any, names: Iterable[str]) -> dict[str, Any]:
    """The record's values of ``names`` (from ``field_names``), for a view's ``model_validate``."""
    return {name: getattr(record, name) for name in names}


def _plan(cls: type[Any]) -> tuple[_Field, ...]:
    hints = typing.get_type_hints(cls)
    plan = []
    for field in dataclasses.fields(cls):
        has_default = (
            field.default is not dataclasses.MISSING
            or field.default_factory is not dataclasses.MISSING
        )
        convert, on_null = _converter(hints[field.name])
        plan.append(_Field(field.name, convert, on_null, has_default))
    return tuple(plan)


_SCALARS = (str, int, float, bool)


def _builder(cls: type[Any]) -> Builder:
    """The plan of ``cls`` written out once as one function, as ``dataclasses`` writes an
    ``__init__``: a read of each column and its value set, a scalar converted only when the
    database did not already give that type. This runs for every row read; a loop over the
    plan calling ``cls`` cost about three times as much (docs/benchmarks.md §30)."""
    scope: dict[str, Any] = {"cls": cls, "_refuse": _refuse, "new": object.__new__}
    # A frozen dataclass with slots is filled through its slots' descriptors, as its own
    # ``__init__`` does through ``object.__setattr__`` (half the cost again); a class with
    # a ``__post_init__`` or without slots is called.
    direct = "__slots__" in cls.__dict__ and not hasattr(cls, "__post_init__")
    lines = ["def build(row):", "    get = row.get"]
    if direct:
        lines.append("    record = new(cls)")
    keywords = []
    for i, field in enumerate(_plan(cls)):
        v = f"v{i}"
        lines.append(f"    {v} = get({field.name!r})")
        if field.convert is None:
            value = v
        elif field.convert in _SCALARS:
            scope[f"t{i}"] = field.convert
            value = f"{v} if {v}.__class__ is t{i} else t{i}({v})"
        else:
            scope[f"c{i}"], value = field.convert, f"c{i}({v})"
        if field.has_default:  # the field's default for a NULL or absent column
            found = next(f for f in dataclasses.fields(cls) if f.name == field.name)
            if found.default is not dataclasses.MISSING:
                scope[f"d{i}"], null = found.default, f"d{i}"
            else:
                scope[f"d{i}"], null = found.default_factory, f"d{i}()"
        elif field.on_null is _null:
            null = "None"
        elif field.on_null is not None:
            scope[f"n{i}"], null = field.on_null, f"n{i}()"
        else:
            null = f"_refuse(cls, {field.name!r})"
        if direct:
            scope[f"s{i}"] = cls.__dict__[field.name].__set__
            lines.append(f"    s{i}(record, ({null}) if {v} is None else ({value}))")
        else:
            keywords.append(f"{field.name}=({null}) if {v} is None else ({value})")
    lines.append("    return record" if direct else f"    return cls({', '.join(keywords)})")
    # The names written are a dataclass's field names (identifiers), never input.
    exec("\n".join(lines), scope)
    return typing.cast(Builder, scope["build"])


def _refuse(cls: type[Any], name: str) -> Any:
    raise TypeError(f"{cls.__name__}.{name}: NULL in a field that is not optional")


def _converter(annotation: Any) -> tuple[Converter | None, Callable[[], Any] | None]:
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        inner = _converter(args[0])[0] if len(args) == 1 else None
        return inner, _null
    if annotation in (str, int, float, bool):
        return typing.cast(Converter, annotation), None
    if annotation is dict or origin is dict:
        return _json_dict, dict
    if annotation is list or origin is list:
        return _json_list, list
    # Literal[...], Any, anything else: the value as it is.
    return None, None


def _null() -> None:
    return None


def _json_dict(value: Any) -> dict[Any, Any]:
    return dict(json.loads(value) if isinstance(value, str | bytes) else value)


def _json_list(value: Any) -> list[Any]:
    return list(json.loads(value) if isinstance(value, str | bytes) else value)
