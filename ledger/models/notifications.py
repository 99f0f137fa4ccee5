"""Notifications (0028, docs/operations.md "Notifications"): one row per episode an
operator is told about, posted to LOOPSWEB_NOTIFY_URL.

`(kind, episode)` is unique: an episode (an item that needs a human, a pool exhausted since
a moment, a host gone since a moment) is told once however many steps meet it. The row is
the outbox: `pending` until delivered (`sent`), retried with backoff until `failed`, and a
failed delivery is shown on /ops/.
"""

from __future__ import annotations

from django.db import models

from ledger.models.base import id_field


class NotificationState(models.TextChoices):
    PENDING = "pending"
    SENT = "sent"
    FAILED = "failed"


class Notification(models.Model):
    id = id_field()
    kind = models.CharField(max_length=40)
    episode = models.CharField(max_length=300)
    text = models.TextField()
    payload = models.JSONField(default=dict, blank=True)
    state = models.CharField(
        max_length=20,
        choices=NotificationState.choices,
        default=NotificationState.PENDING,
    )
    attempts = models.IntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "loopsweb_notifications"
        constraints = [
            models.UniqueConstraint(
                fields=["kind", "episode"], name="loopsweb_notifications_episode_key"
            ),
        ]
        indexes = [
            models.Index(
                fields=["state", "next_attempt_at"], name="idx_notifications_due"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.episode} [{self.state}]"
