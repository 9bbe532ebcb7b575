"""``serve --log-format json`` (docs/operations.md): one JSON object per line on stderr, for log
collectors. Each line has ``ts`` (UTC, ISO 8601), ``level``, ``logger`` and ``message``, and
every field the code attached to the record (``execution_id``, ``session_id``, ``runner_id``,
``agent_id``, ``wake_id``, ``action``, …) where it knows them."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

#: The attributes every LogRecord has; anything else was passed as ``extra``.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


def configure_json_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
