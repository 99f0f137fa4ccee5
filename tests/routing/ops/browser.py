"""The browser tests' Chromium and page helpers (tests/routing/ops/test_browser*.py): Debian's
headless Chromium driven through Selenium against pytest-django's live server.

Chromium comes from Debian (`chromium`, `chromium-driver`; `.ci/run` installs them); nothing
is downloaded at run time (Selenium Manager is kept offline and never needed: both paths are
given). Every navigation (`visit`, `follow`) and every click waits for what the page shows
next (its mark: an element, or a state), with a hang deadline (tests/waiting.py); nothing is
read from a page before its mark is there, and nothing sleeps. The fixtures that hand the
worker's one Chromium to a test are in tests/routing/ops/conftest.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.waiting import hang_deadline, wait_for

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


def start_chromium(profile: Path) -> Any:
    """Debian's Chromium through its ChromeDriver, with CHROMIUM_FLAGS and its profile in
    `profile`; the caller quits it."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SE_OFFLINE", "true")  # Selenium Manager must never download
        driver = webdriver.Chrome(
            options=options, service=Service(executable_path=CHROMEDRIVER)
        )
    driver.set_page_load_timeout(hang_deadline(120))
    return driver


class Chromium:
    """One Chromium for the browser tests of a worker process (the `browser` group keeps them
    on one): starting one is about 3 s of CPU on the 2-core machine, a page a few
    hundredths. Each test gets it as new: `reset` clears what a test leaves (cookies, every
    storage of the live server's origin, the window's size, the page) and a browser that
    cannot be reset is quit, so the next test starts another."""

    def __init__(self, profiles: pytest.TempPathFactory) -> None:
        self.profiles = profiles
        self.driver: Any = None

    def get(self) -> Any:
        if self.driver is None:
            self.driver = start_chromium(self.profiles.mktemp("chromium-profile"))
        return self.driver

    def reset(self, origin: str) -> None:
        from selenium.common.exceptions import WebDriverException

        if self.driver is None:
            return
        try:
            self.driver.get("about:blank")
            self.driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
            self.driver.execute_cdp_cmd(
                "Storage.clearDataForOrigin", {"origin": origin, "storageTypes": "all"}
            )
            self.driver.set_window_size(1400, 1000)
        except WebDriverException:
            self.quit()

    def quit(self) -> None:
        driver, self.driver = self.driver, None
        if driver is not None:
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


def _page(driver: Any) -> str:
    """Where the browser is and what it shows, for a failure message."""
    from selenium.common.exceptions import WebDriverException

    try:
        text = driver.execute_script(
            "return document.body ? document.body.innerText : '(no body)'"
        )
        return f"{driver.current_url} ({driver.title!r}): {str(text)[:1500]!r}"
    except WebDriverException as exc:
        return f"(the page cannot be read: {exc.msg})"


