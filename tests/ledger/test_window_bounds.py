"""What a step printed about its account's windows is bounded (ledger.windows rule 1): the
agent writes its CLI's output, so a forged `rejected until 9999-12-31` lasts at most the
window's own length, and a flood of window names keeps at most 16 per account."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from domain.windows import Window
from ledger.models import AccountWindow
from ledger.windows import MAX_WINDOWS_PER_ACCOUNT, latest_windows, windows_record

pytestmark = pytest.mark.django_db

FAR = datetime(9999, 12, 31, tzinfo=UTC)


@pytest.mark.parametrize(
    ("name", "length"),
    [
        ("5h", timedelta(hours=5)),
        ("7d", timedelta(days=7)),
        ("session", timedelta(days=7)),
    ],
)
def test_a_reset_lies_at_most_the_windows_length_after_the_observation(
    name: str, length: timedelta
) -> None:
    now = timezone.now()
    windows_record(
        account="acct-a",
        provider="claude",
        windows=[Window(name=name, status="rejected", resets_at=FAR, source="forged")],
        now=now,
    )
    (window,) = latest_windows(["acct-a"], now=now)["acct-a"]
    assert window.resets_at == now + length
    # ... and so it is over once that length has passed.
    assert not window.exhausted(now + length + timedelta(seconds=1), max_used=0.9)


def test_a_flood_of_window_names_keeps_sixteen_per_account() -> None:
    now = timezone.now()
    for batch in range(5):
        windows_record(
            account="acct-a",
            provider="claude",
            windows=[
                Window(name=f"w{batch}-{i}", used=0.5, source="forged")
                for i in range(110)
            ],
            now=now,
        )
    names = set(
        AccountWindow.objects.filter(account_profile="acct-a").values_list(
            "window", flat=True
        )
    )
    assert len(names) == MAX_WINDOWS_PER_ACCOUNT
    # A name already kept is still recorded.
    kept = sorted(names)[0]
    assert (
        windows_record(
            account="acct-a",
            provider="claude",
            windows=[Window(name=kept, used=0.1, source="real")],
            now=now,
        )
        == 1
    )
