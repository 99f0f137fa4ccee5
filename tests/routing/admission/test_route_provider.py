"""Refuse what cannot run (issue 39): a pool of registered accounts of another provider than
the route's is refused, naming both providers, with nothing written; without --provider
the route runs the provider its accounts agree on. In-process (route_event, drain_options,
`call_command("drain")`), and through a real `manage.py drain` process."""

from __future__ import annotations

import io
import os

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from domain.errors import ValidationError
from ledger import services
from ledger.models import WorkflowRun
from routing.admission import CREATED, route_options
from routing.admission.options import route_provider
from routing.drains import drain_options
from routing.drains.inbox import inbox_ingest
from routing.models import DrainRecord, InboxEvent
from tests.ledger.runner_helpers import child_database_url
from tests.processes import manage
from tests.routing.api.helpers import row_counts
from tests.routing.helpers import route, todos_event

pytestmark = pytest.mark.django_db

MISMATCH = (
    "accounts cx-a, cx-b belong to provider codex, not the route's provider codewith: "
    "give --provider codex, or accounts of codewith"
)
REGISTRY = {"cx-a": "codex", "cx-b": "codex", "cl-a": "claude"}
# The drain: codex accounts, --provider codewith.
MISMATCHED_DRAIN = (
    "drain",
    "todos-task",
    "--auth-profile-pool",
    "cx-a,cx-b",
    "--provider",
    "codewith",
)


def test_the_provider_follows_the_accounts_unless_given() -> None:
    pool = {"auth_profile_pool": "cx-a,cx-b"}
    assert route_provider(route_options(pool), REGISTRY) == "codex"
    # Unregistered names say nothing: upstream's default stays.
    assert route_provider(route_options({"auth_profile_pool": "p,q"}), REGISTRY) == (
        "codewith"
    )
    assert route_provider(route_options({"auth_profile": "cl-a"}), REGISTRY) == "claude"
    given = route_options({**pool, "provider": "codex"})
    assert route_provider(given, REGISTRY) == "codex"
    with pytest.raises(ValidationError) as refused:
        route_provider(route_options({**pool, "provider": "codewith"}), REGISTRY)
    assert str(refused.value) == MISMATCH
    with pytest.raises(ValidationError, match=r"\(cl-a: claude, cx-a: codex\)"):
        route_provider(route_options({"auth_profile_pool": "cx-a,cl-a"}), REGISTRY)
    # A pin of another provider's account is refused as well.
    with pytest.raises(
        ValidationError, match="account cl-a belongs to provider claude"
    ):
        route_provider(
            route_options({"worker_auth_profile": "cl-a", "provider": "codex"}),
            REGISTRY,
        )
    with pytest.raises(ValidationError, match="different providers"):
        route_provider(
            route_options({**pool, "verifier_auth_profile": "cl-a"}), REGISTRY
        )


def _register() -> None:
    for name in ("cx-a", "cx-b"):
        services.account_add(name=name, provider="codex")


def test_route_event_defaults_the_provider_and_refuses_a_mismatch() -> None:
    _register()
    before = row_counts()
    with pytest.raises(ValidationError, match="belong to provider codex"):
        route(auth_profile_pool="cx-a,cx-b", provider="codewith")
    assert row_counts() == before
    result = route(auth_profile_pool="cx-a,cx-b")
    assert result.kind == CREATED and result.run is not None
    steps = WorkflowRun.objects.get(pk=result.run.id).workflow.steps_json
    agents = [s["target"] for s in steps if s["target"].get("type") == "agent"]
    assert agents and {t["provider"] for t in agents} == {"codex"}
    assert {t["authProfile"] for t in agents} == {"cx-a", "cx-b"}  # the pool routed


def test_a_drain_with_a_pool_of_another_provider_is_refused_before_any_candidate() -> (
    None
):
    _register()
    inbox_ingest(enumerate([todos_event() for _ in range(2)], start=1))
    before = row_counts()
    inbox = sorted(InboxEvent.objects.values_list("id", "state", "route_attempts"))
    with pytest.raises(CommandError) as refused:
        call_command(*MISMATCHED_DRAIN, stdout=io.StringIO())
    assert str(refused.value) == MISMATCH
    assert row_counts() == before
    assert (
        sorted(InboxEvent.objects.values_list("id", "state", "route_attempts")) == inbox
    )
    assert not DrainRecord.objects.exists()
    # Without --provider: the pool's provider, recorded as the drain's.
    options = drain_options("todos-task", {"auth_profile_pool": "cx-a,cx-b"})
    assert options.route.provider == "codex"
    assert options.to_dict()["provider"] == "codex"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_drain_command_refuses_a_mismatched_pool_and_defaults_the_provider() -> (
    None
):
    """The issue's case through real `manage.py drain` processes: codex accounts with
    --provider codewith exit 1, one line, nothing written; without --provider the item is
    admitted for codex."""
    _register()
    inbox_ingest(enumerate([todos_event()], start=1))
    env = {**os.environ, "DATABASE_URL": child_database_url()}
    before = row_counts()
    refused = manage(env, *MISMATCHED_DRAIN, check=False)
    assert refused.returncode == 1, refused.stderr
    assert MISMATCH in refused.stderr and "Traceback" not in refused.stderr
    assert row_counts() == before
    done = manage(
        env, "drain", "todos-task", "--auth-profile-pool", "cx-a,cx-b", "--json"
    )
    assert '"created": 1' in done.stdout, done.stdout
    run = WorkflowRun.objects.get()
    scope = run.invocation.scope_json["providerRouting"]
    assert scope == {"provider": "codex", "pool": ["cx-a", "cx-b"], "poolRouting": True}