def wait_until_shown(driver: Any, what: str, shown: Any) -> Any:
    """Wait for `shown(driver)` to be truthy and return it; reads that fail while a page is
    loading or unloading count as not shown. The failure names `what` and the page."""
    from selenium.common.exceptions import WebDriverException

    def check() -> Any:
        try:
            return shown(driver)
        except WebDriverException:
            return False

    try:
        return wait_for(check, timeout=120, interval=0.1, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the browser is at {_page(driver)}") from None


def wait_for_mark(driver: Any, css: str) -> Any:
    """The loaded page's `css` element (document complete and the element present)."""
    from selenium.webdriver.common.by import By

    def marked(d: Any) -> Any:
        if d.execute_script("return document.readyState") != "complete":
            return False
        found = d.find_elements(By.CSS_SELECTOR, css)
        return found[0] if found else False

    return wait_until_shown(driver, f"a loaded page with {css}", marked)


def visit(driver: Any, url: str, mark: str) -> Any:
    """Open `url` and wait for its mark (a CSS selector); the marked element."""
    driver.get(url)
    return wait_for_mark(driver, mark)


def follow(driver: Any, element: Any, mark: str) -> Any:
    """Click a link or submit button, wait until the next page has loaded and shows its mark
    (a CSS selector); the marked element.

    A click returns as soon as the event is dispatched; without the wait the next read can
    still see the old page (or its URL), which made the login step flaky. The old page is
    marked with a window property and the wait is for a loaded document without it, then for
    the mark. Waiting on the old element going stale instead failed in Chrome 156, which
    answers a read of a node from an unloading page with "Node with given id does not belong
    to the document" rather than a stale-element error; reads that fail mid-navigation count
    as not loaded.
    """
    driver.execute_script("window.__loopswebOldPage = true;")
    element.click()
    wait_until_shown(
        driver,
        "the next page to load",
        lambda d: d.execute_script(
            "return window.__loopswebOldPage === undefined"
            " && document.readyState === 'complete';"
        ),
    )
    return wait_for_mark(driver, mark)


def sign_in(driver: Any, base: str, next_path: str, mark: str) -> None:
    """The admin login page, then `next_path` with its mark."""
    from selenium.webdriver.common.by import By

    visit(driver, f"{base}/admin/login/?next={next_path}", "input[name=username]")
    driver.find_element(By.NAME, "username").send_keys("operator")
    driver.find_element(By.NAME, "password").send_keys(PASSWORD)
    follow(driver, driver.find_element(By.CSS_SELECTOR, "input[type=submit]"), mark)
    assert driver.current_url == f"{base}{next_path}", _page(driver)


# A table (or a changelist's result table) that is wider than the box that holds it, or that
# reaches past the window's right edge; and whether the page itself scrolls sideways.
OVERFLOW_JS = """
const out = [];
const width = document.documentElement.clientWidth;
for (const table of document.querySelectorAll('#content table')) {
  if (!table.offsetParent) continue;  // hidden (a closed <details>)
  const box = table.parentElement;
  const r = table.getBoundingClientRect(), b = box.getBoundingClientRect();
  const id = (table.closest('[id]') || {}).id || '?';
  if (table.scrollWidth > box.clientWidth + 1 && getComputedStyle(box).overflowX !== 'visible')
    out.push(id + ': table ' + table.scrollWidth + ' px scrolls in a ' + box.clientWidth + ' px box');
  if (r.right > b.right + 1) out.push(id + ': table ends at ' + r.right + ', box at ' + b.right);
  if (r.right > width + 1) out.push(id + ': table ends at ' + r.right + ', window at ' + width);
}
if (document.documentElement.scrollWidth > width + 1)
  out.push('page scrolls sideways: ' + document.documentElement.scrollWidth + ' > ' + width);
return out;
"""

# Changelist cells whose content is cut off: wider than the cell that shows it (clipped by
# overflow or an ellipsis), or a column header whose label does not fit its column.
CLIPPED_JS = """
const out = [];
for (const cell of document.querySelectorAll('#result_list th, #result_list td')) {
  const style = getComputedStyle(cell);
  const cut = style.overflowX !== 'visible' || style.textOverflow === 'ellipsis';
  if (cut && cell.scrollWidth > cell.clientWidth + 1)
    out.push((cell.className || cell.tagName) + ': ' + cell.scrollWidth + ' > ' + cell.clientWidth);
  for (const inner of cell.querySelectorAll('*')) {
    const s = getComputedStyle(inner);
    if ((s.overflowX !== 'visible' || s.textOverflow === 'ellipsis') && inner.scrollWidth > inner.clientWidth + 1)
      out.push((cell.className || cell.tagName) + ' > ' + inner.tagName + ': ' + inner.scrollWidth + ' > ' + inner.clientWidth);
  }
}
return out;
"""

# The right edge of each named changelist column, and the window's width.
COLUMNS_JS = """
const names = arguments[0];
const width = document.documentElement.clientWidth;
const out = {};
for (const name of names) {
  const th = document.querySelector('#result_list th.column-' + name);
  out[name] = th ? th.getBoundingClientRect().right <= width : 'missing';
}
return out;
"""

WORK_ITEM_COLUMNS = (
    "short_id_cell",
    "title_cell",
    "status_cell",
    "project_cell",
    "route_scope",
    "reason_cell",
    "accounts_cell",
    "attempts",
    "age_cell",
    "duration_cell",
)
ACCOUNT_COLUMNS = ("name", "provider", "updated_at")
INBOX_COLUMNS = (
    "short_id_cell",
    "source",
    "event_cell",
    "state_cell",
    "reason_code",
    "received_cell",
    "work_item_cell",
    "last_drain_cell",
)


def fits(driver: Any, name: str) -> None:
    problems = driver.execute_script(OVERFLOW_JS)
    if problems:
        screenshot(driver, "failed-" + name.strip("/").replace("/", "-"))
    assert problems == [], f"{name}: {problems}"
