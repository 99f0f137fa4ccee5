"""The machines that run agents: each run cluster registers its host here."""

from __future__ import annotations

from django.db import models

from ledger.models.base import TimestampedModel


class Host(TimestampedModel):
    """loopsweb (0009): a machine that runs agent runs, as its run cluster last reported it.

    Written by every worker of a run cluster with its heartbeat (runs.heartbeat, every 10 s):
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
    # loopsweb (0021): what cannot repeat, beside the name (ledger.instances): the machine
    # (/etc/machine-id with the node name) and boot it last reported from, and the run
    # cluster instance (random, one per cluster start) that reported last.
    machine_id = models.CharField(max_length=300, default="", db_default="", blank=True)
    boot_id = models.CharField(max_length=64, default="", db_default="", blank=True)
    instance = models.CharField(max_length=40, default="", db_default="", blank=True)

    class Meta:
        db_table = "loopsweb_hosts"
        indexes = [models.Index(fields=["seen_at"], name="idx_hosts_seen")]

    def __str__(self) -> str:
        return f"host {self.name}"


class ClusterInstance(TimestampedModel):
    """loopsweb (0021): one start of a run cluster (ledger.instances): a random id that never
    repeats, with what tells its processes apart from any other machine's or start's (the
    machine id, boot id and PID namespace, its qcluster's pid and that pid's start time).

    Workers report `seen_at` with their heartbeat; a starting cluster of the same host name
    takes over (`ended_at`) the instances it knows dead, and refuses to start beside a live
    one of another machine or other roots.
    """

    instance = models.CharField(max_length=40, unique=True)
    host = models.CharField(max_length=80)
    machine_id = models.CharField(max_length=300)
    boot_id = models.CharField(max_length=64)
    pid_namespace = models.CharField(max_length=64)
    pid = models.IntegerField()
    # The qcluster's start, clock ticks after boot (/proc/<pid>/stat field 22): a reused
    # pid is never taken for it.
    pid_started = models.BigIntegerField(null=True, blank=True)
    roots = models.JSONField(default=list)
    seen_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    # False: a process outside any run cluster that claims runs (`manage.py run_workflow`),
    # recorded only so that its steps can be signalled from its machine.
    cluster = models.BooleanField(default=True)

    class Meta:
        db_table = "loopsweb_cluster_instances"
        indexes = [
            models.Index(fields=["host", "seen_at"], name="idx_cluster_inst_host_seen")
        ]

    def __str__(self) -> str:
        return f"run cluster {self.instance} of {self.host}"
