"""What PostgreSQL receives per foreground ``run_shell(true)``: statements, transactions and
round trips, counted by the server itself.

One replica (``shellyard serve``) over a direct runner daemon, on a fresh database whose
``log_statement`` is ``all`` (``ALTER DATABASE``: that database only, dropped at the end). After
a warm-up, RUNS foreground runs; the server's log lines of that database between two markers
are read back and each logged message counted (one per simple query, one per extended-protocol
execute: each a round trip the replica waited for; psycopg sends BEGIN and COMMIT as simple
queries of their own). Every backend of the database is counted, so the fan-out's
``pg_notify`` connection is in too. ``--src``: the replica runs that ``src`` folder instead
(e.g. the main checkout's, for a before/after). Needs to read the server's log
(``--log``, default Debian's).

    .venv/bin/python bench/bench_pg_round_trips.py [--runs N] [--src SRC] [--log PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import re
import secrets
import sys
import time
from pathlib import Path
from typing import Any

from common import postgres_and_daemon

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
from replicas_fixture import SERVER, replica_env

LOG = Path("/var/log/postgresql/postgresql-15-main.log")
#: ``%m [%p] %q%u@%d `` (Debian's log_line_prefix), then the message.
LINE = re.compile(r"^\S+ \S+ \S+ \[(\d+)\] (\S*)@(\S*) LOG:  (statement|execute [^:]*): (.*)$")


def _mark(database: str, text: str) -> None:
    import psycopg

    with psycopg.connect(f"{SERVER}/{database}", autocommit=True) as conn:
        conn.execute(f"SELECT '{text}'")


def _shape(sql: str) -> str:
    """A statement's kind and first table, for the list."""
    words = sql.split()
    head = " ".join(words[:1]).upper()
    if head == "BEGIN":
        return "BEGIN"
    if head == "WITH":
        return "WITH … (one statement, data-modifying CTEs)"
    for keyword in ("INTO", "UPDATE", "FROM"):
        upper = [w.upper() for w in words]
        if keyword in upper[:40]:
            index = upper.index(keyword)
            if index + 1 < len(words):
                return f"{head} {words[index + 1]}"
    return " ".join(words[:3])


async def measure(runs: int, src: Path | None, log: Path) -> dict[str, Any]:
    def log_every_statement(database: str) -> None:
        import psycopg

        with psycopg.connect(f"{SERVER}/test", autocommit=True) as conn:
            conn.execute(f"ALTER DATABASE \"{database}\" SET log_statement = 'all'")

    env = replica_env(**({"PYTHONPATH": str(src)} if src is not None else {}))
    async with postgres_and_daemon(env, log_every_statement) as pair:
        database, once = pair.database, pair.once
        for _ in range(20):  # statements prepared, agent and workspace known
            await once()
        await asyncio.sleep(0.5)
        token = secrets.token_hex(4)
        _mark(database, f"rt-begin-{token}")
        for _ in range(runs):
            await once()
        await asyncio.sleep(0.5)  # the fan-out's last notify
        _mark(database, f"rt-end-{token}")
    time.sleep(0.5)
    messages = []
    inside = False
    for line in log.read_text(errors="replace").splitlines():
        found = LINE.match(line)
        if found is None or found.group(3) != database:
            continue
        sql = found.group(5)
        if f"rt-begin-{token}" in sql:
            inside = True
            continue
        if f"rt-end-{token}" in sql:
            break
        if inside:
            messages.append(sql)
    kinds = collections.Counter(_shape(m) for m in messages)
    # psycopg names the isolation level after an autocommit connection was reset to it.
    transactions = sum(1 for m in messages if m.strip().upper().startswith("BEGIN"))
    return {
        "runs": runs,
        "src": str(src) if src else None,
        "round_trips_per_run": len(messages) / runs,
        "transactions_per_run": transactions / runs,
        "by_statement_per_run": {k: v / runs for k, v in kinds.most_common()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--src", type=Path, help="the replica runs this src folder")
    parser.add_argument("--log", type=Path, default=LOG, help="the PostgreSQL server's log")
    parser.add_argument("--out", type=Path, help="also write the JSON result here")
    args = parser.parse_args()
    result = asyncio.run(measure(args.runs, args.src, args.log))
    text = json.dumps(result, indent=2, ensure_ascii=False)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
