"""Where a sandboxed step may connect (agents.egress rules, docs/isolation.md §7, "Network"):
its account's endpoints read from the account's configuration, its CLI's own login and API
hosts, and the operator's LOOPSWEB_AGENT_EGRESS_ALLOW."""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from urllib.parse import urlsplit

from django.conf import settings

from agents import egress

# Each CLI's own login and API hosts (HTTPS), reachable through the relay.
PROVIDER_HOSTS: dict[str, tuple[str, ...]] = {
    "codex": ("api.openai.com", "chatgpt.com", "auth.openai.com"),
    "codewith": ("api.openai.com", "chatgpt.com", "auth.openai.com"),
    "claude": ("api.anthropic.com", "console.anthropic.com", "claude.ai"),
    "opencode": ("api.openai.com", "api.anthropic.com", "opencode.ai"),
    "cursor": ("api2.cursor.sh", "api.cursor.com"),
    "aicopilot": (),
}
BASE_URL_VARIABLES = ("ANTHROPIC_BASE_URL", "OPENAI_BASE_URL")


def _endpoint(url: object) -> tuple[str, int] | None:
    if not isinstance(url, str) or "://" not in url:
        return None
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    return (parts.hostname, port) if parts.hostname else None


def _config_endpoints(provider: str, env: Mapping[str, str]) -> list[str]:
    """The base URLs the account's configuration names (module docstring)."""
    urls: list[object] = [env.get(name) for name in BASE_URL_VARIABLES]
    if provider in ("codex", "codewith") and env.get("CODEX_HOME"):
        try:
            with open(os.path.join(env["CODEX_HOME"], "config.toml"), "rb") as handle:
                config = tomllib.load(handle)
            providers = config.get("model_providers")
            if isinstance(providers, dict):
                urls += [
                    p.get("base_url") for p in providers.values() if isinstance(p, dict)
                ]
        except (OSError, tomllib.TOMLDecodeError):
            pass
    if provider == "opencode" and env.get("XDG_CONFIG_HOME"):
        path = os.path.join(env["XDG_CONFIG_HOME"], "opencode", "opencode.json")
        try:
            with open(path, encoding="utf-8") as handle:
                config = json.load(handle)
            providers = config.get("provider") if isinstance(config, dict) else None
            if isinstance(providers, dict):
                for entry in providers.values():
                    options = entry.get("options") if isinstance(entry, dict) else None
                    if isinstance(options, dict):
                        urls.append(options.get("baseURL"))
        except (OSError, ValueError):
            pass
    return [
        f"{host}:{port}"
        for url in urls
        if (found := _endpoint(url))
        for host, port in [found]
    ]


def egress_rules(provider: str, env: Mapping[str, str]) -> list[tuple[str, int | None]]:
    """What the step may reach: its account's endpoints, its CLI's own hosts, the operator's
    `LOOPSWEB_AGENT_EGRESS_ALLOW`."""
    texts = [
        *_config_endpoints(provider, env),
        *PROVIDER_HOSTS.get(provider, ()),
        *getattr(settings, "LOOPSWEB_AGENT_EGRESS_ALLOW", []),
    ]
    rules: list[tuple[str, int | None]] = []
    for text in texts:
        try:
            rule = egress.parse_rule(text)
        except ValueError:
            continue
        if rule not in rules:
            rules.append(rule)
    return rules
