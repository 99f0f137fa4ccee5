"""Agent accounts: the registry (`Account`), cooldowns after rate limits, and the load kept
per account."""

from __future__ import annotations

from django.db import models

from ledger.models.base import TimestampedModel
from ledger.models.runs import WorkflowStepRun


class Account(TimestampedModel):
    """loopsweb (0004): a registered agent account: which provider, whether it may be
    assigned, an optional running cap, and the environment that selects its login.

    The environment says WHERE the provider CLI keeps this account's login (for example
    `CODEX_HOME=/srv/agents/acctA/codex`), never a secret: keys that look like secrets are
    refused by `account_add`. The name is the `account_profile` step runs record.
    """

    name = models.CharField(max_length=200, primary_key=True)
    provider = models.CharField(max_length=20)
    enabled = models.BooleanField(default=True)
    # Tightens the route's --max-per-profile for this account (None: the route's cap only).
    max_running = models.PositiveIntegerField(null=True, blank=True)
    env_json = models.JSONField(default=dict, blank=True)
    # 0009: the path of a 0600 file of NAME=value lines (an API-key login), read when a
    # step starts (agents.envfile); the value never reaches the database.
    env_file = models.CharField(max_length=1000, null=True, blank=True)
    notes = models.TextField(blank=True, default="")
    # 0014: set when a step on the account failed with an authentication error (a 401,
    # "Not logged in", "Invalid API key"): when, and the agent's words. Pool assignment and
    # failover skip it; `account check` (a login that works) and `account enable` clear it.
    login_failed_at = models.DateTimeField(null=True, blank=True)
    login_failed_reason = models.TextField(null=True, blank=True)
    # 0021: the operator's token budget per window (`{"5h": 2000000, "7d": 9000000}`): the
    # estimate of a window no provider reports on (ledger.windows).
    window_budgets = models.JSONField(null=True, blank=True)
    # 0021: pace the account's windows (domain/windows.py, "pacing"): it may use a window
    # only as far as the window has elapsed (None/False: no pacing).
    window_pace = models.BooleanField(null=True, blank=True)
    # 0026: set when a step on the account made no progress for its idle limit (a hang):
    # until when the account cools off (LOOPSWEB_UNRESPONSIVE_SECONDS), and the step's words.
    # Pool assignment, step starts and failover skip it until then; `account clear` and a
    # passing `account check` clear it.
    unresponsive_until = models.DateTimeField(null=True, blank=True)
    unresponsive_reason = models.TextField(null=True, blank=True)

    class Meta:
        db_table = "accounts"

    def __str__(self) -> str:
        state = "" if self.enabled else " (disabled)"
        if self.login_failed_at is not None:
            state += " (login failed)"
        return f"{self.name} [{self.provider}]{state}"


class AccountCooldown(TimestampedModel):
    """loopsweb (0003): an account that reported a provider rate limit, cooling until `until`.

    One row per account profile; a new report keeps the later of the two deadlines.
    """

    account_profile = models.CharField(max_length=200, primary_key=True)
    account_tool = models.CharField(max_length=100, null=True, blank=True)
    until = models.DateTimeField()
    reason = models.TextField(null=True, blank=True)
    reports = models.IntegerField(default=1)
    step_run = models.ForeignKey(
        WorkflowStepRun,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        db_index=False,
        db_constraint=False,
        related_name="+",
    )

    class Meta:
        db_table = "account_cooldowns"
        indexes = [
            # cooling accounts now: pool assignment and the step-start re-check
            models.Index(fields=["until"], name="idx_account_cooldowns_until"),
        ]

    def __str__(self) -> str:
        return f"{self.account_profile} until {self.until:%Y-%m-%dT%H:%M:%SZ}"


class AccountLoadCount(models.Model):
    """loopsweb (0004): the load of one account, kept in the transactions that change it.

    `running` = its step runs in `running`; `reserved` = admitted runs (queued, or running
    with no step started yet) whose first account-carrying step is on it (see
    `ledger.selectors.account_state`). Every service that moves a run or step run applies
    the change here in the same transaction (`ledger.services.account_loads`), so admission
    reads the pool's
    load in one row per account, however many runs are queued. `recount_account_loads`
    recomputes both from the rows and repairs any drift.
    """

    account_profile = models.CharField(max_length=200, primary_key=True)
    running = models.IntegerField(default=0)
    reserved = models.IntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "workflow_account_loads"

    def __str__(self) -> str:
        return (
            f"{self.account_profile}: {self.running} running, {self.reserved} reserved"
        )
