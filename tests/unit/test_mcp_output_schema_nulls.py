"""A result's outputSchema writes an optional field as ``type: [X, "null"]``, not
``anyOf: [{type: X}, {type: "null"}]`` (mcp/compact.py; docs/benchmarks.md §55): the same
values are accepted and refused, and a client that validates every result (the mcp package's
does) spends less on it. Checked against jsonschema itself, on every tool's real schema."""

from __future__ import annotations

import json
from typing import Any

import pytest
from jsonschema.validators import validator_for

from shellyard.contract.executions import RunShellResult
from shellyard.mcp.common import output_schema
from shellyard.mcp.compact import _null_as_type

#: Values of every JSON type, to compare what two schemas accept.
PROBES: list[Any] = [None, 0, 3, 2.5, "", "x", True, [], [1], {}, {"network": "off"}]


def accepted(schema: dict[str, Any], value: Any) -> bool:
    return validator_for(schema)(schema).is_valid(value)


@pytest.mark.parametrize(
    "node",
    [
        {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
        {"anyOf": [{"type": "null"}, {"type": "number", "minimum": 1}]},
        {"anyOf": [{"type": "object", "properties": {"network": {"type": "string"}},
                    "required": ["network"]}, {"type": "null"}]},
        # not rewritten: enum and const constrain every type (null would be refused)
        {"anyOf": [{"type": "string", "enum": ["a", "x"]}, {"type": "null"}]},
        {"anyOf": [{"$ref": "#/$defs/X"}, {"type": "null"}], "$defs": {"X": {"type": "string"}}},
        {"anyOf": [{"type": "integer"}, {"type": "string"}, {"type": "null"}]},
    ],
)  # fmt: skip
def test_the_rewritten_schema_accepts_exactly_the_same_values(node: dict[str, Any]) -> None:
    made = _null_as_type(node)
    for value in PROBES:
        assert accepted(made, value) == accepted(node, value), (made, value)


def test_enum_and_ref_branches_keep_their_any_of() -> None:
    enum = {"anyOf": [{"type": "string", "enum": ["a"]}, {"type": "null"}]}
    assert _null_as_type(enum) == enum
    assert accepted(enum, None) and not accepted({"type": ["string", "null"], "enum": ["a"]}, None)


def test_run_shell_s_output_schema_has_no_null_union_left_and_validates_a_result() -> None:
    schema = output_schema(RunShellResult)

    def unions(node: Any) -> list[Any]:
        """Every ``anyOf`` of a bare type and null left in ``node``."""
        if isinstance(node, list):
            return [u for item in node for u in unions(item)]
        if not isinstance(node, dict):
            return []
        here = node.get("anyOf")
        simple = (
            isinstance(here, list)
            and len(here) == 2
            and {"type": "null"} in here
            and all(set(option) == {"type"} for option in here)
        )
        return ([node] if simple else []) + [u for v in node.values() for u in unions(v)]

    assert unions(schema) == []
    assert schema["properties"]["exit_code"]["type"] == ["integer", "null"]
    result = RunShellResult.model_validate(
        {"execution_id": "ex_1", "state": "completed", "exit_code": None, "agent_id": "a",
         "workspace_id": "w", "runner_id": "local", "created_at": 1.0, "stdout": "",
         "stderr": ""}
    )  # fmt: skip
    data = json.loads(result.model_dump_json())
    assert accepted(schema, data)
    assert accepted(schema, {**data, "exit_code": 0, "policy": None})
    assert not accepted(schema, {**data, "exit_code": "zero"})
    assert not accepted(schema, {**data, "started_at": "soon"})
