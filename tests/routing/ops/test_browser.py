"""The ops pages in a real browser: headless Debian Chromium against pytest-django's live server.

Signs in through the admin login, walks overview → deferrals → one item's history →
accounts → drains → one drain, checks what is shown (including that the SVG charts are laid
out), and saves a PNG of each page under artifacts/screenshots/ for people to look at.

Chromium comes from Debian (`chromium`, `chromium-driver`; `.ci/run` installs them); nothing
is downloaded at run time (Selenium Manager is kept offline and never needed: both paths are
given). A missing browser fails the test, so CI cannot pass without having run it; set
LOOPSWEB_SKIP_BROWSER=1 to skip it on a machine without Chromium.

Every navigation (`visit`, `follow`) and every click waits for what the page shows next (its
mark: an element, or a state), with a hang deadline (tests/waiting.py); nothing is read from
a page before its mark is there, and nothing sleeps.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from ledger.models import Account, WorkflowStepRun
from ledger.services import account_cooldown_record
from routing.models import DrainRecord
from tests.routing.helpers import generic_event
from tests.routing.ops import seed as ops_seed
from tests.routing.ops.browser import (
    ACCOUNT_COLUMNS,
    CLIPPED_JS,
    COLUMNS_JS,
    INBOX_COLUMNS,
    PASSWORD,
    WORK_ITEM_COLUMNS,
    fits,
    follow,
    screenshot,
    sign_in,
    text_of,
    visit,
    wait_for_mark,
)

# transaction=True: the live server thread reads what the test wrote, so it must be committed.
# SQLite only: what a browser does with the pages (layout, scripts, forms, navigation) is the
# same over either database. On PostgreSQL the pages' queries are proven by the page tests
# (tests/routing/ops/test_pages.py, test_console.py, test_item_actions.py), and Chromium
# browses the admin and /ops/ once, through the production server (tests/test_serve.py). Here
# they cost the PostgreSQL suite about 12 s of CPU, a Chromium of its own included.
pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.sqlite,
    pytest.mark.django_db(transaction=True),
    pytest.mark.xdist_group("browser"),  # one Chromium for them all (`Chromium`)
]


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
    visit(browser, f"{live_server.url}/ops/", "input[name=username]")
    assert "/admin/login/" in browser.current_url
    browser.find_element(By.NAME, "username").send_keys("operator")
    browser.find_element(By.NAME, "password").send_keys(PASSWORD)
    follow(
        browser, browser.find_element(By.CSS_SELECTOR, "input[type=submit]"), "#drains"
    )
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
    visit(browser, f"{live_server.url}/admin/", "#operations-module a")
    links = browser.find_elements(By.CSS_SELECTOR, "#operations-module a")
    assert {a.text.lower() for a in links} >= {
        "operations",
        "overview",
        "deferrals",
        "accounts",
        "drains",
    }
    screenshot(browser, "02-admin-index")
    follow(browser, next(a for a in links if a.text == "Deferrals"), "#inbox")

    # Deferrals: grouped, then one item's history.
    assert text_of(browser, "#content h1") == "Deferrals"
    groups = browser.find_elements(By.CSS_SELECTOR, "#groups tbody tr")
    assert len(groups) == len(waiting) + 1  # one group per project, plus /srv/history
    assert "/srv/p0" in text_of(browser, "#groups")
    assert "held by pre-check" in text_of(browser, "#inbox")
    screenshot(browser, "03-deferrals")
    visit(
        browser,
        f"{live_server.url}/ops/deferrals/?project_key=/srv/history",
        "#items tbody a",
    )
    follow(browser, browser.find_element(By.CSS_SELECTOR, "#items tbody a"), "#history")
    rows = browser.find_elements(By.CSS_SELECTOR, "#history tbody tr")
    assert len(rows) == 3
    assert "route scope active: 1 / 1" in rows[0].text and "route_cap" in rows[0].text
    screenshot(browser, "04-deferral-history")

    # Accounts: the table, and both SVG charts laid out with a bar and cells per account.
    follow(browser, browser.find_element(By.LINK_TEXT, "Accounts"), "svg.timeline")
    assert text_of(browser, "#content h1") == "Accounts"
    assert "acct-00" in text_of(browser, "#table")
    # One read of the rendered table (no element handles kept across reads), with the
    # registry's env (folded under "env (N)") unfolded as an operator's click does.
    cells = browser.execute_script(
        """
        document.querySelectorAll('#table details.registry-env').forEach(d => d.open = true);
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
    follow(browser, browser.find_element(By.LINK_TEXT, "Drains"), "#drains")
    assert text_of(browser, "#content h1") == "Drains"
    screenshot(browser, "06-drains")
    record = DrainRecord.objects.get(pk=report.record_id)
    follow(
        browser,
        browser.find_element(
            By.CSS_SELECTOR, f"#drains a[href='/ops/drains/{record.id}/']"
        ),
        "#results",
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


# --- issue 19: every page at 1400 px, no table wider than its box -----------------------------


def seed_console() -> dict[str, Any]:
    """Running, waiting, deferred, failed and cooling work, with a finished item whose page
    has runs with step runs, deferrals, an inbox delivery and an operator action."""
    from django.utils import timezone

    from ledger.models import WorkflowRun
    from ledger.services import run_finalize
    from routing.drains.inbox import inbox_ingest
    from routing.models import InboxEvent
    from tests.routing.helpers import route, todos_event

    ops_seed.deferred_items(4)
    ops_seed.drains(1, inbox_events=4)
    ops_seed.account_history(
        3
    )  # running steps, reserved steps, failed steps, cooldowns
    ops_seed.waiting_step("acct-01")
    inbox_ingest(enumerate([generic_event(project="/srv/broken")], start=1))
    InboxEvent.objects.filter(project_hint="/srv/broken").update(
        state="failed", last_reason="boom", routed_at=timezone.now()
    )
    result = route(
        "todos-task",
        event=todos_event(
            "T-42",
            title="Make the flaky login test deterministic",
            description="It fails one run in ten on CI.",
            project="/srv/projects/webapp",
        ),
        auth_profile_pool="acct-10,acct-11",
    )
    done = result.work_item
    assert result.kind == "created" and done is not None, result.to_dict()
    run = WorkflowRun.objects.get(pk=done.workflow_run_id)
    run.step_runs.update(
        status="succeeded",
        exit_code=0,
        duration_ms=83_400,
        stdout="ran 212 tests\nOK\n",
        started_at=timezone.now(),
    )
    WorkflowRun.objects.filter(pk=run.pk).update(status="running")
    run_finalize(run_id=run.pk, status="succeeded")
    # Registered accounts, for the Accounts admin list (its UPDATED column).
    # A long registry path and a cooldown with the raw text a real CLI printed (issue 39:
    # /ops/accounts/ was 1,603 px wide with these, its Cooldown column cut at 1400 px).
    Account.objects.create(
        name="acct-10",
        provider="codewith",
        env_json={
            "CODEWITH_HOME": "/srv/agents/the-platform-team/subscriptions/"
            "second-subscription-for-the-nightly-builds/acct-10/codewith-home"
        },
        max_running=2,
        notes="the team's second subscription",
    )
    account_cooldown_record(
        profile="acct-10",
        tool="codewith",
        until=timezone.now() + timedelta(minutes=20),
        reason="codewith rate limit on step worker of run 01a23d5f22562e1e2fb234e0139c942a: "
        + RAW_429,
        now=timezone.now(),
    )
    Account.objects.create(name="acct-11", provider="codewith", enabled=False)
    return {"done": done}


RAW_429 = (
    '{"type":"error","message":"Reconnecting... 1/1 (exceeded retry limit, last status: '
    '429 Too Many Requests)","request_id":"req_0123456789abcdef0123456789abcdef"}'
)


def _accounts_read_at_1400(driver: Any) -> None:
    """The Cooldown column ends inside the window, its reason is the provider's one line
    (the raw JSON behind "raw", closed), and the long registry path is folded."""
    from selenium.webdriver.common.by import By

    width = driver.execute_script("return document.documentElement.clientWidth")
    for cell in driver.find_elements(By.CSS_SELECTOR, "#table td.cooldown"):
        assert cell.rect["x"] + cell.rect["width"] <= width + 1, cell.rect
    row = driver.find_element(By.XPATH, "//tr[td/code[text()='acct-10']]")
    cooldown = row.find_element(By.CSS_SELECTOR, "td.cooldown").text
    assert "Reconnecting... 1/1 (exceeded retry limit" in cooldown, cooldown
    assert '{"type"' not in cooldown and "req_0123" not in cooldown, cooldown
    registry = row.find_element(By.CSS_SELECTOR, "td.registry").text
    assert "the-platform-team" not in registry and "env (1)" in registry, registry


def test_every_console_page_fits_1400_px_with_the_sidebar_collapsed(
    browser: Any, live_server: Any
) -> None:
    from selenium.webdriver.common.by import By

    get_user_model().objects.create_superuser("operator", "op@example.com", PASSWORD)
    seeded = seed_console()
    done = seeded["done"]

    sign_in(browser, live_server.url, "/ops/", "#refresh")
    # The navigation sidebar collapsed, as an operator working at 1400 px keeps it.
    browser.execute_script(
        "localStorage.setItem('django.admin.navSidebarIsOpen', 'false')"
    )

    # Overview: the live sections, then pause the auto-refresh (kept across pages).
    browser.set_window_size(1400, 1000)
    visit(browser, f"{live_server.url}/ops/", "#inbox")
    assert "Running now (" in text_of(browser, "#running")
    assert "acct-01" in text_of(browser, "#waiting")
    assert "failed" in text_of(browser, "#inbox")
    assert browser.find_element(By.CSS_SELECTOR, "svg.throughput").size["width"] > 400
    toggle = browser.find_element(By.ID, "refresh-toggle")
    assert toggle.text == "Pause"
    toggle.click()
    wait_for_mark(browser, "#refresh[data-paused='1']")
    assert toggle.text == "Resume" and text_of(browser, "#refresh-state") == "paused"
    fits(browser, "overview")
    screenshot(browser, "11-overview-1400")

    pages = [
        ("/ops/deferrals/", "12-deferrals-1400"),
        (f"/ops/items/{done.id}/", "13-item-1400"),
        ("/ops/accounts/", "14-accounts-1400"),
        ("/ops/drains/", "15-drains-1400"),
    ]
    for path, name in pages:
        browser.set_window_size(1400, 1000)
        # The page's script has run once it says whether it is paused.
        visit(browser, f"{live_server.url}{path}", "#refresh[data-paused]")
        assert (
            browser.find_element(By.ID, "refresh").get_attribute("data-paused") == "1"
        )
        fits(browser, path)
        screenshot(browser, name)
        if path == "/ops/accounts/":
            _accounts_read_at_1400(browser)
    drain = browser.find_element(By.CSS_SELECTOR, "#drains tbody a").get_attribute(
        "href"
    )
    browser.set_window_size(1400, 1000)
    visit(browser, drain, "#results")
    fits(browser, "drain")
    screenshot(browser, "16-drain-1400")

    # The admin lists: the key columns inside the window without scrolling.
    for path, columns, name in (
        ("/admin/ledger/workflowworkitem/", WORK_ITEM_COLUMNS, "17-work-items-1400"),
        ("/admin/ledger/account/", ACCOUNT_COLUMNS, "18a-accounts-admin-1400"),
        ("/admin/routing/inboxevent/", INBOX_COLUMNS, "18-inbox-1400"),
    ):
        browser.set_window_size(1400, 1000)
        visit(browser, f"{live_server.url}{path}", "#result_list")
        assert "shifted" not in (
            browser.find_element(By.ID, "main").get_attribute("class") or ""
        ), "the navigation sidebar should be collapsed"
        visible = browser.execute_script(COLUMNS_JS, list(columns))
        assert visible == {c: True for c in columns}, (path, visible)
        fits(browser, path)
        clipped = browser.execute_script(CLIPPED_JS)
        if clipped:
            screenshot(browser, "failed-clipped-" + name)
        assert clipped == [], (path, clipped)
        screenshot(browser, name)
    rows = browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    assert any("failed" in r.text for r in rows)

    # The work-item page: title, state sentence, runs with steps, actions as buttons.
    browser.set_window_size(1400, 1000)
    item_page = f"{live_server.url}/admin/ledger/workflowworkitem/{done.id}/change/"
    visit(browser, item_page, "#item-actions input[type=submit]")
    assert "Make the flaky login test deterministic" in text_of(browser, "#content h1")
    assert "succeeded: run …" in text_of(browser, ".field-state_text")
    steps = browser.find_elements(By.CSS_SELECTOR, "#item-runs tr.step-row")
    assert steps and all("83.4 s" in s.text for s in steps)
    assert any("acct-1" in s.text for s in steps)
    buttons = browser.find_elements(By.CSS_SELECTOR, "#item-actions input[type=submit]")
    assert [b.get_attribute("value") for b in buttons] == [
        "Requeue…",
        "Retry…",
        "Dead-letter…",
    ]
    fits(browser, "work item page")
    screenshot(browser, "19-work-item-1400")

    # A button opens the action's confirmation page; confirming writes the audit trail.
    follow(browser, buttons[0], "[name=reason]")
    browser.find_element(By.NAME, "reason").send_keys("flaky again")
    follow(
        browser,
        browser.find_element(By.CSS_SELECTOR, "input[type=submit]"),
        "#content",
    )
    visit(browser, item_page, "#item-history")
    history = text_of(browser, "#item-history")
    assert "operator" in history and "Requeue work items: flaky again" in history
    screenshot(browser, "20-work-item-after-requeue-1400")


# --- issue 29 item 15: first visit, the run page, the item page, the cancel box ---------------


def test_a_first_visit_fits_1400_px_and_the_run_and_item_pages_read_well(
    browser: Any, live_server: Any
) -> None:
    """No sidebar choice stored yet (a new operator): the ledger lists start with the
    navigation sidebar closed and fit, nothing clipped; the run page shows each field once
    and its duration in s/min; the item page has its runs, steps and accounts; the cancel
    box holds a placeholder, not a value."""
    from selenium.webdriver.common.by import By

    from ledger.models import WorkflowRun

    get_user_model().objects.create_superuser("operator", "op@example.com", PASSWORD)
    done = seed_console()["done"]
    sign_in(browser, live_server.url, "/admin/", "#operations-module")
    browser.execute_script("localStorage.clear()")

    for path, columns, name in (
        (
            "/admin/ledger/workflowworkitem/",
            WORK_ITEM_COLUMNS,
            "21-work-items-first-1400",
        ),
        ("/admin/ledger/account/", ACCOUNT_COLUMNS, "22-accounts-admin-first-1400"),
    ):
        browser.set_window_size(1400, 1000)
        visit(browser, f"{live_server.url}{path}", "#result_list")
        assert "shifted" not in (
            browser.find_element(By.ID, "main").get_attribute("class") or ""
        ), "a first visit at 1400 px starts with the sidebar closed"
        visible = browser.execute_script(COLUMNS_JS, list(columns))
        assert visible == {c: True for c in columns}, (path, visible)
        fits(browser, path)
        assert browser.execute_script(CLIPPED_JS) == [], path
        screenshot(browser, name)
    updated = text_of(browser, "#result_list td.field-updated_at")
    assert updated.replace("\n", " ").endswith("UTC") and updated[:4].isdigit()

    # The run page: every label once, the duration as s/min, dates as the console's.
    run = WorkflowRun.objects.get(pk=done.workflow_run_id)
    WorkflowRun.objects.filter(pk=run.pk).update(duration_ms=166_800)
    browser.set_window_size(1400, 1000)
    visit(
        browser,
        f"{live_server.url}/admin/ledger/workflowrun/{run.pk}/change/",
        "#step_runs-group",
    )
    labels = [
        label.text.strip().rstrip(":").lower()
        for label in browser.find_elements(
            By.CSS_SELECTOR,
            "fieldset .form-row label, fieldset .form-row .flex-container > label",
        )
        if label.text.strip()
    ]
    assert len(labels) == len(set(labels)), labels
    assert "duration ms" not in labels and "duration" in labels
    assert text_of(browser, ".field-duration_cell .readonly") == "2 min 47 s"
    assert text_of(browser, ".field-created_at .readonly").endswith("UTC")
    steps = browser.find_elements(By.CSS_SELECTOR, "#step_runs-group tbody tr")
    step_texts = [s.text for s in steps if s.text.strip()]
    assert step_texts and all(t.endswith("83.4 s") for t in step_texts), step_texts
    fits(browser, "run page")
    screenshot(browser, "23-run-1400")

    # The item page lives at /ops/items/<id>/ (the old address redirects).
    visit(browser, f"{live_server.url}/ops/deferrals/{done.id}/", "#accounts")
    assert browser.current_url == f"{live_server.url}/ops/items/{done.id}/"
    assert "Deferrals" not in text_of(browser, ".breadcrumbs")
    runs = text_of(browser, "#runs")
    assert "worker" in runs and "verifier" in runs and "83.4 s" in runs
    assert {"acct-10", "acct-11"} <= set(text_of(browser, "#accounts").split())
    fits(browser, "item page")
    screenshot(browser, "24-item-1400")

    # The cancel box: empty, the default reason as its placeholder.
    visit(
        browser,
        f"{live_server.url}/admin/ledger/workflowrun/",
        "#result_list input.action-select",
    )
    browser.find_element(By.CSS_SELECTOR, "#result_list input.action-select").click()
    wait_for_mark(browser, "#result_list input.action-select:checked")
    browser.find_element(
        By.CSS_SELECTOR, "select[name=action] option[value=cancel_runs]"
    ).click()
    wait_for_mark(browser, "select[name=action] option[value=cancel_runs]:checked")
    box = follow(
        browser,
        browser.find_element(By.CSS_SELECTOR, "button[name=index]"),
        "[name=reason]",
    )
    assert box.get_attribute("value") == ""
    assert box.get_attribute("placeholder")
    fits(browser, "cancel confirmation")
    screenshot(browser, "25-cancel-1400")
