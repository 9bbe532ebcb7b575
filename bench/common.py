"""Helpers shared by the benchmarks: fresh homes, percentiles, the bare-bwrap baseline,
a server process for a home, the PostgreSQL + daemon pair, RSS sampling and the result
format.

Every benchmark module prints (and with ``--out`` writes) one JSON document::

    {"name": ..., "title": ..., "command": "...", "metrics": [metric, ...], "details": {...}}

where a metric compares one figure with its baseline measured in the same run::

    {"id", "label", "value", "unit", "baseline_label", "baseline_value", "ratio",
     "target", "limit", "kind": "ratio_max" | "ratio_min" | "abs_max" | "info", "pass"}
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
MIB = 1 << 20

#: A workspace of 100 small files (benchmark 1).
SEED_100_FILES = 'for i in $(seq 1 100); do echo "small file $i" > "f$i.txt"; done'


# ----------------------------------------------------------------------------- homes


def make_home(prefix: str = "shellyard-bench-", parent: Path | None = None) -> Path:
    """A home the sandbox uid can traverse (a 0700 parent would lock it out), in ``parent``
    (default /tmp: which volume it is on changes a run's cost, docs/benchmarks.md §76)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent or "/tmp"))
    path.chmod(0o711)
    return path


def remove_home(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


# ----------------------------------------------------------------------------- statistics


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not sorted_values:
        return float("nan")
    pos = (len(sorted_values) - 1) * q
    low = int(pos)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (pos - low)


def summary_ms(samples_s: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99/mean/min/max of durations given in seconds, in milliseconds."""
    values = sorted(s * 1000 for s in samples_s)
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50": round(quantile(values, 0.50), 3),
        "p95": round(quantile(values, 0.95), 3),
        "p99": round(quantile(values, 0.99), 3),
        "mean": round(sum(values) / len(values), 3),
        "min": round(values[0], 3),
        "max": round(values[-1], 3),
    }


def metric(
    id: str,
    label: str,
    value: float,
    unit: str,
    *,
    target: str,
    kind: str,
    limit: float | None = None,
    baseline_label: str | None = None,
    baseline_value: float | None = None,
) -> dict[str, Any]:
    """One row of a result table. ``kind``: ratio_max (value/baseline ≤ limit), ratio_min
    (value/baseline ≥ limit), abs_max (value ≤ limit) or info (no target)."""
    ratio = None
    if baseline_value:
        ratio = value / baseline_value
    passed: bool | None = None
    if kind == "ratio_max" and ratio is not None and limit is not None:
        passed = ratio <= limit
    elif kind == "ratio_min" and ratio is not None and limit is not None:
        passed = ratio >= limit
    elif kind == "abs_max" and limit is not None:
        passed = value <= limit
    return {
        "id": id,
        "label": label,
        "value": round(value, 3),
        "unit": unit,
        "baseline_label": baseline_label,
        "baseline_value": round(baseline_value, 3) if baseline_value is not None else None,
        "ratio": round(ratio, 3) if ratio is not None else None,
        "target": target,
        "limit": limit,
        "kind": kind,
        "pass": passed,
    }


# ----------------------------------------------------------------------------- bare bwrap


class BareBwrap:
    """The baseline: bwrap spawned exactly as the runner's cold spawn spawns it
    (``Sandboxes.prepare_cold``, ``ColdSpawn.run``: the same argv from ``sandbox.bwrap_argv``:
    prlimit, --unshare-all, --cap-drop ALL, --disable-userns, the same allow-listed host
    view, the seccomp filter, a status fd; stdout/stderr opened onto files; a new session; as
    the sandbox uid when we are root), but
    with no control plane around it: spawn, then block in waitpid. ``seccomp`` False and
    ``network`` change one flag at a time, so their cost per spawn can be measured."""

    def __init__(
        self,
        root: Path,
        *,
        seccomp: bool = True,
        network: str = "off",
        egress_socket: Path | None = None,
    ) -> None:
        from shellyard.runner.protocol import SandboxPolicy
        from shellyard.runner.sandbox import bwrap as sandbox
        from shellyard.runner.sandbox import launch
        from shellyard.runner.sandbox.seccomp import SeccompProfile

        self.policy = SandboxPolicy.model_validate({"network": network})
        self.ids = sandbox.sandbox_ids(self.policy)
        self.bwrap = sandbox.find_bwrap()
        # The same layout as a home: <home>/runners/local/workspaces/<ws>, both hidden.
        self.home = root
        runner_root = root / "runners" / "local"
        self.workspace = runner_root / "workspaces" / "ws_bare"
        self.logs = root / f"bare-logs-{network}-{int(seccomp)}"
        box = runner_root / "sandbox"
        for directory in (runner_root, runner_root / "workspaces", box):
            directory.mkdir(parents=True, exist_ok=True)
            directory.chmod(0o711)
        self.workspace.mkdir(mode=0o700, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        if self.ids is not None:
            os.chown(self.workspace, *self.ids)
        self.hidden = [runner_root, root]
        self.view = sandbox.HostView.build((), self.hidden, box / "empty")
        self.seccomp: SeccompProfile | None = None
        if seccomp:
            self.seccomp = SeccompProfile(box / "seccomp.bpf")
            self.seccomp.write()
        self.disable_userns = sandbox.bwrap_supports(self.bwrap, "--disable-userns")
        self.egress_socket = egress_socket
        self._sandbox = sandbox
        self.launcher = launch.build(box / "bin")  # the runner's own (launch.py)

    #: Whether ``argv`` drops to the sandbox uid itself (the product's launcher does); the
    #: hand-made argvs of the subclasses are dropped through Popen(user=...).
    drops_itself = True

    def argv(self, command: Sequence[str], status_fd: int, seccomp_fd: int | None) -> list[str]:
        return self._sandbox.bwrap_argv(
            bwrap=self.bwrap,
            policy=self.policy,
            ids=self.ids,  # dropped by the launcher in front of bwrap, as the runner does
            launcher=self.launcher,
            view=self.view,
            hardening=self._sandbox.Hardening(seccomp_fd, self.disable_userns),
            workspace=self.workspace,
            status_fd=status_fd,
            command=list(command),
            egress_socket=self.egress_socket,
        )

    def spawn(
        self, command: Sequence[str] = ("true",), stdout: Path | None = None, tag: str = "0"
    ) -> subprocess.Popen[bytes]:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        out_fd = os.open(stdout or self.logs / f"stdout-{tag}", flags, 0o600)
        err_fd = os.open(self.logs / f"stderr-{tag}", flags, 0o600)
        status_fd = os.open(self.logs / f"status-{tag}", flags, 0o600)
        seccomp_fd = self.seccomp.open() if self.seccomp is not None else None
        try:
            env = self._sandbox.sandbox_env(
                self._sandbox.WORKSPACE,
                {
                    **self._sandbox.proxy_variables(self.policy.network),
                    "SHELLYARD_EXECUTION_ID": "bare",
                    "SHELLYARD_WORKSPACE_ID": "ws_bare",
                },
            )
            dropped = self.ids is not None and not self.drops_itself
            uid, gid = self.ids if dropped and self.ids is not None else (None, None)
            fds = (status_fd,) if seccomp_fd is None else (status_fd, seccomp_fd)
            return subprocess.Popen(
                self.argv(command, status_fd, seccomp_fd),
                stdin=subprocess.DEVNULL,
                stdout=out_fd,
                stderr=err_fd,
                pass_fds=fds,
                env=env,
                cwd="/",
                start_new_session=True,
                user=uid,
                group=gid,
                extra_groups=[] if uid is not None else None,
            )
        finally:
            os.close(out_fd)
            os.close(err_fd)
            os.close(status_fd)
            if seccomp_fd is not None:
                os.close(seccomp_fd)

    def run(
        self, command: Sequence[str] = ("true",), stdout: Path | None = None, tag: str = "0"
    ) -> float:
        """Seconds from spawn to exit seen."""
        start = time.perf_counter()
        code = self.spawn(command, stdout, tag).wait()
        elapsed = time.perf_counter() - start
        if code != 0:
            raise RuntimeError(f"bare bwrap {command} exited {code}: {self.stderr(tag)}")
        return elapsed

    def stderr(self, tag: str = "0") -> str:
        return (self.logs / f"stderr-{tag}").read_text(errors="replace")[:500]


def bare_true() -> float:
    start = time.perf_counter()
    subprocess.run(["true"], check=True)
    return time.perf_counter() - start


#: The minimal sandbox spawn (issue 13): a new namespace of every kind, the host read-only,
#: nothing else -- no prlimit, no setpriv, no hidden folders, no seccomp, no status fd.
MINIMAL_BWRAP = (
    "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-all", "true",
)  # fmt: skip


class MinimalBwrap:
    """``bwrap --ro-bind / / --dev /dev --proc /proc --unshare-all true``, spawned and waited
    for: the physical floor of a sandboxed ``true`` on this machine."""

    def __init__(self) -> None:
        from shellyard.runner.sandbox import bwrap as sandbox

        self.argv = [sandbox.find_bwrap(), *MINIMAL_BWRAP]

    def run(self) -> float:
        # ``--ro-bind / /`` copies every host mount: one another process unmounts meanwhile
        # (other test suites' sandboxes on a shared host) fails it ("Can't bind mount
        # /oldroot/ ... No such file or directory"). Not the sandbox's cost: timed again.
        for _ in range(5):
            start = time.perf_counter()
            done = subprocess.run(
                self.argv, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False
            )
            elapsed = time.perf_counter() - start
            if done.returncode == 0:
                return elapsed
            if b"Can't bind mount /oldroot/" not in done.stderr:
                break
        raise RuntimeError(f"minimal bwrap exited {done.returncode}: {done.stderr!r}")


def mount_count() -> int:
    """Lines of this process's mount table: every bwrap copies the whole table and reads it
    again at each bind, so its size sets a spawn's cost (docs/benchmarks.md §73, §77)."""
    with open("/proc/self/mountinfo", "rb") as handle:
        return sum(1 for _ in handle)


class CleanTable:
    """The baselines spawned from a process whose mount table is the host's as it was when
    this was made (bench/clean_table.py): make it before any plane, and the minimal and
    product-argv bwrap spawns pay for the host's mounts, not for the planes' workspaces."""

    def __init__(self, bare_root: Path) -> None:
        self.process = subprocess.Popen(
            [PYTHON, str(Path(__file__).with_name("clean_table.py")), str(bare_root)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(
                filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))},
        )  # fmt: skip
        self._expect("ready")

    def _ask(self, request: str) -> str:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(request + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline().strip()
        if not answer or answer.startswith("error"):
            raise RuntimeError(f"the baselines' spawner, asked {request!r}: {answer or 'gone'}")
        return answer

    def _expect(self, word: str) -> None:
        assert self.process.stdout is not None
        line = self.process.stdout.readline().strip()
        if line != word:
            raise RuntimeError(f"the baselines' spawner did not start: {line or 'gone'}")

    def minimal(self) -> float:
        return float(self._ask("minimal"))

    def bare(self, tag: str = "0") -> float:
        return float(self._ask(f"bare {tag}"))

    def mounts(self) -> int:
        return int(self._ask("mounts"))

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=30)


# ----------------------------------------------------------------------------- peer MCP server

#: The unsandboxed peer the round trip is judged against, pinned.
PEER_MCP_SERVER = "mcp-shell-server==1.1.14"


def peer_cache() -> Path:
    """Where the peer's venv is built: $XDG_CACHE_HOME/shellyard-bench, else bench/results."""
    base = os.environ.get("XDG_CACHE_HOME")
    root = Path(base) / "shellyard-bench" if base else REPO / "bench" / "results" / "cache"
    return root / PEER_MCP_SERVER.replace("==", "-")


def peer_server_venv() -> Path:
    """A venv holding ``PEER_MCP_SERVER``, built with uv on first use and reused once an
    install has completed (a marker file says so); the path of its ``mcp-shell-server``."""
    venv = peer_cache()
    script, done = venv / "bin" / "mcp-shell-server", venv / ".installed"
    if script.exists() and done.exists():
        return script
    uv = shutil.which("uv") or str(Path(PYTHON).parent / "uv")
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([uv, "venv", "-q", "--python", PYTHON, str(venv)], check=True)
    python = str(venv / "bin" / "python")
    subprocess.run([uv, "pip", "install", "-q", "--python", python, PEER_MCP_SERVER], check=True)
    done.write_text(PEER_MCP_SERVER + "\n")
    return script


# ----------------------------------------------------------------------------- servers


def start_server(home: Path, env: dict[str, str] | None = None) -> int:
    """``shellyard serve`` for ``home`` as its own process (so its RSS is its own); the pid."""
    from shellyard.home import ensure_server

    saved = {key: os.environ.get(key) for key in (env or {})}
    os.environ.update(env or {})
    try:
        return ensure_server(home).pid
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def stop_server(home: Path, timeout_s: float = 20.0) -> None:
    from shellyard.home import is_served, read_info

    info = read_info(home)
    if info is None or not is_served(home):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(info.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and is_served(home):
        time.sleep(0.05)
    if is_served(home):
        with contextlib.suppress(ProcessLookupError):
            os.kill(info.pid, signal.SIGKILL)


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class RssSampler:
    """Samples a process's resident set every ``interval_s`` on a thread; keeps the peak."""

    def __init__(self, pid: int, interval_s: float = 0.02) -> None:
        self.pid, self.interval_s = pid, interval_s
        self.peak = rss_bytes(pid)
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak = max(self.peak, rss_bytes(self.pid))
            self.samples += 1

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def child_pids_matching(text: str) -> list[int]:
    """Pids of this process's children whose command line contains ``text``."""
    found = []
    for task in os.listdir("/proc/self/task"):
        try:
            children = Path(f"/proc/self/task/{task}/children").read_text().split()
        except OSError:
            continue
        for child in children:
            try:
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if text.encode() in cmdline:
                found.append(int(child))
    return found


def sandbox_processes(execution_ids: set[str] | None = None) -> dict[int, str]:
    """Host pid → execution id of every process whose environment carries
    SHELLYARD_EXECUTION_ID (restricted to ``execution_ids`` when given)."""
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                environ = handle.read()
        except OSError:
            continue
        for item in environ.split(b"\0"):
            if item.startswith(b"SHELLYARD_EXECUTION_ID="):
                value = item.split(b"=", 1)[1].decode(errors="replace")
                if execution_ids is None or value in execution_ids:
                    found[int(entry)] = value
                break
    return found


def bench_sandbox_processes() -> dict[int, str]:
    """Sandbox processes of this suite's homes only (other work on the machine, such as a
    test-suite running beside it, has sandboxes too): those whose working folder or command
    line lies under a ``/tmp/shellyard-bench-*`` home."""
    mine: dict[int, str] = {}
    for pid, execution_id in sandbox_processes().items():
        try:
            where = os.readlink(f"/proc/{pid}/cwd")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "/shellyard-bench-" in where or "/shellyard-bench-" in cmdline:
            mine[pid] = execution_id
    return mine


# ----------------------------------------------------------------------------- profiling


class PySpy:
    """``py-spy record`` on a process for the length of a ``with`` block (when installed).

    Samples every thread including idle ones (``--idle --threads``), so the summary can say
    what the event-loop (main) thread did with its wall time: waiting in epoll (idle), or
    inside which function, running Python or blocked in a system call (fork, SQLite, file
    I/O) -- either way the loop can serve nothing else meanwhile."""

    def __init__(self, pid: int, out: Path | None, rate: int = 250) -> None:
        self.pid, self.out, self.rate = pid, out, rate
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PySpy:
        exe = shutil.which("py-spy") or str(Path(PYTHON).parent / "py-spy")
        if self.out is None or not self.pid or not Path(exe).exists():
            return self
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [exe, "record", "--pid", str(self.pid), "--rate", str(self.rate), "--format", "raw",
             "--idle", "--threads", "--nonblocking", "--output", str(self.out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(0.3)
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=20)
            if self.proc.poll() is None:
                self.proc.kill()


INTERESTING = (
    "shellyard/", "sqlalchemy/", "aiosqlite/", "fastapi/", "starlette/", "uvicorn/",
    "pydantic/", "mcp/", "httpx/", "httpcore/", "subprocess.py:",
)  # fmt: skip


#: Functions whose inclusive share every summary reports (when seen), for the hot-spot tables.
KEY_FUNCTIONS = (
    "shellyard/store/db.py:Database.run",
    "sqlalchemy/engine/default.py:DefaultDialect.do_execute",
    "sqlalchemy/engine/default.py:DefaultDialect.do_commit",
    "shellyard/runner/local.py:LocalRunner._spawn",
    "subprocess.py:Popen._execute_child",
    "shellyard/runner/local.py:_write_json_atomic",
    "shellyard/runner/local.py:LocalRunner._finish",
    "shellyard/control/executions/service.py:ExecutionService._respond",
    "shellyard/control/executions/output.py:capped_output",
)


def summarize_collapsed(path: Path, top: int = 12) -> dict[str, Any]:
    """The event-loop (main) thread's wall time from a ``PySpy`` profile: the share idle in
    epoll, and per function the share spent in it, own (leaf frame) and inclusive (anywhere
    on the stack; shellyard, library and subprocess frames). In the inclusive list a
    pass-through caller (one whose samples are >= 90% those of a deeper function, like a
    middleware stack) is shown only by that deeper function, and frames found in every busy
    sample are left out."""
    if not path.exists():
        return {}
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    lines_of: dict[str, set[int]] = {}
    depth_of: dict[str, int] = {}
    total = idle = 0
    for number, line in enumerate(path.read_text(errors="replace").splitlines()):
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        frames = stack.split(";")
        if not frames[0].startswith("thread (") or not frames[0].endswith("MainThread"):
            continue
        if "PySpy.__enter__" in stack:
            continue  # the profiler's own start-up pause
        count = int(count_text)
        total += count
        names = [_frame(f) for f in frames[1:]]
        if not names:
            continue
        if names[-1].endswith(("EpollSelector.select", "select.epoll.poll")):
            idle += count
            continue
        own[names[-1]] = own.get(names[-1], 0) + count
        for depth, name in enumerate(names):
            if name in lines_of and number in lines_of[name]:
                continue  # recursion: count a sample once per function
            lines_of.setdefault(name, set()).add(number)
            inclusive[name] = inclusive.get(name, 0) + count
            depth_of[name] = max(depth_of.get(name, 0), depth)
    total = max(1, total)
    busy = total - idle
    candidates = [n for n in inclusive if n.startswith(INTERESTING) and inclusive[n] < busy]
    kept = {}
    for name in candidates:
        # A pass-through caller: some deeper function accounts for >= 90% of its samples.
        passthrough = any(
            depth_of[other] > depth_of[name]
            and inclusive[other] >= 0.9 * inclusive[name]
            and lines_of[other] <= lines_of[name]
            for other in candidates
            if other != name
        )
        if not passthrough:
            kept[name] = inclusive[name]

    def ranked(table: dict[str, int], limit: int = top) -> list[list[Any]]:
        rows = sorted(table.items(), key=lambda kv: -kv[1])[:limit]
        return [[name, round(100 * count / total, 1)] for name, count in rows]

    return {
        "main_thread_samples": total,
        "loop_idle_pct": round(100 * idle / total, 1),
        "own_pct": ranked(own),
        "inclusive_pct": ranked(kept, top * 3),
        "key_pct": {
            name: round(100 * inclusive[name] / total, 1)
            for name in KEY_FUNCTIONS
            if name in inclusive
        },
    }


def _frame(frame: str) -> str:
    """'func (path/to/module.py:123)' → 'module.py:func'."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    file = where.rsplit(":", 1)[0]
    for marker in ("/site-packages/", "/src/"):
        if marker in file:
            file = file.split(marker, 1)[1]
    return f"{file}:{name}"


# ----------------------------------------------------------------------------- CLI


def cli(
    name: str,
    run: Callable[[argparse.Namespace], dict[str, Any]],
    describe: str,
    options: Callable[[argparse.ArgumentParser], None] | None = None,
) -> None:
    """``options`` adds a benchmark's own command-line options."""
    parser = argparse.ArgumentParser(description=describe)
    parser.add_argument("--quick", action="store_true", help="fewer samples, shorter phases")
    parser.add_argument("--out", type=Path, help="also write the JSON result here")
    parser.add_argument(
        "--profile", type=Path, help="folder for profiles (py-spy / cProfile) of the service"
    )
    if options is not None:
        options(parser)
    args = parser.parse_args()
    result = run(args)
    result.setdefault("name", name)
    # The event loop the product's servers (and the in-process planes of the benches that use
    # shellyard.loops) run on in this run: SHELLYARD_LOOP, uvloop by default.
    from shellyard import loops

    result.setdefault("shellyard_loop", loops.chosen())
    write_result(result, args.out, indent=2)


def write_result(result: dict[str, Any], out: Path | None, indent: int = 1) -> None:
    """``result`` as JSON on stdout, and into ``out`` when one is given."""
    text = json.dumps(result, indent=indent)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    print(text)


@contextlib.contextmanager
def timed() -> Iterator[list[float]]:
    box: list[float] = []
    start = time.perf_counter()
    try:
        yield box
    finally:
        box.append(time.perf_counter() - start)


# ----------------------------------------------------------------------------- PostgreSQL + daemon


@dataclasses.dataclass
class PostgresPair:
    """One replica on a fresh PostgreSQL database with a runner daemon (``r0``) registered,
    and ``once()``: one ``true`` run through it, over REST, waited for."""

    replica: Any
    daemon: Any
    #: the fresh database's name
    database: str
    http: Any
    once: Callable[[], Awaitable[None]]


@contextlib.asynccontextmanager
async def postgres_and_daemon(
    env: dict[str, str] | None = None, prepare: Callable[[str], None] | None = None
) -> AsyncIterator[PostgresPair]:
    """The PostgreSQL + daemon pair of bench_cpu.py and bench_pg_round_trips.py: a daemon
    process, a fresh database (``prepare(name)`` runs on it before the replica starts), one
    replica with ``env`` (default ``replica_env()``), the daemon registered, a session made.
    Everything is stopped and removed on the way out."""
    import httpx

    sys.path.insert(0, str(REPO / "tests" / "support"))
    from replicas_fixture import fresh_database, replica_env, start_replicas, stop_all
    from runner_daemon_fixture import start_daemon

    from shellyard.runner.protocol import SandboxPolicy

    root = make_home()
    daemon = await start_daemon(root / "daemon", SandboxPolicy(), subprocess=True)
    try:
        async with fresh_database() as url:
            database = url.rsplit("/", 1)[1]
            if prepare is not None:
                prepare(database)
            replicas = await start_replicas(url, 1, replica_env() if env is None else env)
            try:
                replica = replicas[0]
                async with httpx.AsyncClient(timeout=120) as http:
                    answer = await http.post(
                        replica.url + "/v1/runners",
                        json={"runner_id": "r0", "address": daemon.url, "token": daemon.token},
                    )
                    answer.raise_for_status()
                    agent = (await http.post(replica.url + "/v1/sessions")).json()["main_agent_id"]

                    async def once() -> None:
                        answer = await http.post(
                            replica.url + "/v1/executions",
                            json={"command": "true", "runner_id": "r0", "wait_ms": 30000},
                            headers={"X-Shellyard-Agent": agent},
                        )
                        if answer.json().get("state") != "completed":
                            raise RuntimeError(f"run of true: {answer.text}")

                    yield PostgresPair(replica, daemon, database, http, once)
            finally:
                stop_all(replicas)
    finally:
        await daemon.stop()
        remove_home(root)


# ----------------------------------------------------------------------------- phase timing


class PhaseTimer:
    """Wall time spent inside chosen async methods of live objects (patched on the instance),
    so a benchmark can split a round trip into its parts. Nested calls of the same group are
    counted once, in the outermost one."""

    def __init__(self) -> None:
        import contextvars

        self.totals: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        # Per task (asyncio copies the context into each task), so concurrent calls count.
        self._depth: contextvars.ContextVar[dict[str, int]] = contextvars.ContextVar("depth")

    def patch(self, obj: Any, group: str, names: Sequence[str] | None = None) -> None:
        import inspect

        if names is None:
            names = [
                name
                for name, value in inspect.getmembers(type(obj))
                if not name.startswith("__") and inspect.iscoroutinefunction(value)
            ]
        for name in names:
            original = getattr(obj, name)
            setattr(obj, name, self._wrap(f"{group}.{name}", group, original))

    def _wrap(self, key: str, group: str, original: Callable[..., Any]) -> Callable[..., Any]:
        async def timed_call(*args: Any, **kwargs: Any) -> Any:
            depth = self._depth.get({})
            outer = depth.get(group, 0) == 0
            token = self._depth.set({**depth, group: depth.get(group, 0) + 1})
            start = time.perf_counter()
            try:
                return await original(*args, **kwargs)
            finally:
                self._depth.reset(token)
                if outer:
                    self.totals[key] = self.totals.get(key, 0.0) + time.perf_counter() - start
                    self.calls[key] = self.calls.get(key, 0) + 1

        return timed_call

    def report(self, runs: int) -> list[list[Any]]:
        """[name, ms per run, calls per run], largest first."""
        rows = sorted(self.totals.items(), key=lambda kv: -kv[1])
        return [
            [name, round(1000 * total / runs, 3), round(self.calls[name] / runs, 2)]
            for name, total in rows
        ]
