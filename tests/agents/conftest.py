"""Fixtures of the real-agent tests: the pinned CLIs (installed once from npm) and a provider
stand-in on 127.0.0.1 per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agents import clis
from tests.agents.clis import install_clis
from tests.agents.provider import ProviderStandIn


@pytest.fixture(scope="session")
def cli_bin() -> Path:
    return install_clis("tests/agents")


@pytest.fixture
def stand_in() -> Iterator[ProviderStandIn]:
    server = ProviderStandIn(cached_tokens=100).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def binaries(cli_bin: Path, settings: Any) -> Path:
    """The pinned CLIs as every provider's binary (LOOPSWEB_PROVIDER_BINARIES)."""
    settings.LOOPSWEB_PROVIDER_BINARIES = {
        provider: str(cli_bin / name)
        for provider, (_, _, name) in clis.CLI_PACKAGES.items()
    }
    return cli_bin
