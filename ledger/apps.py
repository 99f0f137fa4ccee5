from __future__ import annotations

from django.apps import AppConfig


class LedgerConfig(AppConfig):
    name = "ledger"
    verbose_name = "Ledger"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_q.signals import post_spawn

        from ledger.cluster_start import install
        from ledger.heartbeat import on_worker_spawn

        # Run-cluster workers report themselves (busy / total on /ops/).
        post_spawn.connect(on_worker_spawn, dispatch_uid="loopsweb-run-worker")
        # A run cluster starts as an instance of its own (ledger.cluster_start).
        install()
