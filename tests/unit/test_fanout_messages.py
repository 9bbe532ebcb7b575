"""The fan-out between replicas speaks in words (docs/architecture.md, "Inside control/"): each
message names its kind and its fields, and a replica ignores its own messages and the kinds it
does not know. No database here: the message is built and dispatched as the listener would."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from shellyard.control.replicas.fanout import Fanout, Kind


def _fanout(replica: str) -> Fanout:
    return Fanout("postgresql+psycopg://127.0.0.1/none", "s1", replica)


def test_a_message_names_its_kind_and_fields_in_words() -> None:
    built = _fanout("r1").message(Kind.WAKE_EMITTED, session_id="se_1", seq=7)
    assert built is not None
    channel, payload = built
    assert channel == "shellyard_s1"
    assert json.loads(payload) == {
        "kind": "wake_emitted",
        "replica": "r1",
        "session_id": "se_1",
        "seq": 7,
    }
    assert all(len(kind.value) > 1 and kind.value.islower() for kind in Kind)


def test_dispatch_routes_by_kind_and_skips_its_own_and_unknown_kinds() -> None:
    receiver = _fanout("r2")
    seen: list[dict[str, Any]] = []

    async def ended(message: dict[str, Any]) -> None:
        seen.append(message)

    receiver.handlers[Kind.EXECUTION_ENDED] = ended
    sender = _fanout("r1")
    mine = receiver.message(Kind.EXECUTION_ENDED, execution_id="ex_mine")
    theirs = sender.message(Kind.EXECUTION_ENDED, execution_id="ex_1")
    assert mine is not None and theirs is not None

    async def scenario() -> None:
        await receiver._dispatch(theirs[1])
        await receiver._dispatch(mine[1])  # its own: acted on in-process already
        await receiver._dispatch(json.dumps({"kind": "x", "replica": "r1", "e": "ex_2"}))
        await receiver._dispatch("not json")

    asyncio.run(scenario())
    assert [m["execution_id"] for m in seen] == ["ex_1"]
    assert receiver.received == 1


def test_sqlite_publishes_nothing() -> None:
    assert Fanout(None, None, "r1").message(Kind.TIMERS_CHANGED) is None
