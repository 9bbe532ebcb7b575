"""The ``shellyard`` console script. The most common call, ``shellyard run -- CMD`` with at
most ``--home``, ``--wait-ms``, ``--queue`` and ``--read-only`` before the ``--``, is answered
here with the standard library alone: one POST to the home's server and the result's output
and exit code. docs/cli.md asks 150 ms for it; typer, pydantic and httpx cost several times that
before the first byte is sent (docs/benchmarks.md). Everything else, and a run still going
when its answer comes, goes to the typer app (``cli.app``), which behaves the same.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

#: Flags of ``run`` the fast path understands (anything else goes to typer).
_VALUED = ("--home", "--wait-ms")
_SWITCHES = {"--queue": "queue", "--read-only": "read_only"}
#: The default of ``shellyard run --wait-ms`` (cli/executions.py) and the SDK's read slack.
_WAIT_MS = 30_000
_WAIT_SLACK_S = 15.0


def parse_run(argv: list[str]) -> tuple[Path | None, dict[str, Any]] | None:
    """(home, request body) of ``run [flags] -- WORDS`` when the fast path covers it, else
    None. ``argv`` is without the program name."""
    if len(argv) < 3 or argv[0] != "run" or "--" not in argv:
        return None
    split = argv.index("--")
    flags, words = argv[1:split], argv[split + 1 :]
    if not words:
        return None
    home: Path | None = None
    body: dict[str, Any] = {"wait_ms": _WAIT_MS, "background": False, "queue": False,
                            "read_only": False}  # fmt: skip
    index = 0
    while index < len(flags):
        flag, equals, value = flags[index].partition("=")
        if flag in _VALUED:
            if equals and not value:
                return None
            if not equals:
                index += 1
                if index >= len(flags):
                    return None
                value = flags[index]
            if flag == "--home":
                home = Path(value)
            elif value.lstrip("-").isdigit():
                body["wait_ms"] = int(value)
            else:
                return None  # typer words the usage error
        elif flag in _SWITCHES and not equals:
            body[_SWITCHES[flag]] = True
        else:
            return None
        index += 1
    body["command"] = words[0] if len(words) == 1 else shlex.join(words)
    # Ctrl-C before the answer finds the execution by this key (E10, cli/executions.py).
    body["idempotency_key"] = f"cli-{os.urandom(12).hex()}"
    return home, body


def quick_run(argv: list[str]) -> int | None:
    """The exit code of a ``run`` answered here, or None for the typer app."""
    parsed = parse_run(argv)
    if parsed is None:
        return None
    home, body = parsed
    from shellyard.cli.exits import EXIT_BY_STATE, say_error
    from shellyard.errors import ShellyardError
    from shellyard.home import default_home, ensure_server, is_served, read_info, settings_drift

    where = home or default_home()
    agent = os.environ.get("SHELLYARD_AGENT") or None
    try:
        # A served home is asked at once (ensure_server would first GET /health); refused:
        # the server is gone or going, so nothing ran; start it the usual way and ask again.
        info = read_info(where) if is_served(where) else None
        try:
            if info is None:
                raise _Refused("not served")
            token = os.environ.get("SHELLYARD_TOKEN") or info.token
            data = _post(info.url, token, "/v1/executions", body, agent)
        except _Refused:
            info = ensure_server(where)
            token = os.environ.get("SHELLYARD_TOKEN") or info.token
            try:
                data = _post(info.url, token, "/v1/executions", body, agent)
            except _Refused as exc:
                from shellyard.sdk.status import unreachable

                raise unreachable(exc) from exc
        drift = settings_drift(info)
        if drift:
            say_note(drift)
        if data.get("note"):  # docs/environments.md: no base prepared yet
            say_note(str(data["note"]))
        if data["state"] not in ("completed", "cancelled", "failed", "unknown"):
            return _follow(home, data, body)  # still going after --wait-ms: the SDK follows it
    except ShellyardError as exc:
        return say_error(exc)
    except KeyboardInterrupt:
        return _interrupted(where, body)
    sys.stdout.write(data.get("stdout") or "")
    sys.stderr.write(data.get("stderr") or "")
    if data.get("error"):
        from shellyard.cli.common import err

        err.print(f"shellyard: {data['state']}: {data['error']}", highlight=False)
    code = data.get("exit_code")
    return int(code) if code is not None else EXIT_BY_STATE.get(data["state"], 1)


def say_note(text: str) -> None:
    """``shellyard: note: TEXT`` on stderr, on a terminal only (a script's stderr stays the
    command's own; cli/executions.py does the same through rich). The text comes from
    elsewhere (the server's settings, a runner's words, which may quote an agent's), so its
    control codes are shown as ``\\xNN``, never sent to the operator's terminal (docs/security.md
    "Attack pass (session 45)")."""
    if sys.stderr.isatty():
        from shellyard.errors import visible

        sys.stderr.write(f"shellyard: note: {visible(text)}\n")


def _interrupted(home: Path, body: dict[str, Any]) -> int:
    """Ctrl-C before the answer: cancel what this ``run`` started (cli/executions.py)."""
    from shellyard.cli.common import client_for
    from shellyard.cli.executions import interrupted

    options = {k: v for k, v in body.items() if k not in ("command", "wait_ms")}
    with client_for(home) as client:
        return interrupted(client, body["command"], options, None)


def _post(
    url: str, token: str, path: str, body: dict[str, Any], agent: str | None = None
) -> dict[str, Any]:
    """One JSON POST to the server; its decoded answer. Plain HTTP/1.1 on loopback over a
    socket: ``http.client`` imports ``email`` and ``ssl`` (a fifth of this path's time)."""
    from urllib.parse import urlsplit

    from shellyard.sdk.status import raise_for

    where = urlsplit(url)
    payload = json.dumps(body).encode()
    head = (
        f"POST {where.path.rstrip('/')}{path} HTTP/1.1\r\nHost: {where.netloc}\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        + (f"X-Shellyard-Agent: {agent}\r\n" if agent else "")
        + f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    )
    timeout = body["wait_ms"] / 1000 + _WAIT_SLACK_S
    status, content = _exchange(where.hostname or "", where.port or 80, head.encode() + payload,
                                timeout)  # fmt: skip
    raise_for(status, content)
    return _answer(content)


#: A final ``run_shell`` answer's fields this path reads, and the types each may have.
_READ: dict[str, tuple[type, ...]] = {
    "stdout": (str, type(None)),
    "stderr": (str, type(None)),
    "error": (str, type(None)),
    "note": (str, type(None)),
    "exit_code": (int, type(None)),
}


def _answer(content: bytes) -> dict[str, Any]:
    """A ``run_shell`` answer as a dict whose fields this path reads have their types; else
    the SDK's error for an answer it cannot read (a proxy's page, another service, another
    version), never a traceback (docs/security.md "Attack pass (session 50)")."""
    from shellyard.sdk.answer_clock import unreadable

    try:
        answer = json.loads(content)
    except (ValueError, RecursionError):
        raise unreadable(content, "is not JSON") from None
    shaped = isinstance(answer, dict) and answer.get("state") in _STATES
    if shaped:
        for name, types in _READ.items():
            value = answer.get(name)
            shaped = shaped and isinstance(value, types) and not isinstance(value, bool)
    if not shaped:
        raise unreadable(content, "is not what the SDK expects (a run_shell answer)")
    return dict(answer)


#: ``run_shell``'s states (contract/executions.py ``ExecutionState``), without importing it.
_STATES = ("queued", "running", "completed", "cancelled", "failed", "unknown")


class _Refused(Exception):
    """Nothing listens at the address (the request was not sent)."""


#: Room for the answer's head on top of the SDK's bound on its body.
_HEAD_BYTES = 64 << 10


def _exchange(host: str, port: int, request: bytes, timeout: float) -> tuple[int, bytes]:
    """Send ``request``, read the whole answer (the server closes: ``Connection: close``);
    (status, body). Errors are the SDK's: unreachable, or a broken answer; and its bounds
    (sdk/answer_clock.py, httpx-free): at most ``MAX_JSON_BYTES`` of body, all within
    ``timeout`` plus a second per 64 KiB received, however the answer is paced."""
    import socket

    from shellyard.errors import AnswerLost, ShellyardError
    from shellyard.sdk.answer_clock import (
        MAX_JSON_BYTES,
        AnswerClock,
        advice,
        too_large_message,
    )
    from shellyard.sdk.status import unreachable

    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except ConnectionRefusedError as exc:
        raise _Refused(str(exc)) from exc
    except OSError as exc:
        raise unreachable(exc) from exc
    chunks = []
    # the request goes whole: a cut answer's advice is a POST's (the command may run)
    clock = AnswerClock(timeout, method="POST")
    sent = False
    try:
        with sock:
            sock.sendall(request)
            sent = True
            while True:
                wait, _by_clock = clock.bound(timeout)
                if wait is None or wait <= 0:
                    raise clock.late_error()
                sock.settimeout(wait)
                try:
                    chunk = sock.recv(1 << 16)
                except TimeoutError:
                    # Cut by the whole answer's time or by a server silent from the start:
                    # either way the POST went whole and may have run (AnswerLost, exit 124),
                    # never 75's "cannot reach ... retry" (docs/security.md "Attack pass
                    # (session 50)").
                    raise clock.late_error() from None
                if not chunk:
                    break
                clock.received += len(chunk)
                if clock.received > MAX_JSON_BYTES + _HEAD_BYTES:
                    raise ShellyardError(too_large_message(MAX_JSON_BYTES, "this command"))
                chunks.append(chunk)
    except OSError as exc:
        if sent:  # the POST went whole on a fresh connection: the server may act on it
            broke = f"the control plane's connection broke ({exc}); "
            raise AnswerLost(broke + advice("POST")) from exc
        raise unreachable(exc) from exc
    return _parse_answer(b"".join(chunks))


def _parse_answer(raw: bytes) -> tuple[int, bytes]:
    """(status, body) of a whole answer to the POST; an answer cut or not HTTP came after the
    request went whole (the server may run the command: E11), so it is ``AnswerLost`` (exit
    124, look first), never 75's retry (docs/security.md "Attack pass (session 50)")."""
    from shellyard.errors import AnswerLost
    from shellyard.sdk.answer_clock import advice

    cut = AnswerLost(
        f"the control plane's answer was cut or not HTTP: {raw[:80]!r}; " + advice("POST")
    )
    head, separator, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if not separator or len(parts) < 2 or not parts[1].isdigit():
        raise cut
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip().lower()
    # An answer cut short (the server or the network closed mid-body) is the same error as a
    # head cut short, never a ValueError's traceback nor a truncated body parsed as JSON
    # (docs/security.md "Attack pass (session 49)").
    if headers.get(b"transfer-encoding") == b"chunked":
        try:
            body = _unchunk(body)
        except ValueError:
            raise cut from None
    elif b"content-length" in headers:
        length = headers[b"content-length"]
        if not length.isdigit() or int(length) != len(body):
            raise cut
    return int(parts[1]), body


def _unchunk(data: bytes) -> bytes:
    """A chunked body's bytes; ValueError unless it is whole (every chunk, the last one)."""
    out, position = bytearray(), 0
    while True:
        end = data.index(b"\r\n", position)
        size = int(data[position:end].split(b";")[0], 16)
        if size == 0:
            return bytes(out)
        if size < 0 or data[end + 2 + size : end + 4 + size] != b"\r\n":
            raise ValueError("a chunk cut short")
        out += data[end + 2 : end + 2 + size]
        position = end + 2 + size + 2


def _follow(home: Path | None, data: dict[str, Any], body: dict[str, Any]) -> int:
    from pydantic import ValidationError

    from shellyard.cli.common import client_for
    from shellyard.cli.executions import finish_run, interrupted
    from shellyard.contract.executions import RunShellResult
    from shellyard.sdk.base import not_understood

    try:
        result = RunShellResult.model_validate(data)
    except ValidationError as exc:  # not final, and not the shape the SDK follows
        raise not_understood(json.dumps(data).encode(), exc) from None
    with client_for(home) as client:
        try:
            return int(finish_run(client, result))
        except KeyboardInterrupt:
            options = {k: v for k, v in body.items() if k not in ("command", "wait_ms")}
            return interrupted(client, body["command"], options, str(data["execution_id"]))


class _Deferred(type):
    """A stand-in class for ``module.name`` (``__module__``/``__qualname__``): calling it or
    reading an attribute imports the real one. typer's help module imports rich's Markdown
    and Traceback at its top (40% of its import, measured) and uses them only for markdown
    help and for a crash's traceback."""

    def _real(cls) -> Any:
        import importlib

        module = cls.__module__
        if getattr(sys.modules.get(module), "__deferred__", False):
            del sys.modules[module]
        return getattr(importlib.import_module(module), cls.__qualname__)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls._real()(*args, **kwargs)

    def __getattr__(cls, attr: str) -> Any:
        return getattr(cls._real(), attr)


def defer_rich_extras() -> None:
    """Put stand-ins for ``rich.markdown`` and ``rich.traceback`` in place (when nothing has
    imported them yet) for a help page: it needs neither."""
    import types

    for module, name in (("rich.markdown", "Markdown"), ("rich.traceback", "Traceback")):
        if module in sys.modules:
            continue
        stand_in = types.ModuleType(module)
        stand_in.__deferred__ = True  # type: ignore[attr-defined]
        setattr(stand_in, name, _Deferred(name, (), {"__module__": module, "__qualname__": name}))
        sys.modules[module] = stand_in


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("shellyard")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"


def main() -> None:
    if sys.argv[1:] in (["--version"], ["-V"]):
        sys.stdout.write(f"shellyard {version()}\n")
        sys.exit(0)
    code = quick_run(sys.argv[1:])
    if code is not None:
        sys.stdout.flush()
        sys.exit(code)
    from shellyard.cli.helppage import cache as helpcache

    if not helpcache.is_help(sys.argv[1:]):
        from shellyard.cli.app import main as app_main

        if len(sys.argv) < 2:
            defer_rich_extras()
        app_main()
        return
    kept = helpcache.replay(sys.argv[1:])  # a page printed before, nothing it needs changed
    if kept is not None:
        sys.exit(kept)
    defer_rich_extras()
    from shellyard.cli.app import main as app_main

    with helpcache.recording(sys.argv[1:]):
        app_main()
