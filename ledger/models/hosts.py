"""The machines that run agents: each run cluster registers its host here."""

from __future__ import annotations

from django.db import models

from ledger.models.base import TimestampedModel


class Host(TimestampedModel):
    """loopsweb (0009): a machine that runs agent runs, as its run cluster last reported it.

    Written by every worker of a run cluster with its heartbeat (ledger.capacity, every 10 s):
    the host's stable name (LOOPSWEB_HOST_NAME), the project roots it serves
    (LOOPSWEB_PROJECT_ROOTS, real paths) and the agent providers whose binary it finds. A host
    not seen for LOOPSWEB_HOST_DEAD_SECONDS is dead: its queue is emptied into the live hosts'
    (`released_at` says when) and nothing is placed on it until it reports again.
    """

    name = models.CharField(max_length=80, unique=True)
    # django-q2 queue (ORM broker key) of this host's run cluster: `loopsweb-runs@<name>`.
    queue = models.CharField(max_length=100)
    roots = models.JSONField(default=list)
    providers = models.JSONField(default=list)
    # loopsweb (0013): project path -> whether this host has it on its disk, as the host last
    # checked (a route naming it on this machine, a delivery, its heartbeat: ledger.hosts).
    # NULL: the host never said (an older loopsweb): its roots are trusted, as before.
    projects = models.JSONField(null=True, blank=True)
    workers = models.IntegerField(default=0)
    seen_at = models.DateTimeField()
    # When another host moved this host's queued runs away (it was dead); None while alive.
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "loopsweb_hosts"
        indexes = [models.Index(fields=["seen_at"], name="idx_hosts_seen")]

    def __str__(self) -> str:
        return f"host {self.name}"
