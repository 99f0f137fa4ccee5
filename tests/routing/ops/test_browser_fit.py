"""/ops/ and /ops/accounts/ with 24 accounts, half of them cooling down, in a real browser
at 1400 px: no page wider than the window, the cooldown reasons on wide
lines, the accounts grouped by provider with a filter, expired windows in grey, a drain's
cap red only over what it admitted, the idle drains on one row, and the item page headed by
its task's title.

Shares the worker's one Chromium and the page helpers of tests/routing/ops/browser.py,
as tests/routing/ops/test_browser_retry.py does.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model

from tests.routing.ops import crowd
from tests.routing.ops.browser import (
    PASSWORD,
    fits,
    follow,
    screenshot,
    sign_in,
    text_of,
    visit,
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.sqlite,  # as tests/routing/ops/test_browser.py says why
    pytest.mark.django_db(transaction=True),
    pytest.mark.xdist_group(
        "browser"
    ),  # the worker's one Chromium (tests/routing/ops/browser.py)
]

WIDTH = 1400


def page_width(driver: Any) -> int:
    return int(driver.execute_script("return document.documentElement.scrollWidth"))


def rows_text(driver: Any, css: str) -> list[str]:
    return [str(t) for t in driver.execute_script(ROWS_JS, css)]


ROWS_JS = """
return Array.from(document.querySelectorAll(arguments[0])).map(e => e.innerText);
"""


def test_the_overview_and_the_accounts_fit_1400_px_with_24_accounts_cooling(
    browser: Any,  # noqa: F811
    live_server: Any,
) -> None:
    from selenium.webdriver.common.by import By

    get_user_model().objects.create_superuser("operator", "op@example.com", PASSWORD)
    seeded = crowd.crowded()

    sign_in(browser, live_server.url, "/ops/", "#cooldowns")
    assert page_width(browser) <= WIDTH
    fits(browser, "overview")
    # The cooldown reasons get the page's width, not one word a line.
    reasons = browser.find_elements(By.CSS_SELECTOR, "#cooldowns td.wrap")
    assert len(reasons) == len(seeded.cooling)
    assert min(r.rect["width"] for r in reasons) >= 400
    # Account load: a row per cooling account, the free ones on one line.
    load = browser.find_elements(
        By.CSS_SELECTOR, "#accounts tbody tr:not(.folded-accounts)"
    )
    assert len(load) == len(seeded.cooling)
    folded = text_of(browser, "#accounts tr.folded-accounts")
    assert folded.startswith(f"{crowd.ACCOUNTS - len(seeded.cooling)} free:")
    assert seeded.expired_window_account in folded
    # The API's items fill the drain's cap of 1 without being admitted under it: not red.
    scope = browser.find_element(
        By.XPATH, f"//section[@id='scopes']//tr[td/code[text()='{crowd.API_SCOPE}']]"
    )
    assert "3 / 1" in scope.text and "3 of them admitted without a cap" in scope.text
    assert scope.find_elements(By.CSS_SELECTOR, ".full") == []
    # Twelve idle drains of the 1-minute schedule: one row.
    empties = rows_text(browser, "#drains tr.empty-drains")
    assert len(empties) == 1 and empties[0].startswith("12 drains did nothing from ")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#drains tbody tr")) <= 5
    screenshot(browser, "62-overview-24-accounts")

    visit(browser, f"{live_server.url}/ops/accounts/", "#account-filters")
    assert page_width(browser) <= WIDTH
    fits(browser, "accounts")
    groups = rows_text(browser, "#table tr.account-group")
    assert [g.split(" — ")[0] for g in groups] == sorted(crowd.PROVIDERS)
    assert all("8 accounts: 4 cooling down, 4 free" in g for g in groups), groups
    # The cooling ones in full, the free ones folded into a line per provider.
    assert len(browser.find_elements(By.CSS_SELECTOR, "#table tr[id^=account-]")) == 12
    assert len(browser.find_elements(By.CSS_SELECTOR, "#table tr.folded-accounts")) == 3
    # The runner's 429 window reset 9 minutes ago: expired, in grey, not a red "rejected".
    expired = browser.find_element(
        By.CSS_SELECTOR, "#windows tr.window-row[data-expired]"
    )
    assert seeded.expired_window_account in expired.text
    assert "expired" in expired.text and "was rejected" in expired.text
    assert expired.find_elements(By.CSS_SELECTOR, ".full") == []
    screenshot(browser, "62-accounts-24")

    # The filter: the cooling codex accounts, each in full, and nothing else.
    follow(
        browser,
        browser.find_element(By.LINK_TEXT, "codex (8)"),
        "#account-filters a.current",
    )
    follow(
        browser,
        browser.find_element(By.PARTIAL_LINK_TEXT, "cooling down ("),
        "#table",
    )
    assert browser.current_url.endswith("/ops/accounts/?provider=codex&state=cooling")
    shown = rows_text(browser, "#table tr[id^=account-] td.account")
    assert shown == sorted(n for n in seeded.cooling if n.startswith("codex_"))
    assert rows_text(browser, "#windows td:first-child") == shown
    assert page_width(browser) <= WIDTH
    visit(browser, f"{live_server.url}/ops/accounts/?state=asleep", "#filter-error")
    assert "no account state 'asleep'" in text_of(browser, "#filter-error")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#table tr.account-group")) == 3

    # The item page: the task's title heads it, the id below; the processes explained.
    visit(browser, f"{live_server.url}/ops/items/{seeded.item.id}/", "#item-heading")
    assert text_of(browser, "#item-heading") == crowd.TASK_TITLE
    assert seeded.item.id in text_of(browser, ".item-id")
    assert "2 processes it left running, stopped at its end" in text_of(
        browser, "#runs .processes-ended"
    )
    assert page_width(browser) <= WIDTH
    screenshot(browser, "62-item-title")
