"""/ops/attention/ and /ops/delivered/ in a real browser at 1400 px:
long titles, reasons, paths and addresses wrap inside the window, each row links to its
item, and the filter form narrows the list.

Shares the worker's one Chromium and the page helpers of tests/routing/ops/browser.py,
as tests/routing/ops/test_browser_retry.py does.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model

from tests.routing import worklists_seed as seed
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

LONG_TITLE = (
    "Make the nightly end-to-end suite of the payments service deterministic again "
    "after the upgrade of the message broker client library to its next major version"
)
LONG_PROJECT = "/srv/projects/the-platform-team/payments/services/settlement-reconciler"
LONG_REASON = (
    "worker exited 1: "
    + "AssertionError: expected the settlement batch to reconcile, got "
    + "x" * 180
    + " (see the step's output)"
)


def _seed_long_rows() -> None:
    seed.seed_attention()
    seed.seed_delivered()
    seed.item_with_run(
        title=LONG_TITLE,
        item_status="failed",
        run_status="failed",
        error=LONG_REASON,
        project=LONG_PROJECT,
        scope="payments-nightly-end-to-end",
        accounts=(
            "codex-team-platform-primary",
            "codex-team-platform-secondary",
            "claude-team-platform-overflow",
        ),
        step_status="failed",
        step_reason="rate_limited",
    )
    long_remote = seed.pull_request_delivery(4242)
    long_remote["url"] = "https://github.com/the-platform-team/" + "p" * 90 + ".git"
    long_remote["ref"] = "refs/heads/loopsweb/run-" + "0123456789abcdef" * 2
    seed.item_with_run(
        title=LONG_TITLE,
        item_status="succeeded",
        run_status="succeeded",
        delivery=long_remote,
        project=LONG_PROJECT,
    )


def test_the_attention_and_delivered_lists_fit_1400_px_and_link_their_items(
    browser: Any,  # noqa: F811
    live_server: Any,
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    get_user_model().objects.create_superuser("operator", "op@example.com", PASSWORD)
    _seed_long_rows()

    sign_in(browser, live_server.url, "/ops/attention/", "#attention")
    browser.set_window_size(1400, 1000)
    visit(browser, f"{live_server.url}/ops/attention/", "#attention tbody tr")
    rows = browser.find_elements(By.CSS_SELECTOR, "#attention tbody tr")
    assert (
        len(rows) == 5
    )  # three of seed_attention, seed_delivered's refused, the long one
    assert any(seed.HOSTILE_TITLE in row.text for row in rows)  # shown as text
    assert "rate limited" in text_of(browser, "#attention")
    assert browser.execute_script("return document.documentElement.scrollWidth") <= 1400
    fits(browser, "/ops/attention/")
    screenshot(browser, "30-attention-1400")

    # The filter form: timed out only.
    Select(browser.find_element(By.NAME, "kind")).select_by_value("timed_out")
    follow(
        browser,
        browser.find_element(By.CSS_SELECTOR, "#filters input[type=submit]"),
        "#attention",
    )
    assert "kind=timed_out" in browser.current_url
    rows = browser.find_elements(By.CSS_SELECTOR, "#attention tbody tr")
    assert len(rows) == 1 and "Slow migration" in rows[0].text

    # Each row links to its item's page.
    follow(
        browser,
        browser.find_element(By.CSS_SELECTOR, "#attention tbody td.item a"),
        "#history",
    )
    assert "/ops/items/" in browser.current_url
    assert "Slow migration" in text_of(browser, "#content")

    browser.set_window_size(1400, 1000)
    visit(browser, f"{live_server.url}/ops/delivered/", "#delivered tbody tr")
    rows = browser.find_elements(By.CSS_SELECTOR, "#delivered tbody tr")
    assert len(rows) == 4
    links = [
        a.get_attribute("href")
        for a in browser.find_elements(By.CSS_SELECTOR, "a.pr-link")
    ]
    assert "https://github.com/acme/web/pull/12" in links
    assert not any(link.startswith("javascript:") for link in links)
    assert browser.execute_script("return document.documentElement.scrollWidth") <= 1400
    fits(browser, "/ops/delivered/")
    screenshot(browser, "31-delivered-1400")
    item_links = browser.find_elements(By.CSS_SELECTOR, "#delivered tbody td.item a")
    assert len(item_links) == 4
    follow(browser, item_links[0], "#history")
    assert "/ops/items/" in browser.current_url
