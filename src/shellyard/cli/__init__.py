"""The ``shellyard`` command line: the typer app in ``app.py``, one verb module per concept.

Start-up time is paid by every verb, so this package keeps one measured cost away: importing
``httpx`` imports ``httpx._main``, the ``httpx`` command-line tool, which pulls in click, rich
and pygments (about half of httpx's import time). The CLI never runs that tool; a stand-in
module loads the real one if anything ever calls ``httpx._main.main``.
"""

from __future__ import annotations

import sys
import types
from typing import Any


def _httpx_main(*args: Any, **kwargs: Any) -> Any:
    sys.modules.pop("httpx._main", None)
    from httpx._main import main

    return main(*args, **kwargs)


if "httpx" not in sys.modules:
    _stand_in = types.ModuleType("httpx._main")
    _stand_in.main = _httpx_main  # type: ignore[attr-defined]
    sys.modules.setdefault("httpx._main", _stand_in)
