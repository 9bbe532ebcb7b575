"""Tables of the control plane. Times are UNIX seconds (float) so both databases agree."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

metadata = MetaData()

sessions = Table(
    "sessions",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("state", String(16), nullable=False),
    Column("main_agent_id", String(64), nullable=True),
    Column("is_default", Boolean, nullable=False, default=False),
    Column("created_at", Float, nullable=False),
)

agents = Table(
    "agents",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("session_id", String(64), ForeignKey("sessions.id"), nullable=False),
    Column("parent_id", String(64), ForeignKey("agents.id"), nullable=True),
    Column("state", String(16), nullable=False),
    Column("gate", String(16), nullable=False),
    Column("created_at", Float, nullable=False),
)

runners = Table(
    "runners",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("kind", String(16), nullable=False),
    Column("address", Text, nullable=True),
    Column("token", Text, nullable=True),
    Column("state", String(16), nullable=False),
    Column("created_at", Float, nullable=False),
)

workspaces = Table(
    "workspaces",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("agent_id", String(64), ForeignKey("agents.id"), nullable=False),
    Column("runner_id", String(64), ForeignKey("runners.id"), nullable=False),
    Column("head_seq", Integer, nullable=False, default=0),
    # W1: the single writer. ``writer_id`` names the operation (execution id, ...).
    Column("writer_kind", String(16), nullable=True),
    Column("writer_id", String(64), nullable=True),
    Column("created_at", Float, nullable=False),
    UniqueConstraint("agent_id", "runner_id", name="uq_workspace_agent_runner"),
)

executions = Table(
    "executions",
    metadata,
    Column("id", String(64), primary_key=True),
    # Submission order, used to run queued writers in the order they asked (W1).
    Column("seq", Integer, nullable=False),
    Column("agent_id", String(64), ForeignKey("agents.id"), nullable=False),
    Column("workspace_id", String(64), ForeignKey("workspaces.id"), nullable=False),
    Column("runner_id", String(64), ForeignKey("runners.id"), nullable=False),
    Column("environment_id", String(64), nullable=True),
    Column("environment_revision", Integer, nullable=True),
    Column("command", Text, nullable=True),
    Column("script_path", Text, nullable=True),
    Column("background", Boolean, nullable=False),
    Column("idempotency_key", String(128), nullable=True),
    Column("state", String(16), nullable=False),
    Column("exit_code", Integer, nullable=True),
    Column("error", Text, nullable=True),
    Column("cancel_requested", Boolean, nullable=False, default=False),
    # E9: consecutive retryable status-query failures, and whether it was ever unknown.
    Column("query_failures", Integer, nullable=False, default=0),
    Column("was_unknown", Boolean, nullable=False, default=False),
    Column("snapshot_seq", Integer, nullable=True),
    Column("created_at", Float, nullable=False),
    Column("started_at", Float, nullable=True),
    Column("finished_at", Float, nullable=True),
    UniqueConstraint("agent_id", "idempotency_key", name="uq_execution_idempotency"),
)
Index("ix_executions_state", executions.c.state)
Index("ix_executions_workspace_state", executions.c.workspace_id, executions.c.state)

snapshots = Table(
    "snapshots",
    metadata,
    Column("workspace_id", String(64), ForeignKey("workspaces.id"), primary_key=True),
    Column("seq", Integer, primary_key=True),
    Column("root_hash", String(64), nullable=False),
    Column("made_by_kind", String(16), nullable=False),
    Column("made_by_id", String(64), nullable=True),
    Column("files", Integer, nullable=False),
    Column("bytes", Integer, nullable=False),
    Column("created_at", Float, nullable=False),
)

notices = Table(
    "notices",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("agent_id", String(64), ForeignKey("agents.id"), nullable=False),
    Column("kind", String(32), nullable=False),
    Column("subject_id", String(64), nullable=False),
    Column("summary", Text, nullable=False),
    Column("payload", JSON, nullable=True),
    Column("created_at", Float, nullable=False),
    Column("read_at", Float, nullable=True),
    Column("woke_at", Float, nullable=True),
    UniqueConstraint("kind", "subject_id", name="uq_notice_subject"),
)
Index("ix_notices_agent_unread", notices.c.agent_id, notices.c.read_at)
