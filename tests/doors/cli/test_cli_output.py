"""Output as it was written (E4, docs/cli.md "Output"): the SDK's ``follow_logs`` and the CLI's
``logs`` pass the exact bytes (``\\xff`` is no U+FFFD), ``logs`` shows both streams, each on
its own, and ``--tail N`` counts lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shellyard import Client
from shellyard.contract.executions import ExecutionState

#: Bytes that are not UTF-8 (a lone 0xff, a cut two-byte sequence) between plain text.
RAW = b"a\xffb\xc3\n\x00z"
PRINTF = r"printf 'a\377b\303\n\000z'"


def sy_bytes(home: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "shellyard", *args],
        env={**os.environ, "SHELLYARD_HOME": str(home), "COLUMNS": "200"},
        capture_output=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )


def test_a_non_utf8_byte_round_trips_through_the_sdk_and_the_cli(served_home: Path) -> None:
    """E4: ``follow_logs`` yields the bytes written, ``logs`` and ``logs --follow`` print
    them; the JSON page stays text for the clients that read it."""
    with Client.for_home(served_home) as client:
        run = client.run(f"{PRINTF}; {PRINTF} >&2", wait_ms=20_000)
        assert run.state == ExecutionState.completed
        assert b"".join(client.follow_logs(run.execution_id)) == RAW
        assert b"".join(client.follow_logs(run.execution_id, "stderr", chunk=3)) == RAW
        text = client.logs(run.execution_id)
        assert text.encoding == "utf-8" and "\ufffd" in text.data
        page = client.logs(run.execution_id, raw=True)
        assert page.encoding == "base64" and page.raw() == RAW
    shown = sy_bytes(served_home, "logs", run.execution_id)
    assert shown.returncode == 0 and shown.stdout == RAW and shown.stderr == RAW
    followed = sy_bytes(served_home, "logs", "--follow", "--stream", "stdout", run.execution_id)
    assert followed.stdout == RAW and followed.stderr == b""


def test_logs_of_a_command_that_wrote_only_to_stderr(served_home: Path) -> None:
    """``logs ID`` prints both streams (stdout to stdout, stderr to stderr); --stream one."""
    run = sy_bytes(served_home, "run", "--background", "--", "echo only-here >&2")
    execution_id = run.stdout.decode().strip()
    followed = sy_bytes(served_home, "logs", "--follow", execution_id)
    assert followed.stdout == b"" and followed.stderr == b"only-here\n"
    shown = sy_bytes(served_home, "logs", execution_id)
    assert shown.stdout == b"" and shown.stderr == b"only-here\n"
    just_out = sy_bytes(served_home, "logs", "--stream", "stdout", execution_id)
    assert just_out.returncode == 0 and just_out.stdout == b"" and just_out.stderr == b""
    bad = sy_bytes(served_home, "logs", "--stream", "both", execution_id)
    assert bad.returncode == 2 and b"stdout, stderr or stdin" in bad.stderr


def test_tail_counts_lines_read_back_in_bounded_chunks(served_home: Path) -> None:
    """``--tail 10`` is the last ten lines, across more than one 64 KiB step back (long
    lines), with or without a final newline; ``--tail-bytes`` keeps the byte count."""
    with Client.for_home(served_home) as client:
        line = "printf %05d $i; head -c 14995 /dev/zero | tr '\\0' x; echo"
        long = client.run(f"for i in $(seq 1 40); do {line}; done", wait_ms=30_000)
        assert long.state == ExecutionState.completed
        short = client.run("printf 'one\\ntwo\\nthree'", wait_ms=20_000)
    lines = sy_bytes(served_home, "logs", "--tail", "10", long.execution_id).stdout.split(b"\n")
    assert lines[-1] == b"" and len(lines) == 11
    assert [line[:5] for line in lines[:-1]] == [b"%05d" % i for i in range(31, 41)]
    assert all(len(line) == 15_000 for line in lines[:-1])
    assert sy_bytes(served_home, "logs", "--tail", "2", short.execution_id).stdout == b"two\nthree"
    assert sy_bytes(served_home, "logs", "--tail", "9", short.execution_id).stdout == (
        b"one\ntwo\nthree"
    )
    assert sy_bytes(served_home, "logs", "--tail", "0", short.execution_id).stdout == b""
    tail = sy_bytes(served_home, "logs", "--tail-bytes", "4", short.execution_id)
    assert tail.stdout == b"hree"


def test_ids_are_never_cut_in_tables(served_home: Path) -> None:
    """A listing on a narrow terminal keeps every id whole (the command column gives way)."""
    run = sy_bytes(served_home, "run", "--", "echo " + "word " * 40)
    assert run.returncode == 0
    listing = subprocess.run(
        [sys.executable, "-m", "shellyard", "status"],
        env={**os.environ, "SHELLYARD_HOME": str(served_home), "COLUMNS": "60"},
        capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    shown = sy_bytes(served_home, "status", "--json").stdout.decode()
    ids = [v["execution_id"] for v in json.loads(shown)]
    assert ids and all(i in listing.stdout for i in ids), listing.stdout


def test_r_starts_without_a_time_zone_warning(served_home: Path) -> None:
    """R asked timedatectl for the zone on every run and warned (no systemd in a sandbox): the
    sandbox names the host's zone in TZ, so R's stderr stays empty."""
    import shutil

    if shutil.which("Rscript") is None:
        pytest.skip("R is not installed on this machine")
    done = sy_bytes(served_home, "run", "--", "Rscript -e 'cat(Sys.timezone())'; echo \" $TZ\"")
    assert done.returncode == 0, done.stderr
    assert done.stderr == b"", done.stderr
    zone, tz = done.stdout.decode().split()
    assert zone == tz and zone
