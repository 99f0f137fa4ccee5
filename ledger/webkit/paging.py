"""A paginator for querysets over big tables: its count stops at COUNT_CAP, so a list over
millions of rows (an admin changelist, an /ops/ page) costs a bounded scan."""

from __future__ import annotations

from typing import Any

from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.utils.functional import cached_property

COUNT_CAP = 10_000


class CappedCountPaginator(Paginator):
    """Counts at most COUNT_CAP rows (`SELECT COUNT(*) FROM (... LIMIT cap)`), so a changelist
    over millions of rows costs a bounded scan; beyond the cap the last page is the cap's."""

    object_list: QuerySet[Any]  # it pages querysets only (it counts in SQL)

    @cached_property
    def count(self) -> int:
        return self.object_list.order_by()[:COUNT_CAP].count()
