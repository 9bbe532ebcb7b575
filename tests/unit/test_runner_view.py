"""The runner view's limits are a typed model (R2 limits in the R1 runner view): MCP's output
schema describes each field, and the JSON on the wire is what it was as an untyped dict."""

from __future__ import annotations

import json

from shellyard.contract.runners import RunnerLimits, RunnerView
from shellyard.mcp.runners import runner_tools
from shellyard.runner.protocol import RunnerLimits as ProtocolLimits

LIMITS = {
    "workspace_quota_bytes": 3 << 30,
    "quota_mechanism": "watch",
    "quota_margin_bytes": 1 << 20,
    "log_limit_bytes": 0,
    "free_space_reserve_bytes": 1 << 30,
    "free_space_bytes": 50 << 30,
    "max_cpu_seconds": None,
    "max_memory_bytes": 4 << 30,
    "max_file_size_bytes": 1 << 40,
    "max_processes": 512,
    "max_open_files": 1024,
    "enforcement": "rlimits",
    "cgroup": None,
    # R2 tenants (docs/limits.md "Tenants")
    "memory_scope": "none (no cgroup)",
    "process_scope": "per uid (RLIMIT_NPROC)",
    "cpu_share": "per process (no cgroup)",
    "cpu_ceiling": None,
    "uids": "one per workspace (61001-61999)",
    "group_moves": None,  # no cgroup (docs/limits.md "Moving into a group under load")
    "base_sharing": "copies (SHELLYARD_BASE_SHARING=auto)",  # docs/environments.md
}


class _NoRunners:
    async def runners(self) -> list[RunnerView]:
        return []


def test_runner_list_output_schema_describes_the_limits() -> None:
    schema = runner_tools(_NoRunners())[0].output_schema
    assert schema is not None
    limits = schema["$defs"]["RunnerLimits"]
    assert set(limits["properties"]) == set(LIMITS)
    assert limits["properties"]["max_processes"]["type"] == "integer"
    view = schema["$defs"]["RunnerView"]["properties"]["limits"]
    assert {"$ref": "#/$defs/RunnerLimits"} in view["anyOf"]


def test_the_wire_form_is_unchanged() -> None:
    """A view as the server sent it with a dict of limits parses into the model and dumps back
    to the same JSON; the runner protocol's RunnerLimits is the same class."""
    wire = {"runner_id": "far", "kind": "ssh", "address": "ssh://u@h/s", "limits": LIMITS}
    view = RunnerView.model_validate_json(json.dumps(wire))
    assert isinstance(view.limits, RunnerLimits) and view.limits.max_open_files == 1024
    assert json.loads(view.model_dump_json())["limits"] == LIMITS
    assert ProtocolLimits is RunnerLimits
