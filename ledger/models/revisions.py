"""Revisions and verdicts (0028, docs/revisions.md): the rounds that continue an item's
branch after its verifier, a reviewer or a failing check sent the work back.

A revision is one row per request to continue an item's work. It waits (`waiting`) until its
`due_at` (the debounce: later findings of the same kind join it and move `due_at`), then is
`started` as a new run of the item on the item's stored route (its `run`, continuing the
branch of `base_run`), or `skipped` with its `reason` (the pull request moved on, the budget
is spent, the item is not delivered any more). `round` numbers the started ones of an item,
1 first; the budget (`--max-revisions`) counts them.
"""

from __future__ import annotations

from django.db import models

from ledger.models.base import id_field
from ledger.models.runs import WorkflowRun
from ledger.models.work_items import WorkflowWorkItem


class RevisionTrigger(models.TextChoices):
    VERDICT = "verdict"  # the verifier's `VERDICT: changes`
    REVIEW = "review"  # a review that requests changes, review comments
    CHECK = "check"  # a failing check run or check suite on the pull request


class RevisionState(models.TextChoices):
    WAITING = "waiting"
    STARTED = "started"
    SKIPPED = "skipped"


class WorkItemRevision(models.Model):
    id = id_field()
    work_item = models.ForeignKey(
        WorkflowWorkItem,
        on_delete=models.CASCADE,
        db_index=False,
        related_name="revisions",
    )
    trigger = models.CharField(max_length=20, choices=RevisionTrigger.choices)
    state = models.CharField(
        max_length=20, choices=RevisionState.choices, default=RevisionState.WAITING
    )
    # The started revisions of the item, numbered from 1 (None until started).
    round = models.IntegerField(null=True, blank=True)
    # What the worker is asked to address: untrusted text, bounded, shown escaped.
    findings = models.TextField(default="", blank=True)
    # Where the findings came from: review and comment ids, paths and lines, the head they
    # were made on, check names and URLs, the pull request.
    details = models.JSONField(default=dict, blank=True)
    # The run whose branch the revision continues.
    base_run = models.ForeignKey(
        WorkflowRun,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        db_index=False,
        related_name="+",
    )
    # The revision's own run, once started.
    run = models.ForeignKey(
        WorkflowRun,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        db_index=False,
        related_name="+",
    )
    due_at = models.DateTimeField()
    reason = models.TextField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "workflow_item_revisions"
        indexes = [
            # one item's rounds, oldest first (the item page, the budget count)
            models.Index(
                fields=["work_item", "created_at"], name="idx_item_revisions_item"
            ),
            # the revisions due (the task that starts them)
            models.Index(fields=["state", "due_at"], name="idx_item_revisions_due"),
            # the revision a run is (the runner: where its worktree starts, its prompt)
            models.Index(fields=["run"], name="idx_item_revisions_run"),
        ]

    def __str__(self) -> str:
        return f"{self.trigger} revision of {self.work_item_id} [{self.state}]"
