from __future__ import annotations

from typing import Any

from django.apps import AppConfig


def _worker_spawned(sender: Any, **kwargs: Any) -> None:
    # Imported when a worker spawns, not in ready(): every process runs ready(), and
    # runs.heartbeat loads the services, which most commands never use (with routing's
    # receivers, about a quarter of what django.setup() cost, measured).
    from runs.heartbeat import on_worker_spawn

    on_worker_spawn(sender, **kwargs)


class RunsConfig(AppConfig):
    """Executing admitted runs on this host. No models: it writes the ledger's rows through
    ledger.services."""

    name = "runs"
    verbose_name = "Runs"

    def ready(self) -> None:
        from django_q.signals import post_spawn

        from runs import checks  # noqa: F401  (registers the agent sandbox's check)

        # Run-cluster workers report themselves (busy / total on /ops/).
        post_spawn.connect(_worker_spawned, dispatch_uid="loopsweb-run-worker")
        # A run cluster starts as an instance of its own: runs' `qcluster` command.
