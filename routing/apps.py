from __future__ import annotations

from typing import Any

from django.apps import AppConfig

# The receivers are imported when their signal is sent, not in ready(): every process runs
# ready(), and admission and the inbox drain are most of what routing loads (see
# runs/apps.py).


def _requeued(sender: Any, **kwargs: Any) -> None:
    from routing.drains.inbox import inbox_reopen_requeued

    inbox_reopen_requeued(sender, **kwargs)


class RoutingConfig(AppConfig):
    name = "routing"
    verbose_name = "Routing"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from ledger.signals import work_item_requeued

        work_item_requeued.connect(_requeued, dispatch_uid="inbox-reopen")
