"""What every ledger table shares: the 32-character id and the created/updated timestamps."""

from __future__ import annotations

from django.db import models

from ledger.ids import new_id


def id_field() -> models.CharField:
    return models.CharField(
        primary_key=True, max_length=32, default=new_id, editable=False
    )


class TimestampedModel(models.Model):
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True
