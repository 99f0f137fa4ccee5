"""Signals the ledger sends for the layers above it (which own the rows it must not import).

`work_item_requeued(item, now)`: sent inside the requeue transaction, after the item went back
to `queued`; the inbox (routing.drains.inbox) reopens the events that produced it. An
operator's retry is admission's own operation (routing.admission.retry) and sends nothing.
"""

from django.dispatch import Signal

work_item_requeued = Signal()
