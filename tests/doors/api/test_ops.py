"""What an operator watches (issue 16 item 4): /healthz, /readyz and /metrics over the real
REST app of a real control plane (SQLite home, local runner)."""

from __future__ import annotations

import re

import httpx
import sqlalchemy as sa

from shellyard.control.plane import ControlPlane


def sample(text: str, name: str) -> float:
    """The value of one sample line (``name`` with its labels) of the Prometheus text."""
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert match, f"no sample {name} in:\n{text}"
    return float(match.group(1))


async def test_health_and_readiness_need_no_token(
    app_plane: tuple[httpx.AsyncClient, ControlPlane, str],
) -> None:
    client, plane, _admin = app_plane
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    ready = await client.get("/readyz")
    assert ready.status_code == 200, ready.text
    body = ready.json()
    assert body["status"] == "ready"
    assert {name for name, check in body["checks"].items() if check["ok"]} == {
        "database",
        "migrations",
        "runner",
    }
    assert body["replica"] == plane.leases.replica_id


async def test_readiness_fails_while_the_schema_is_behind_the_code(
    app_plane: tuple[httpx.AsyncClient, ControlPlane, str],
) -> None:
    """A database another (older) release migrated is not ready: the missing revision named."""
    client, plane, _admin = app_plane
    engine = sa.create_engine(plane.settings.effective_database_url)
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM alembic_version WHERE version_num = '0009_leases'"))
    engine.dispose()
    ready = await client.get("/readyz")
    assert ready.status_code == 503
    check = ready.json()["checks"]["migrations"]
    assert not check["ok"] and "0009_leases" in check["error"]


async def test_metrics_count_executions_latencies_and_runners(
    app_plane: tuple[httpx.AsyncClient, ControlPlane, str],
) -> None:
    client, _plane, admin = app_plane
    refused = await client.get("/metrics")
    assert refused.status_code == 401
    auth = {"Authorization": f"Bearer {admin}"}
    for code in (0, 3):
        ran = await client.post("/v1/executions", json={"command": f"exit {code}"}, headers=auth)
        assert ran.json()["state"] == "completed", ran.text
    answer = await client.get("/metrics", headers=auth)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain")
    text = answer.text
    assert sample(text, 'shellyard_executions{state="completed"}') == 2
    assert sample(text, 'shellyard_executions{state="running"}') == 0
    assert sample(text, "shellyard_queue_depth") == 0
    assert sample(text, "shellyard_spawn_seconds_count") == 2
    assert sample(text, "shellyard_commit_seconds_count") == 2
    assert sample(text, 'shellyard_leases_held{kind="execution"}') == 0  # both released
    assert sample(text, 'shellyard_runner_up{runner="local"}') == 1
    assert sample(text, 'shellyard_wake_deliveries{state="failed"}') == 0
    assert "shellyard_wakes_emitted_total" in text
    assert "shellyard_lease_takeovers_total" in text
