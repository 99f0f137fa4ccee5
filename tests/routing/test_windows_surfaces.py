"""Rate-limit windows on the operators' surfaces (docs/windows.md §5): /ops/accounts/ rows with
bars, the overview's mark, /metrics gauges by account and window, the read API's accounts."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from domain.windows import Window
from ledger.models import Account
from ledger.windows import windows_record
from tests.routing.api.helpers import bearer, make_token

pytestmark = pytest.mark.django_db


def _windows() -> int:
    reset = timezone.now().replace(microsecond=0) + timedelta(hours=2)
    windows_record(
        account="acctA",
        provider="codex",
        windows=[
            Window(name="5h", used=0.95, resets_at=reset, source="codex rollout"),
            Window(name="7d", used=0.17, resets_at=reset, source="codex rollout"),
        ],
    )
    windows_record(
        account="acctB",
        provider="claude",
        windows=[
            Window(
                name="5h",
                used=0.8,
                status="allowed_warning",
                resets_at=reset,
                source="claude rate_limit_event <b>",
            )
        ],
    )
    Account.objects.create(
        name="acctC", provider="opencode", window_budgets={"5h": 1000}
    )
    return int(reset.timestamp())


def _staff() -> Client:
    user = get_user_model().objects.create_superuser("op", "op@example.com", "pw")
    client = Client()
    client.force_login(user)
    return client


def test_ops_pages_show_each_window_and_mark_accounts_near_or_at_it() -> None:
    _windows()
    client = _staff()
    page = client.get("/ops/accounts/").content.decode()
    assert (
        page.count('class="window-row"') == 4
    )  # 2 of acctA, acctB's, acctC's estimate
    assert "95%" in page and 'style="width: 95%"' in page
    assert "claude rate_limit_event &lt;b&gt;" in page  # escaped
    assert "loopsweb estimate: 0 of 1000 tokens" in page
    overview = client.get("/ops/").content.decode()
    assert overview.count("window-mark") == 2
    assert "at window" in overview and "near window" in overview


def test_metrics_and_the_api_carry_the_windows(client: Client) -> None:
    reset = _windows()
    _, token = make_token("read", "metrics")
    text = client.get("/metrics", **bearer(token)).content.decode()
    assert (
        'loopsweb_account_window_used_ratio{account="acctA",window="5h"} 0.95' in text
    )
    assert (
        'loopsweb_account_window_used_ratio{account="acctA",window="7d"} 0.17' in text
    )
    assert (
        f'loopsweb_account_window_reset_timestamp_seconds{{account="acctB",window="5h"}} '
        f"{reset}" in text
    )
    accounts = {
        a["profile"]: a
        for a in client.get("/api/v1/accounts", **bearer(token)).json()["accounts"]
    }
    a = {w["window"]: w for w in accounts["acctA"]["windows"]}
    assert a["5h"]["used"] == 0.95 and a["5h"]["source"] == "codex rollout"
    assert a["5h"]["observedAt"] is not None
    assert accounts["acctA"]["windowMark"] == "at window"
    assert accounts["acctB"]["windowMark"] == "near window"
    assert accounts["acctB"]["windows"][0]["status"] == "allowed_warning"
