"""Sizes of the largest JSON answers the REST API gives, to set the SDK's bound on a JSON
answer (sdk/bounds.py ``MAX_JSON_BYTES``) well above them: ``run_shell`` at the largest
``max_output_length`` (plain characters, and control characters, which JSON escapes in six
bytes), a 1 MiB log page (text, base64), a recursive listing of 10,000 long paths.

    PYTHONPATH=src .venv/bin/python bench/measure_json_answers.py
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
from pathlib import Path
from typing import Any

import httpx

from shellyard.home import ensure_server

MAKE_FILES = (
    "python3 -c \"import os\nfor i in range(10000):\n  d='d'*200+'/'+'e'*200\n"
    "  os.makedirs(d, exist_ok=True)\n  open(d+'/'+('f%05d'%i)+'g'*240,'w').close()\""
)


def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="shellyard-measure-", dir="/tmp"))
    home.chmod(0o711)
    info = ensure_server(home)
    headers = {"Authorization": f"Bearer {info.token}"}
    client = httpx.Client(base_url=info.url, headers=headers, timeout=300)
    sizes: dict[str, int] = {}

    def run(command: str, **extra: Any) -> httpx.Response:
        body = {"command": command, "wait_ms": 30000, **extra}
        return client.post("/v1/executions", json=body)

    try:
        big = {"max_output_length": 10_000_000}
        sizes["run_shell 10M chars of 'x'"] = len(
            run("yes x | tr -d '\\n' | head -c 12000000", **big).content
        )
        sizes["run_shell 10M chars of NUL"] = len(run("head -c 12000000 /dev/zero", **big).content)
        eid = run("head -c 3000000 /dev/zero").json()["execution_id"]
        logs = f"/v1/executions/{eid}/logs"
        sizes["log page 1 MiB of NUL, text"] = len(
            client.get(logs, params={"limit": 1 << 20}).content
        )
        params = {"limit": 1 << 20, "encoding": "base64"}
        sizes["log page 1 MiB, base64"] = len(client.get(logs, params=params).content)
        assert run(MAKE_FILES).json()["state"] == "completed"
        listing = client.get("/v1/files", params={"recursive": True, "limit": 10000})
        sizes["file list 10,000 entries, ~650-character paths"] = len(listing.content)
    finally:
        os.kill(info.pid, signal.SIGTERM)
    print(json.dumps(sizes, indent=1))


if __name__ == "__main__":
    main()
