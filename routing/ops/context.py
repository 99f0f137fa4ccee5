"""The line every operator page shows while agents cannot run sandboxed on this host, or run
unsandboxed because the operator said so (runs.sandbox.sandbox_warning)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from runs.sandbox import sandbox_warning


def agent_sandbox(request: HttpRequest) -> dict[str, Any]:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {"agent_sandbox_warning": sandbox_warning()}
