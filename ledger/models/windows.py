"""Rate-limit window observations per account (0021, docs/windows.md).

Each row is one observation of one window of one account: what the agent CLI reported (codex's
rollout, claude's `rate_limit_event`, opencode's error headers) or what the runner saw (a 429).
The latest row per (account, window) is what counts; `ledger.windows` prunes the older ones.
"""

from __future__ import annotations

from django.db import models

from ledger.models.base import id_field


class AccountWindow(models.Model):
    id = id_field()
    account_profile = models.CharField(max_length=200)
    provider = models.CharField(max_length=20, blank=True, default="")
    # `5h`, `7d`, or the provider's own name for the window.
    window = models.CharField(max_length=60)
    # Fraction used, 0..1 (None: the provider did not say).
    used = models.FloatField(null=True, blank=True)
    # allowed | allowed_warning | rejected (None: not said).
    status = models.CharField(max_length=30, null=True, blank=True)
    resets_at = models.DateTimeField(null=True, blank=True)
    observed_at = models.DateTimeField()
    # Where it came from: `codex rollout`, `claude rate_limit_event`, `opencode error`, `429`.
    source = models.CharField(max_length=200, blank=True, default="")
    step_run_id = models.CharField(max_length=32, null=True, blank=True)

    class Meta:
        db_table = "account_windows"
        indexes = [
            models.Index(
                fields=["account_profile", "window", "observed_at"],
                name="idx_account_windows_latest",
            ),
            models.Index(fields=["observed_at"], name="idx_account_windows_seen"),
        ]

    def __str__(self) -> str:
        return f"{self.account_profile} {self.window} ({self.source})"
