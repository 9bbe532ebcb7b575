"""The operator's webhook exceptions (docs/operations.md, control/notify/webhook_policy.py):
read from ``SHELLYARD_WEBHOOK_EXCEPTIONS`` as exact host:port pairs; a malformed one is refused
with the reason before the server starts."""

from __future__ import annotations

import pytest

from shellyard.config import Settings
from shellyard.control.notify.webhook_policy import WebhookPolicy
from shellyard.errors import InvalidInput


def test_exceptions_come_from_the_environment_as_exact_pairs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SHELLYARD_WEBHOOK_EXCEPTIONS", "127.0.0.1:8787, [FD00::5]:443,Hooks.LAN:80")
    settings = Settings.from_env()
    assert settings.notifications.webhook_exceptions == [
        "127.0.0.1:8787",
        "[FD00::5]:443",
        "Hooks.LAN:80",
    ]
    policy = WebhookPolicy(settings.notifications.webhook_exceptions)
    assert policy.exceptions == {("127.0.0.1", 8787), ("fd00::5", 443), ("hooks.lan", 80)}


@pytest.mark.parametrize(
    "bad", ["127.0.0.1", "127.0.0.0/8:80", "host:0", ":80", "*.lan:80", "[fd00::zz]:80"]
)
def test_a_malformed_exception_is_refused_with_the_reason(bad: str) -> None:
    with pytest.raises(InvalidInput, match="SHELLYARD_WEBHOOK_EXCEPTIONS"):
        WebhookPolicy([bad])
