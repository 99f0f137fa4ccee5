from __future__ import annotations

from typing import Any

from django.apps import AppConfig


def _worker_spawned(sender: Any, **kwargs: Any) -> None:
    # Imported when a worker spawns, not in ready(): every process runs ready(), and
    # ledger.heartbeat loads the services, which most commands never use (with routing's
    # receivers, about a quarter of what django.setup() cost, measured).
    from ledger.heartbeat import on_worker_spawn

    on_worker_spawn(sender, **kwargs)


class LedgerConfig(AppConfig):
    name = "ledger"
    verbose_name = "Ledger"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_q.signals import post_spawn

        from ledger import checks  # noqa: F401  (registers the agent sandbox's check)

        # Run-cluster workers report themselves (busy / total on /ops/).
        post_spawn.connect(_worker_spawned, dispatch_uid="loopsweb-run-worker")
        # A run cluster starts as an instance of its own: ledger's `qcluster` command.
