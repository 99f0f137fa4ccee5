"""ensure_staff_user: the first staff user of `make run`, and --reset-password (issue 19)."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("ensure_staff_user", *args, stdout=out)
    return out.getvalue()


def test_a_lost_generated_password_is_reset_and_printed_once(monkeypatch) -> None:
    monkeypatch.delenv("LOOPSWEB_ADMIN_USER", raising=False)
    monkeypatch.delenv("LOOPSWEB_ADMIN_PASSWORD", raising=False)
    first = run().split("password ")[1].split(" ")[0]
    assert run() == "staff user exists; nothing to do\n"
    new = run("--reset-password").split(": ")[1].split(" ")[0]
    user = get_user_model().objects.get(username="admin")
    assert new != first and user.check_password(new) and not user.check_password(first)


def test_reset_takes_the_password_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("LOOPSWEB_ADMIN_USER", "ops")
    monkeypatch.setenv("LOOPSWEB_ADMIN_PASSWORD", "first-password")
    run()
    monkeypatch.setenv("LOOPSWEB_ADMIN_PASSWORD", "second-password")
    assert "set from LOOPSWEB_ADMIN_PASSWORD" in run("--reset-password")
    assert (
        get_user_model().objects.get(username="ops").check_password("second-password")
    )


def test_reset_refuses_an_unknown_user_and_changes_nothing(monkeypatch) -> None:
    monkeypatch.setenv("LOOPSWEB_ADMIN_USER", "nobody")
    with pytest.raises(CommandError, match="no staff user 'nobody'"):
        run("--reset-password")
    assert not get_user_model().objects.exists()
