"""The browser tests' fixtures: the worker's one Chromium (tests/routing/ops/browser.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.routing.ops.browser import CHROMEDRIVER, CHROMIUM, Chromium


@pytest.fixture(scope="session")
def _chromium(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Chromium:
    chromium = Chromium(tmp_path_factory)
    # Quit as pytest ends, not as a session fixture's teardown: that runs in the teardown of
    # whichever test the worker ran last, and the stop's short waits would be that test's
    # (the suite's `slow` check, tests/conftest.py).
    request.config.add_cleanup(chromium.quit)
    return chromium


@pytest.fixture
def browser(_chromium: Chromium, live_server: Any) -> Iterator[Any]:
    """The worker's Chromium, as new (see `Chromium`), for a test against `live_server`."""
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
    try:
        yield _chromium.get()
    finally:
        _chromium.reset(live_server.url)
