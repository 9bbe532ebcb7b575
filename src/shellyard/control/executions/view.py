"""An execution record as the contract shows it (``ExecutionView``): one conversion for the
execution service and the panel."""

from __future__ import annotations

from typing import Any

from shellyard.contract.executions import (
    ExecutionPolicyView,
    ExecutionState,
    ExecutionView,
    RunShellResult,
)
from shellyard.control.executions import options
from shellyard.store.executions import Execution


def execution_view(row: Execution) -> ExecutionView:
    """The contract's view of an execution record (every door shows this)."""
    return ExecutionView(**_view_fields(row))


def run_shell_result(row: Execution) -> RunShellResult:
    """The same view as run_shell's answer (output filled in by the caller), validated once
    from the record instead of built as a view and copied."""
    return RunShellResult(**_view_fields(row))


def _view_fields(row: Execution) -> dict[str, Any]:
    terminal = options.terminal_fields(options.of(row))
    return dict(
        execution_id=row.id,
        state=ExecutionState(row.state),
        exit_code=row.exit_code,
        environment_id=row.environment_id,
        environment_revision=row.environment_revision,
        waiting_for=row.waiting_for,
        agent_id=row.agent_id,
        workspace_id=row.workspace_id,
        runner_id=row.runner_id,
        command=row.command,
        script_path=row.script_path,
        background=row.background,
        error=row.error,
        snapshot_seq=row.snapshot_seq,
        was_unknown=row.was_unknown,
        cancel_requested=row.cancel_requested,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        policy=(
            ExecutionPolicyView.model_validate_json(row.sandbox_policy)
            if row.sandbox_policy
            else None
        ),
        logs_pruned_at=row.logs_pruned_at,
        read_only=row.read_only,
        limit=row.ended_by_limit,
        peak_memory_bytes=row.peak_memory_bytes,
        cpu_seconds=row.cpu_seconds,
        interactive=terminal["interactive"],
        tty=terminal["tty"],
    )
