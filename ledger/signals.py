"""Signals the ledger sends for the layers above it (which own the rows it must not import).

`work_item_requeued(item, now)`: sent inside the requeue transaction, after the item went back
to `queued`; the inbox (routing.drains.inbox) reopens the events that produced it.

`work_item_retried(item, now)`: sent inside an operator's retry transaction (admission lock
held), after the requeue; admission (routing.admission.retry) re-admits the item at once
with the route it stores. A receiver that raises rolls the whole retry back.
"""

from django.dispatch import Signal

work_item_requeued = Signal()
work_item_retried = Signal()
