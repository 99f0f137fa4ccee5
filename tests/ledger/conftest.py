"""Fixtures shared by the ledger tests (and tests/ledger/services)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.ledger.runner_helpers import FakeAgent, install_fake_agent


@pytest.fixture
def agent(settings: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeAgent:
    """The fake agent as every provider's binary; `agent.records()` are its invocations."""
    return install_fake_agent(settings, monkeypatch, tmp_path)
