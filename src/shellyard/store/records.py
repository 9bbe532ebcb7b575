"""One ``from_row`` for every record (docs/architecture.md "Records at the store boundary"):
a frozen dataclass is built from a row over ``dataclasses.fields``, each field converted by
what its annotation says. The converters are resolved once per class and cached, since this
runs for every row read.

What each annotation does with a column's value, the same on SQLite and PostgreSQL:

- ``str``, ``int``, ``float``: ``str(v)``, ``int(v)``, ``float(v)`` (times are UNIX seconds
  stored as ``Float``; a ``BigInteger`` comes back as ``int`` on both).
- ``bool``: ``bool(v)`` (SQLAlchemy's ``Boolean`` gives ``bool`` on both; a raw SQLite 0/1
  from a text statement is turned to one too).
- ``dict[...]`` / ``list[...]``: a ``JSON`` column comes back decoded on both; a ``Text``
  column holding JSON (``executions.run_options``) is decoded here; ``None`` gives ``{}`` /
  ``[]``.
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


_PLANS: dict[type[Any], tuple[_Field, ...]] = {}


def from_row(cls: type[T], row: Mapping[str, Any]) -> T:
    """The record ``cls`` (a dataclass) of ``row``."""
    plan = _PLANS.get(cls)
    if plan is None:
        plan = _PLANS[cls] = _plan(cls)
    values: dict[str, Any] = {}
    for field in plan:
        value = row.get(field.name)
        if value is not None:
            values[field.name] = value if field.convert is None else field.convert(value)
        elif field.has_default:
            continue  # the field's default
        elif field.on_null is not None:
            values[field.name] = field.on_null()
        else:
            raise TypeError(f"{cls.__name__}.{field.name}: NULL in a field that is not optional")
    return cls(**values)


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
