"""The ops pages in a real browser: headless Debian Chromium against pytest-django's live server.

Signs in through the admin login, walks overview → deferrals → one item's history →
accounts → drains → one drain, checks what is shown (including that the SVG charts are laid
out), and saves a PNG of each page under artifacts/screenshots/ for people to look at.

Chromium comes from Debian (`chromium`, `chromium-driver`; `.ci/run` installs them); nothing
is downloaded at run time (Selenium Manager is kept offline and never needed: both paths are
given). A missing browser fails the test, so CI cannot pass without having run it; set
LOOPSWEB_SKIP_BROWSER=1 to skip it on a machine without Chromium.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from ledger.models import Account, WorkflowStepRun
from routing.models import DrainRecord
from tests.routing.helpers import generic_event
from tests.routing.ops import seed as ops_seed

# transaction=True: the live server thread reads what the test wrote, so it must be committed.
pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SCREENSHOTS = Path(__file__).resolve().parents[3] / "artifacts" / "screenshots"
# Flags for this machine's closed network: no background connections, no sandbox as root.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
)
PASSWORD = "operator-password"


@pytest.fixture
def browser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    if os.environ.get("LOOPSWEB_SKIP_BROWSER") == "1":
        pytest.skip("LOOPSWEB_SKIP_BROWSER=1")
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(p)]
    if missing:
        pytest.fail(
            f"{' and '.join(missing)} not found: install Debian's browser with "
            "`apt-get install -y chromium chromium-driver` (.ci/run does), or set "
            "LOOPSWEB_SKIP_BROWSER=1 to skip the browser test",
            pytrace=False,
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    monkeypatch.setenv("SE_OFFLINE", "true")  # Selenium Manager must never download
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    driver = webdriver.Chrome(
        options=options, service=Service(executable_path=CHROMEDRIVER)
    )
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def screenshot(driver: Any, name: str) -> Path:
    """A PNG of the whole page: the window is stretched to the document's height first."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1400, min(max(int(height) + 40, 600), 6000))
    path = SCREENSHOTS / f"{name}.png"
    assert driver.save_screenshot(str(path)), path
    assert path.stat().st_size > 10_000, f"{path} looks empty"
    return path


def text_of(driver: Any, css: str) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.CSS_SELECTOR, css).text)


def follow(driver: Any, element: Any) -> None:
    """Click a link or submit button and wait until the next page has loaded.

    A click returns as soon as the event is dispatched; without the wait the next read can
    still see the old page (or its URL), which made the login step flaky.
    """
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    old_page = driver.find_element(By.TAG_NAME, "html")
    element.click()
    wait = WebDriverWait(driver, 60)
    wait.until(expected_conditions.staleness_of(old_page))
    wait.until(lambda d: d.execute_script("return document.readyState") == "complete")


