"""Issue 17 #4: the API and /metrics answer JSON for every status, 405, 404, 500 and 503
included, with a bearer token and with a staff session."""

from __future__ import annotations

import pytest
from django.db import OperationalError
from django.test import Client

from routing.api import views as api_views
from tests.routing.api.helpers import bearer, make_token

pytestmark = pytest.mark.django_db

READ_URLS = ["/api/v1/work-items", "/api/v1/accounts", "/api/v1/drains"]


@pytest.mark.parametrize("method", ["put", "patch", "delete", "post"])
@pytest.mark.parametrize("url", [*READ_URLS, "/metrics"])
def test_a_wrong_method_with_a_valid_token_is_a_json_405_not_a_csrf_page(
    method: str, url: str
) -> None:
    _, token = make_token("read", "metrics")
    client = Client(enforce_csrf_checks=True)
    response = getattr(client, method)(url, **bearer(token))
    assert response.status_code == 405
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"error": f"method {method.upper()} not allowed"}
    assert "GET" in response["Allow"]


def test_a_wrong_method_from_a_staff_session_is_a_json_405(admin_user) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    response = client.delete("/api/v1/work-items")
    assert response.status_code == 405
    assert response.json()["error"] == "method DELETE not allowed"


def test_get_on_the_ingest_endpoint_is_a_json_405() -> None:
    _, token = make_token("ingest")
    response = Client(enforce_csrf_checks=True).get("/api/v1/events", **bearer(token))
    assert response.status_code == 405
    assert response.json()["error"] == "method GET not allowed"


def test_an_unknown_api_url_is_a_json_404() -> None:
    response = Client().get("/api/v1/nothing-here")
    assert response.status_code == 404
    assert response.json() == {"error": "not found"}


def test_an_unknown_page_elsewhere_keeps_django_s_404() -> None:
    response = Client().get("/nothing-here/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")


def _raise(exc: Exception):
    def view(*args, **kwargs):
        raise exc

    return view


def test_a_crash_inside_an_api_view_is_a_json_500_without_the_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The failure is injected below the view (in a selector it calls): what is under test is
    # the answer the client gets, through the real middleware and handlers.
    monkeypatch.setattr(
        api_views, "account_rows", _raise(RuntimeError("secret detail"))
    )
    _, token = make_token("read")
    client = Client(raise_request_exception=False)
    response = client.get("/api/v1/accounts", **bearer(token))
    assert response.status_code == 500
    assert response.json() == {"error": "internal error"}
    assert b"secret detail" not in response.content


def test_a_database_error_inside_an_api_view_is_a_json_503_with_retry_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        api_views, "account_rows", _raise(OperationalError("connection refused"))
    )
    _, token = make_token("read")
    response = Client(raise_request_exception=False).get(
        "/api/v1/accounts", **bearer(token)
    )
    assert response.status_code == 503
    assert response.json()["error"].startswith("database unavailable")
    assert response["Retry-After"]


# Issue 17 #1 and #2 through the API: refused with a 400 before any write, on both databases.


def test_route_now_with_a_value_too_long_for_its_index_is_a_400_and_stores_nothing() -> (
    None
):
    from tests.routing.api.helpers import post_events, row_counts
    from tests.routing.helpers import generic_event

    _, token = make_token("ingest")
    before = row_counts()
    event = generic_event(project="/srv/" + "p" * 6000)
    response = post_events(Client(), token, event, query="route=now")
    assert response.status_code == 400
    assert "index entry holds at most 2600" in response.json()["error"]
    assert row_counts() == before


@pytest.mark.parametrize(
    "query",
    [
        "route=now&max_active=" + "9" * 5000,
        "route=now&max_per_profile=100001",
        "route=now&max_active_per_project=99999999999999999999",
    ],
)
def test_huge_numbers_in_the_query_are_a_400_naming_the_bound(query: str) -> None:
    from tests.routing.api.helpers import post_events, row_counts
    from tests.routing.helpers import generic_event

    _, token = make_token("ingest")
    before = row_counts()
    response = post_events(Client(), token, generic_event(), query=query)
    assert response.status_code == 400
    assert "must be at most 100000" in response.json()["error"]
    assert row_counts() == before


def test_a_huge_page_limit_is_a_400() -> None:
    _, token = make_token("read")
    response = Client().get(f"/api/v1/work-items?limit={'9' * 5000}", **bearer(token))
    assert response.status_code == 400


# --- issue 43 item 6: answers as production gives them --------------------------------------


@pytest.mark.parametrize("url", [*READ_URLS, "/metrics"])
def test_head_is_answered_where_get_is(url: str) -> None:
    _, token = make_token("read", "metrics")
    get = Client().get(url, **bearer(token))
    head = Client().head(url, **bearer(token))
    assert head.status_code == get.status_code == 200
    assert head["Content-Type"] == get["Content-Type"]


def test_a_url_too_long_under_the_api_is_a_json_414() -> None:
    _, token = make_token("read")
    response = Client().get("/api/v1/work-items?project=" + "p" * 9000, **bearer(token))
    assert response.status_code == 414
    assert response.json() == {"error": "request URI too long: at most 8190 characters"}


def test_a_bad_host_is_a_json_400_and_one_warning_line(caplog, settings) -> None:
    settings.ALLOWED_HOSTS = ["loopsweb.example"]
    with caplog.at_level("INFO"):
        response = Client().get("/api/v1/work-items", HTTP_HOST="scanner.invalid")
    assert response.status_code == 400
    assert response.json() == {"error": "bad request"}
    host = [r for r in caplog.records if r.name == "django.security.DisallowedHost"]
    assert [(r.levelname, r.exc_info) for r in host] == [("WARNING", None)]
    assert "scanner.invalid" in host[0].getMessage()
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
