"""The worker processes of the run clusters, as they report themselves."""

from __future__ import annotations

from django.db import models

from ledger.models.base import TimestampedModel


class RunWorker(TimestampedModel):
    """loopsweb (0006): a worker process of a run cluster, as it last reported itself.

    Each worker of a run cluster writes its row every few seconds
    (ledger.services.run_workers); a row not
    seen for a while is a worker that is gone. Busy workers are read from the runs they hold
    (`workflow_runs.claimed_by` = `<host>:<pid>`), so this table only says what exists.
    """

    cluster = models.CharField(max_length=100)
    host = models.CharField(max_length=255)
    pid = models.IntegerField()
    # The worker's qcluster (its sentinel's pid): two clusters on one host stay apart.
    cluster_pid = models.IntegerField()
    # loopsweb (0021): the run cluster instance it belongs to (ledger.instances); its claims
    # are `<host>:<pid>@<instance>`. Empty: a worker of an older loopsweb.
    instance = models.CharField(max_length=40, default="", db_default="", blank=True)
    seen_at = models.DateTimeField()

    class Meta:
        db_table = "loopsweb_run_workers"
        constraints = [
            # a worker upserts its own row; a pid reused on the host takes the old row over
            models.UniqueConstraint(
                fields=["host", "pid"], name="uniq_run_workers_host_pid"
            ),
        ]
        indexes = [
            # live workers (ops capacity) and pruning of the gone
            models.Index(fields=["seen_at"], name="idx_run_workers_seen"),
        ]

    def __str__(self) -> str:
        return f"{self.cluster} worker {self.host}:{self.pid}"
