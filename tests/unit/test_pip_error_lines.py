"""V8, R2 reserve (docs/limits.md "Package tools"): when the runner stopped a package tool (the
free-space reserve, a limit), its verdict is the last line of the tool's log; the change's
error keeps it however long uv's error before it is. A build backend's traceback of ENOSPC
pushed it past the 2,000 characters kept, and the change failed naming only uv's error."""

from __future__ import annotations

from shellyard.runner.environments.managers.pip import _classify

VERDICT = (
    "the package tool was stopped: it filled the runner's volume (a write failed with 'No "
    "space left on device'), below its reserve of 64.0 MiB (300 MiB free once it ended)"
)


def test_the_runners_verdict_survives_a_long_uv_error() -> None:
    traceback = "\n".join(f'  File "/env-cache/uv/backend.py", line {n}, in f' for n in range(80))
    tail = (
        "$ uv pip install sy-fill\n"
        "error: Failed to build `sy-fill==1.0`\n"
        f"{traceback}\nOSError: [Errno 28] No space left on device\n"
        f"\nshellyard: {VERDICT}\n"
    )
    error = _classify(tail, "install")
    assert len(tail) > 2000
    assert error.message.startswith(f"uv pip install failed: {VERDICT}; error: Failed to build")
    assert error.message.count("below its reserve") == 1


def test_without_a_verdict_the_error_is_uvs_alone() -> None:
    error = _classify(
        "$ uv pip install x\nerror: Failed to build `x==1`\n  cause: boom\n", "install"
    )
    assert error.message == "uv pip install failed: error: Failed to build `x==1` cause: boom"
