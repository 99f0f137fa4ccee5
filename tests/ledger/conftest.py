"""Fixtures shared by the ledger tests (and tests/ledger/services)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.forge_standin import Forge, start_forge
from tests.ledger.delivery_helpers import TOKEN
from tests.ledger.runner_helpers import FakeAgent, install_fake_agent


@pytest.fixture
def agent(settings: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeAgent:
    """The fake agent as every provider's binary; `agent.records()` are its invocations."""
    return install_fake_agent(settings, monkeypatch, tmp_path)


@pytest.fixture
def forge(settings: Any, tmp_path: Path) -> Iterator[Forge]:
    """The GitHub stand-in on 127.0.0.1 as the GitHub API delivery calls, with `TOKEN` in
    the token file it reads (tests/ledger/delivery_helpers.py)."""
    standin, server = start_forge()
    token_file = tmp_path / "github.env"
    token_file.write_text(f"GITHUB_TOKEN={TOKEN}\n")
    token_file.chmod(0o600)
    settings.LOOPSWEB_GITHUB_API_URL = standin.url
    settings.LOOPSWEB_GITHUB_TOKEN_FILE = str(token_file)
    settings.LOOPSWEB_BASE_URL = "https://loops.example"
    try:
        yield standin
    finally:
        server.shutdown()
        server.server_close()
