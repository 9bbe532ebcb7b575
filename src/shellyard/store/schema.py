"""Tables of the control plane. Times are UNIX seconds (float) so both databases agree."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy import (
    JSON,
    BigInteger,
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

from shellyard.paths import STORED_MARK, escape, not_utf8, unescape


class StoredPath(sa.types.TypeDecorator[str]):
    """A workspace path column: names that are not UTF-8 stored as ``/`` + ``escape``."""

    impl = sa.Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: sa.Dialect) -> str | None:
        if value is None or not not_utf8(value):
            return value
        return STORED_MARK + escape(value)

    def process_result_value(self, value: str | None, dialect: sa.Dialect) -> str | None:
        if value is None or not value.startswith(STORED_MARK):
            return value
        return unescape(value[len(STORED_MARK) :])


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
    # V5: the environment change a queued execution waits for (revision 0004_environments).
    Column("waiting_for", String(64), nullable=True),
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
    # JSON of the sandbox policy it ran under (migration 0006).
    Column("sandbox_policy", Text, nullable=True),
    # Retention: set when the runner deleted this execution's logs (revision 0006_retention).
    Column("logs_pruned_at", Float, nullable=True),
    # W2: a reader beside the writer, on the committed snapshot (revision 0007_read_only).
    Column("read_only", Boolean, nullable=False, default=False),
    # R2 tenants (revision 0011_execution_usage): the limit that ended it (``memory``,
    # ``quota``, ``cpu``, ``file_size`` …) and what its cgroup measured.
    Column("ended_by_limit", String(16), nullable=True),
    Column("peak_memory_bytes", BigInteger, nullable=True),
    Column("cpu_seconds", Float, nullable=True),
    # E1 options (revision 0012_run_options): JSON of timeout_ms, env, cwd, args.
    Column("run_options", Text, nullable=True),
    # E9 (revision 0015_runner_state): the runner's state id (runner/state_id.py) a start whose
    # answer never came was sent to; its runner's NO_TRACE reads "never started" only from it.
    Column("runner_state", String(64), nullable=True),
    UniqueConstraint("agent_id", "idempotency_key", name="uq_execution_idempotency"),
)
Index("ix_executions_state", executions.c.state)
Index("ix_executions_finished_at", executions.c.finished_at)
Index("ix_executions_workspace_state", executions.c.workspace_id, executions.c.state)
# every submit's max(seq) + 1 and the listings by submission order (revision 0014_executions_seq)
Index("ix_executions_seq", executions.c.seq)

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
    # Retention: set when the runner deleted this snapshot's manifest (revision 0003_files).
    Column("pruned_at", Float, nullable=True),
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
    # The wake that delivered it (N2), set with woke_at: each notice is woken at most once.
    Column("wake_id", String(64), nullable=True),
    UniqueConstraint("kind", "subject_id", name="uq_notice_subject"),
)
Index("ix_notices_agent_unread", notices.c.agent_id, notices.c.read_at)

# ---------------------------------------------------------------------- sessions, wakes, timers
# (N1–N11; revision 0002_sessions)

#: Every lifecycle change of a session or one of its agents (N8–N11), in order.
session_events = Table(
    "session_events",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("session_id", String(64), ForeignKey("sessions.id"), nullable=False),
    Column("agent_id", String(64), nullable=True),
    Column("kind", String(32), nullable=False),
    Column("detail", JSON, nullable=True),
    Column("created_at", Float, nullable=False),
)
Index("ix_session_events_session", session_events.c.session_id, session_events.c.seq)

#: One-time reminders (N5–N7). ``state``: pending, then fired or cancelled, never back.
timers = Table(
    "timers",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("agent_id", String(64), ForeignKey("agents.id"), nullable=False),
    Column("session_id", String(64), ForeignKey("sessions.id"), nullable=False),
    Column("text", Text, nullable=False),
    # What the caller gave: {"after_ms": n} or {"at": "..."}; fire_at is the UTC instant.
    Column("spec", JSON, nullable=False),
    Column("fire_at", Float, nullable=False),
    Column("execution_id", String(64), nullable=True),
    Column("state", String(16), nullable=False),
    Column("late", Boolean, nullable=False, default=False),
    Column("cancel_reason", Text, nullable=True),
    Column("created_at", Float, nullable=False),
    Column("fired_at", Float, nullable=True),
    Column("cancelled_at", Float, nullable=True),
)
Index("ix_timers_state_fire_at", timers.c.state, timers.c.fire_at)
Index("ix_timers_agent", timers.c.agent_id)
Index("ix_timers_execution", timers.c.execution_id)

#: Webhook channels for wakes; ``session_id`` None means every session.
webhooks = Table(
    "webhooks",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("session_id", String(64), ForeignKey("sessions.id"), nullable=True),
    Column("url", Text, nullable=False),
    Column("secret", Text, nullable=False),
    Column("active", Boolean, nullable=False, default=True),
    Column("created_at", Float, nullable=False),
)

#: Emitted wakes (N2). ``seq`` orders them (the SSE event id); ``payload`` is the exact body
#: every channel gets, so a retry or a replay sends the same bytes.
wakes = Table(
    "wakes",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", String(64), nullable=False, unique=True),
    Column("session_id", String(64), ForeignKey("sessions.id"), nullable=False),
    Column("agent_id", String(64), ForeignKey("agents.id"), nullable=False),
    Column("reason", String(16), nullable=False),
    Column("payload", JSON, nullable=False),
    Column("created_at", Float, nullable=False),
)
Index("ix_wakes_session", wakes.c.session_id, wakes.c.seq)

#: One webhook delivery of one wake: pending (retried with backoff), delivered or failed.
wake_deliveries = Table(
    "wake_deliveries",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("wake_id", String(64), ForeignKey("wakes.id"), nullable=False),
    Column("webhook_id", String(64), ForeignKey("webhooks.id"), nullable=False),
    Column("state", String(16), nullable=False),
    Column("attempts", Integer, nullable=False, default=0),
    Column("next_attempt_at", Float, nullable=True),
    Column("delivered_at", Float, nullable=True),
    Column("last_error", Text, nullable=True),
    UniqueConstraint("wake_id", "webhook_id", name="uq_delivery_wake_webhook"),
)
Index("ix_wake_deliveries_state", wake_deliveries.c.state)

#: Every HTTP attempt of a delivery; ``finished_at`` stays null when the control plane died
#: during the attempt (marked interrupted on the next start).
delivery_attempts = Table(
    "delivery_attempts",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("delivery_id", String(64), ForeignKey("wake_deliveries.id"), nullable=False),
    Column("number", Integer, nullable=False),
    Column("started_at", Float, nullable=False),
    Column("finished_at", Float, nullable=True),
    Column("status_code", Integer, nullable=True),
    Column("error", Text, nullable=True),
)
Index("ix_delivery_attempts_delivery", delivery_attempts.c.delivery_id)

# ---------------------------------------------------------------------- transfers, artifacts
# (T1–T5; revision 0003_files)

#: An explicit copy from a source workspace's committed snapshot into a target (T2, T3).
#: ``state``: queued, running, then completed, partial, failed or cancelled. The counters
#: count files committed into the target (T3: bytes copied prove nothing).
transfers = Table(
    "transfers",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("agent_id", String(64), ForeignKey("agents.id"), nullable=False),
    Column("source_workspace_id", String(64), ForeignKey("workspaces.id"), nullable=False),
    Column("source_seq", Integer, nullable=True),
    Column("target_workspace_id", String(64), ForeignKey("workspaces.id"), nullable=False),
    Column("target_folder", Text, nullable=False),
    Column("paths", JSON, nullable=False),
    Column("options", JSON, nullable=False),
    Column("state", String(16), nullable=False),
    Column("error", Text, nullable=True),
    Column("files_total", Integer, nullable=False, default=0),
    Column("bytes_total", BigInteger, nullable=False, default=0),
    Column("files_copied", Integer, nullable=False, default=0),
    Column("files_unchanged", Integer, nullable=False, default=0),
    Column("files_skipped", Integer, nullable=False, default=0),
    Column("files_failed", Integer, nullable=False, default=0),
    Column("bytes_done", BigInteger, nullable=False, default=0),
    # Bytes of objects streamed from the source runner to the target (0 on one runner: the
    # two workspaces share the content-addressed store).
    Column("bytes_sent", BigInteger, nullable=False, default=0),
    Column("batches", Integer, nullable=False, default=0),
    Column("target_seq", Integer, nullable=True),
    Column("cancel_requested", Boolean, nullable=False, default=False),
    Column("created_at", Float, nullable=False),
    Column("started_at", Float, nullable=True),
    Column("finished_at", Float, nullable=True),
)
Index("ix_transfers_agent", transfers.c.agent_id, transfers.c.created_at)
Index("ix_transfers_state", transfers.c.state)

#: One entry of a transfer and its outcome: pending, then copied, unchanged, skipped or failed
#: (with the reason); ``target_seq`` is the target snapshot that published it.
transfer_files = Table(
    "transfer_files",
    metadata,
    Column("transfer_id", String(64), ForeignKey("transfers.id"), primary_key=True),
    Column("idx", Integer, primary_key=True),
    Column("source_path", StoredPath, nullable=False),
    Column("target_path", StoredPath, nullable=False),
    Column("kind", String(8), nullable=False),
    Column("mode", Integer, nullable=False, default=0o644),
    Column("size", BigInteger, nullable=False, default=0),
    Column("sha256", String(64), nullable=True),
    Column("link_target", Text, nullable=True),
    Column("outcome", String(16), nullable=False),
    Column("reason", Text, nullable=True),
    Column("target_seq", Integer, nullable=True),
)
Index("ix_transfer_files_outcome", transfer_files.c.transfer_id, transfer_files.c.outcome)

#: A file an agent declared as a deliverable (T5): always a file of a committed snapshot of
#: its own workspace on the local runner; that snapshot is kept by retention.
artifacts = Table(
    "artifacts",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("agent_id", String(64), ForeignKey("agents.id"), nullable=False),
    Column("workspace_id", String(64), ForeignKey("workspaces.id"), nullable=False),
    Column("runner_id", String(64), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("path", Text, nullable=False),
    Column("name", String(255), nullable=False),
    #: The real SHA-256 of the file's bytes (computed at declaration when its content id is
    #: a chunk list; before revision 0013 it held the content id).
    Column("sha256", String(64), nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("created_at", Float, nullable=False),
    # revision 0013_artifact_content_id; NULL for rows declared before it
    Column("content_id", String(64), nullable=True),
    UniqueConstraint("agent_id", "name", name="uq_artifact_agent_name"),
)

#: Bearer tokens of the REST API and /mcp: only the sha256 of each secret is kept. ``kind`` is
#: admin (everything), session (the agents of ``session_id``) or agent (``agent_id`` only).
tokens = Table(
    "tokens",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("kind", String(16), nullable=False),
    Column("secret_sha256", String(64), nullable=False, unique=True),
    Column("session_id", String(64), ForeignKey("sessions.id"), nullable=True),
    Column("agent_id", String(64), ForeignKey("agents.id"), nullable=True),
    Column("created_by", String(64), nullable=True),
    Column("created_at", Float, nullable=False),
    Column("revoked_at", Float, nullable=True),
)

# --- managed environments (V1–V8, revision 0004_environments) ---

#: A managed prefix on one runner, owned by a session (every agent of it may use it).
environments = Table(
    "environments",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("session_id", String(64), ForeignKey("sessions.id"), nullable=False),
    Column("created_by", String(64), ForeignKey("agents.id"), nullable=False),
    Column("runner_id", String(64), ForeignKey("runners.id"), nullable=False),
    Column("name", String(64), nullable=False),
    Column("language", String(16), nullable=False),
    # The latest revision; 0 until ``create`` succeeded.
    Column("revision", Integer, nullable=False, default=0),
    # creating, ready, failed (a failed ``create``).
    Column("state", String(16), nullable=False),
    Column("error", Text, nullable=True),
    Column("created_at", Float, nullable=False),
    UniqueConstraint("session_id", "runner_id", "name", name="uq_environment_name"),
)

environment_revisions = Table(
    "environment_revisions",
    metadata,
    Column("environment_id", String(64), ForeignKey("environments.id"), primary_key=True),
    Column("revision", Integer, primary_key=True),
    Column("packages", JSON, nullable=False),
    Column("request", JSON, nullable=False),
    Column("change_id", String(64), nullable=False),
    Column("created_at", Float, nullable=False),
)

environment_changes = Table(
    "environment_changes",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("environment_id", String(64), ForeignKey("environments.id"), nullable=False),
    # Order of the changes of one environment (they run one at a time, oldest first).
    Column("seq", Integer, nullable=False),
    Column("agent_id", String(64), ForeignKey("agents.id"), nullable=False),
    Column("action", String(16), nullable=False),
    Column("manager", String(16), nullable=True),
    Column("specs", JSON, nullable=False),
    Column("options", JSON, nullable=False),
    # waiting, running, succeeded, failed
    Column("state", String(16), nullable=False),
    Column("waiting_for", JSON, nullable=False),
    Column("error", Text, nullable=True),
    Column("error_kind", String(16), nullable=True),
    Column("revision", Integer, nullable=True),
    Column("progress", Text, nullable=True),
    Column("created_at", Float, nullable=False),
    Column("started_at", Float, nullable=True),
    Column("finished_at", Float, nullable=True),
)
Index(
    "ix_environment_changes_env_state",
    environment_changes.c.environment_id,
    environment_changes.c.state,
)
Index("ix_executions_environment_state", executions.c.environment_id, executions.c.state)

# --- replicas (docs/operations.md, revision 0009_leases) ---

#: Who watches a piece of ongoing work (a non-terminal execution, ...): one replica at a time,
#: until ``expires_at`` (renewed while it is alive). ``scope``: None for work any replica can
#: take over (shared runners); the home's local-runner scope for work only that home's server
#: can reach (its in-process local runner).
leases = Table(
    "leases",
    metadata,
    Column("kind", String(16), primary_key=True),
    Column("subject_id", String(64), primary_key=True),
    Column("holder", String(64), nullable=False),
    Column("scope", String(255), nullable=True),
    Column("expires_at", Float, nullable=False),
    Column("acquired_at", Float, nullable=False),
    #: How many times another replica took it over (a trace of each E11 across replicas).
    Column("takeovers", Integer, nullable=False, default=0),
)
Index("ix_leases_expires", leases.c.expires_at)
Index("ix_leases_holder", leases.c.holder)
#: One default session, however many replicas start on a fresh database at once.
Index(
    "uq_sessions_one_default",
    sessions.c.is_default,
    unique=True,
    postgresql_where=sessions.c.is_default,
    sqlite_where=sessions.c.is_default,
)

#: Foreground callers waiting for an execution another replica watches (N3 across replicas,
#: revision 0010_foreground_waits): the finalizer posts the notice read when a live row names
#: the execution, and deletes the rows in the same transaction. Written only on PostgreSQL, by
#: a replica that does not watch the execution; ``expires_at`` is pushed forward while the
#: caller waits, so a killed replica's row stops counting within one lease time.
foreground_waits = Table(
    "foreground_waits",
    metadata,
    Column("execution_id", String(64), primary_key=True),
    Column("waiter_id", String(64), primary_key=True),
    Column("expires_at", Float, nullable=False),
)
Index("ix_foreground_waits_expires", foreground_waits.c.expires_at)
