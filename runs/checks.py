"""System checks of the host that runs agents: `manage.py check --deploy` reports an agent
sandbox that cannot run (runs.sandbox), or one the operator turned off."""

from __future__ import annotations

from typing import Any

from django.core.checks import Error, Tags, Warning, register

from runs.sandbox import SANDBOX_OFF_WARNING, sandbox_on, sandbox_problem


@register(Tags.security, deploy=True)
def agent_sandbox_check(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    if not sandbox_on():
        return [Warning(SANDBOX_OFF_WARNING, id="loopsweb.W001")]
    problem = sandbox_problem()
    if problem is not None:
        return [Error(problem, id="loopsweb.E001")]
    return []
