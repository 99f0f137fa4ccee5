"""Admin of the account registry: configuration, so operators add, edit and remove rows
here (the same checks as `manage.py account`: no secret-looking variables)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin

from agents.providers import PROVIDERS
from ledger import services
from ledger.models import Account
from ledger.services.accounts import AccountError, account_check
from ledger.webkit.audit import log_operator_action


class AccountForm(forms.ModelForm):
    provider = forms.ChoiceField(choices=[(p, p) for p in PROVIDERS])

    class Meta:
        model = Account
        fields = (
            "name",
            "provider",
            "enabled",
            "max_running",
            "env_json",
            "env_file",
            "notes",
        )
        labels = {
            "env_json": "Environment",
            "env_file": "Env file",
            "max_running": "Max running steps",
        }
        help_texts = {
            "env_json": 'Variables that select the login, e.g. {"CODEX_HOME": '
            '"/srv/agents/acctA/codex"}. Never a secret.',
            "max_running": "Tightens the route's --max-per-profile for this account.",
            "env_file": "API-key login: the absolute path of a 0600 file of NAME=value "
            "lines, read when a step starts. Only the path is stored.",
        }

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data  # what ModelForm.clean returns (the stubs: maybe None)
        env = data.get("env_json")
        if env is not None and not isinstance(env, dict):
            self.add_error("env_json", "a JSON object of variable names to strings")
            return data
        name = data.get("name") or (self.instance.name if self.instance.pk else "")
        try:
            data["env_json"] = account_check(
                name=str(name).strip(),
                provider=str(data.get("provider") or ""),
                env=env or {},
                max_running=data.get("max_running"),
                env_file=data.get("env_file") or None,
            )
        except AccountError as exc:
            raise forms.ValidationError(str(exc)) from None
        data["env_file"] = data.get("env_file") or None
        return data


@admin.register(Account)
class AccountAdmin(admin.ModelAdmin):
    form = AccountForm
    list_display = (
        "name",
        "provider",
        "enabled",
        "max_running",
        "env_keys",
        "login_failed_at",
        "updated_at",
    )
    list_filter = ("provider", "enabled")
    search_fields = ("name", "notes")
    ordering = ("name",)
    actions = ("disable_accounts", "enable_accounts", "clear_accounts")

    def get_readonly_fields(self, request: Any, obj: Account | None = None) -> Any:
        # The name is what step runs record: renaming would orphan their history.
        # The login mark is the runner's and `account check`'s to set (enable clears it).
        failed = ("login_failed_at", "login_failed_reason")
        return ("name", *failed, "created_at", "updated_at") if obj else ()

    @admin.display(description="environment")
    def env_keys(self, obj: Account) -> str:
        return ", ".join(f"{k}={v}" for k, v in sorted((obj.env_json or {}).items()))

    @admin.action(description="Disable selected accounts (never assigned)")
    def disable_accounts(self, request: Any, queryset: Any) -> None:
        n = self._set_enabled(queryset, enabled=False)
        self.message_user(request, f"{n} account(s) disabled")

    @admin.action(
        description="Clear selected accounts' cooldown, exhausted windows and login mark"
    )
    def clear_accounts(self, request: Any, queryset: Any) -> None:
        # As `account clear NAME`: what steps' output claimed about the account goes.
        for row in queryset:
            done = services.account_clear(name=row.name)
            if done.anything:
                log_operator_action(
                    request, Account, row.name, "Clear the account", done.text()
                )
            self.message_user(request, f"{row.name}: cleared {done.text()}")

    @admin.action(description="Enable selected accounts (clears a failed login)")
    def enable_accounts(self, request: Any, queryset: Any) -> None:
        # As `account enable`: an enabled account whose login failed is enabled anew.
        n = self._set_enabled(queryset, enabled=True)
        self.message_user(request, f"{n} account(s) enabled")

    @staticmethod
    def _set_enabled(queryset: Any, *, enabled: bool) -> int:
        """`services.account_set_enabled` on each selected account; how many changed."""
        return sum(
            services.account_set_enabled(name=name, enabled=enabled)[1]
            for name in queryset.values_list("name", flat=True)
        )
