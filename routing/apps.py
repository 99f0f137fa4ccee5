from __future__ import annotations

from django.apps import AppConfig


class RoutingConfig(AppConfig):
    name = "routing"
    verbose_name = "Routing"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from ledger.signals import work_item_requeued, work_item_retried
        from routing.admission.retry import readmit_retried
        from routing.drains.inbox import inbox_reopen_requeued

        work_item_requeued.connect(inbox_reopen_requeued, dispatch_uid="inbox-reopen")
        work_item_retried.connect(readmit_retried, dispatch_uid="retry-readmit")