def test_an_operator_walks_the_ops_pages_in_chromium(
    browser: Any, live_server: Any
) -> None:
    from selenium.webdriver.common.by import By

    get_user_model().objects.create_superuser("operator", "op@example.com", PASSWORD)
    waiting = ops_seed.deferred_items(3)
    history = generic_event(project="/srv/history", group="g-history")
    ops_seed.redefer(history, 3)
    (report,) = ops_seed.drains(1, inbox_events=4)
    ops_seed.account_history(3)
    # The account registry: acct-00 registered with its login dir, acct-01 disabled,
    # acct-02 left unregistered; acct-00's failed step reported claude usage.
    Account.objects.create(
        name="acct-00",
        provider="codewith",
        env_json={"CODEWITH_HOME": "/srv/agents/acct-00"},
        max_running=2,
    )
    Account.objects.create(name="acct-01", provider="codewith", enabled=False)
    WorkflowStepRun.objects.filter(
        account_profile="acct-00", step_id="verifier"
    ).update(usage_input_tokens=18540, usage_output_tokens=311, usage_cost_usd=0.042)

    # Sign in through the admin login, which sends the operator back to /ops/.
    browser.get(f"{live_server.url}/ops/")
    assert "/admin/login/" in browser.current_url
    browser.find_element(By.NAME, "username").send_keys("operator")
    browser.find_element(By.NAME, "password").send_keys(PASSWORD)
    follow(browser, browser.find_element(By.CSS_SELECTOR, "input[type=submit]"))
    assert browser.current_url == f"{live_server.url}/ops/"

    # Overview: caps per scope, account load, cooldowns, deferral reasons, last drains.
    assert text_of(browser, "#content h1") == "Operations overview"
    scopes = text_of(browser, "#scopes")
    assert "nightly-0" in scopes and "1 / 1" in scopes and ops_seed.SCOPE in scopes
    assert "acct-02" in text_of(browser, "#cooldowns") and "UTC" in text_of(
        browser, "#cooldowns"
    )
    assert "Route scope limit (--max-active)" in text_of(browser, "#deferrals")
    assert "nightly-0" in text_of(browser, "#drains")
    screenshot(browser, "01-overview")

    # The admin index links here.
    browser.get(f"{live_server.url}/admin/")
    links = browser.find_elements(By.CSS_SELECTOR, "#operations-module a")
    assert {a.text.lower() for a in links} >= {
        "operations",
        "overview",
        "deferrals",
        "accounts",
        "drains",
    }
    screenshot(browser, "02-admin-index")
    follow(browser, next(a for a in links if a.text == "Deferrals"))

    # Deferrals: grouped, then one item's history.
    assert text_of(browser, "#content h1") == "Deferrals"
    groups = browser.find_elements(By.CSS_SELECTOR, "#groups tbody tr")
    assert len(groups) == len(waiting) + 1  # one group per project, plus /srv/history
    assert "/srv/p0" in text_of(browser, "#groups")
    assert "held by pre-check" in text_of(browser, "#inbox")
    screenshot(browser, "03-deferrals")
    browser.get(f"{live_server.url}/ops/deferrals/?project_key=/srv/history")
    follow(browser, browser.find_element(By.CSS_SELECTOR, "#items tbody a"))
    rows = browser.find_elements(By.CSS_SELECTOR, "#history tbody tr")
    assert len(rows) == 3
    assert "route scope active: 1 / 1" in rows[0].text and "route_cap" in rows[0].text
    screenshot(browser, "04-deferral-history")

    # Accounts: the table, and both SVG charts laid out with a bar and cells per account.
    follow(browser, browser.find_element(By.LINK_TEXT, "Accounts"))
    assert text_of(browser, "#content h1") == "Accounts"
    assert "acct-00" in text_of(browser, "#table")
    # One read of the rendered table (no element handles kept across reads).
    cells = browser.execute_script(
        """
        const out = {};
        for (const row of document.querySelectorAll('#table tr[id^="account-"]')) {
          const cell = (css) => row.querySelector(css).innerText.trim();
          out[cell('td code')] = {
            registry: cell('td.registry'),
            tokens5h: cell('td.tokens-5h'),
            tokens7d: cell('td.tokens-7d'),
          };
        }
        return out;
        """
    )
    assert "enabled" in cells["acct-00"]["registry"]
    assert "CODEWITH_HOME=/srv/agents/acct-00" in cells["acct-00"]["registry"]
    assert "max running 2" in cells["acct-00"]["registry"]
    assert "disabled" in cells["acct-01"]["registry"]
    assert cells["acct-02"]["registry"] == "unregistered"
    assert "18540 in / 311 out" in cells["acct-00"]["tokens5h"]
    assert "$0.0420" in cells["acct-00"]["tokens7d"]
    assert cells["acct-02"]["tokens7d"] == "—"
    chart = browser.find_element(By.CSS_SELECTOR, "svg.load-chart")
    assert chart.size["width"] > 400 and chart.size["height"] > 60
    assert len(chart.find_elements(By.CSS_SELECTOR, "rect.running")) >= 3
    timeline = browser.find_element(By.CSS_SELECTOR, "svg.timeline")
    assert len(timeline.find_elements(By.CSS_SELECTOR, "rect.cell:not(.empty)")) == 6
    screenshot(browser, "05-accounts")

    # Drains: the list, then one drain's per-item results.
    follow(browser, browser.find_element(By.LINK_TEXT, "Drains"))
    assert text_of(browser, "#content h1") == "Drains"
    screenshot(browser, "06-drains")
    record = DrainRecord.objects.get(pk=report.record_id)
    follow(
        browser,
        browser.find_element(
            By.CSS_SELECTOR, f"#drains a[href='/ops/drains/{record.id}/']"
        ),
    )
    results = browser.find_elements(By.CSS_SELECTOR, "#results tbody tr")
    assert len(results) == record.considered == 4
    assert [r.text.split()[1] for r in results] == [
        "created",
        "throttled",
        "throttled",
        "throttled",
    ]
    assert "pre-check" in results[1].text
    screenshot(browser, "07-drain")
