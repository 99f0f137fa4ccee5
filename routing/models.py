"""Routing's own records: the event inbox, drain records and API tokens."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from ledger.models import WorkflowWorkItem, id_field


class InboxState(models.TextChoices):
    PENDING = "pending"
    ADMITTED = "admitted"
    DEFERRED = "deferred"
    SKIPPED = "skipped"
    FAILED = "failed"


# Inbox rows a drain still has to route: never routed, or deferred and waiting for capacity.
OPEN_INBOX_STATES = (InboxState.PENDING, InboxState.DEFERRED)


class InboxEvent(models.Model):
    """A delivered Hasna event envelope and where routing has taken it."""

    id = id_field()
    source = models.CharField(max_length=200)
    event_id = models.CharField(max_length=500)
    event_type = models.CharField(max_length=200)
    subject = models.CharField(max_length=500, null=True, blank=True)
    event_time = models.CharField(max_length=64, null=True, blank=True)
    data = models.JSONField(default=dict)
    metadata = models.JSONField(default=dict)
    # The project the event names (raw, before normalisation): the round-robin key of fair drains.
    project_hint = models.TextField(null=True, blank=True)
    state = models.CharField(
        max_length=20, choices=InboxState.choices, default=InboxState.PENDING
    )
    work_item = models.ForeignKey(
        WorkflowWorkItem,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        db_index=False,
        related_name="inbox_events",
    )
    last_reason = models.TextField(null=True, blank=True)
    reason_code = models.CharField(max_length=40, null=True, blank=True)
    route_attempts = models.IntegerField(default=0)
    received_at = models.DateTimeField(auto_now_add=True)
    routed_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "routing_inbox_events"
        constraints = [
            # a delivery is idempotent on (source, id)
            models.UniqueConstraint(
                fields=["source", "event_id"], name="routing_inbox_source_event_key"
            ),
        ]
        indexes = [
            # the drain scan: open events oldest first (partial: only what is left to route)
            models.Index(
                fields=["received_at"],
                condition=Q(state__in=["pending", "deferred"]),
                name="idx_inbox_open_received",
            ),
            # inbox depth per state (ops overview, metrics)
            models.Index(fields=["state"], name="idx_inbox_state"),
            # events that produced a given work item
            models.Index(fields=["work_item"], name="idx_inbox_work_item"),
        ]

    def __str__(self) -> str:
        return f"{self.source}:{self.event_id} [{self.state}]"

    def envelope(self) -> dict:
        """The envelope as delivered (the Hasna event shape)."""
        envelope: dict = {
            "id": self.event_id,
            "type": self.event_type,
            "source": self.source,
        }
        if self.subject is not None:
            envelope["subject"] = self.subject
        if self.event_time is not None:
            envelope["time"] = self.event_time
        envelope["data"] = self.data
        envelope["metadata"] = self.metadata
        return envelope


class DrainRecord(models.Model):
    """One drain: its options, scope, timing, counts and compact per-item results."""

    id = id_field()
    kind = models.CharField(max_length=40)
    name = models.CharField(max_length=200, null=True, blank=True)
    route_scope = models.CharField(max_length=200, null=True, blank=True)
    source = models.CharField(max_length=40, default="inbox")
    dry_run = models.BooleanField(default=False)
    options_json = models.JSONField(default=dict)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.BigIntegerField(null=True, blank=True)
    scanned = models.IntegerField(default=0)
    candidates = models.IntegerField(default=0)
    considered = models.IntegerField(default=0)
    created = models.IntegerField(default=0)
    deduped = models.IntegerField(default=0)
    throttled = models.IntegerField(default=0)
    skipped = models.IntegerField(default=0)
    fatal = models.IntegerField(default=0)
    # Of the skipped, the PR review tasks whose PR was merged or closed (freshnessSkip,
    # routing.admission.review_gate); the report's `freshnessClosed`.
    freshness_closed = models.IntegerField(default=0, db_default=0)
    results_json = models.JSONField(default=list)
    evidence_path = models.TextField(null=True, blank=True)
    error = models.TextField(null=True, blank=True)
    # Why candidates were held without routing: the scope (or a pool every candidate
    # shares) was full, at the start (nothing scanned) or part-way through the drain.
    held_reason = models.TextField(null=True, blank=True)

    class Meta:
        db_table = "routing_drains"
        indexes = [
            # the latest drains (ops overview, drains page, API)
            models.Index(fields=["-started_at"], name="idx_drains_started"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} drain {self.started_at:%Y-%m-%dT%H:%M:%SZ}"


class ApiToken(models.Model):
    """A bearer token for the JSON API. Only its SHA-256 is stored; the token is shown once."""

    id = id_field()
    name = models.CharField(max_length=100, unique=True)
    token_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12)
    scopes = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    # None: never expires. After it the API refuses the token with a 401 that says so.
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "routing_api_tokens"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class DrainWake(models.Model):
    """The last wake-up of a drain schedule by arriving events (routing.drains.wake): when
    the drain it queued is due. One row per schedule, kept while the schedule exists."""

    schedule = models.CharField(max_length=100, primary_key=True)
    due_at = models.DateTimeField()

    class Meta:
        db_table = "routing_drain_wakes"


class GithubDelivery(models.Model):
    """A GitHub webhook delivery received (routing.github_hooks): its `X-GitHub-Delivery`
    id, so a redelivery does nothing twice, and what became of it."""

    delivery_id = models.CharField(max_length=100, primary_key=True)
    event = models.CharField(max_length=50)
    outcome = models.TextField(default="", blank=True)
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "routing_github_deliveries"
        indexes = [
            # the retention prune, oldest first
            models.Index(fields=["received_at"], name="idx_github_deliveries_seen"),
        ]

    def __str__(self) -> str:
        return f"{self.event} {self.delivery_id}"


DEFAULT_INTAKE_LABEL = "auto:route"


class GithubRepo(models.Model):
    """A GitHub repository mapped to its checkout under the project roots (`manage.py repo
    add`): its issues carrying `intake_label` come in as todos tasks (routing.github_intake)."""

    id = id_field()
    full_name = models.CharField(max_length=140, unique=True)  # OWNER/NAME
    project_path = models.TextField()
    intake_label = models.CharField(max_length=50, default=DEFAULT_INTAKE_LABEL)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "routing_github_repos"

    def __str__(self) -> str:
        return self.full_name


class GithubEtag(models.Model):
    """The ETag of the last answer `github_sync` read from a REST path, so the next read is
    conditional: a 304 (nothing changed) costs no rate limit (routing.github_sync)."""

    path = models.CharField(max_length=500, primary_key=True)
    etag = models.CharField(max_length=200)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "routing_github_etags"

    def __str__(self) -> str:
        return self.path
