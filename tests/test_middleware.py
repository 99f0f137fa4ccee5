from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "path",
    [
        "/admin/ledger/workflowworkitem/ab%00cd/change/",
        "/api/v1/work-items/ab%00cd",
        "/ops/",
    ],
)
def test_a_nul_in_the_path_is_a_404_never_a_500(admin_client, path: str) -> None:
    if "%00" not in path:
        path += "%00"
    response = admin_client.get(path)
    assert response.status_code == 404


# Issue 17 #3: a NUL in any query or form parameter is refused (400) before any view queries
# with it (PostgreSQL refuses NUL in text even in a WHERE clause: a 500 before).
NUL_QUERIES = [
    "/ops/deferrals/?project_key=%00",
    "/ops/deferrals/?reason_code=a%00",
    "/ops/deferrals/?route_scope=%00x",
    "/ops/drains/?kind=%00",
    "/ops/accounts/?account=%00",
    "/ops/?page=%00",
    "/admin/ledger/workflowworkitem/?q=%00",
    "/admin/ledger/workflowworkitem/?route_scope=%00",
    "/admin/ledger/workflowworkitem/?reason_code=%00",
    "/admin/ledger/workflowworkitem/?account_profile=%00",
    "/admin/ledger/workflowworkitem/?event_type=%00",
    "/admin/ledger/workflowrun/?provider=%00",
    "/api/v1/work-items?project=%00",
    "/api/v1/drains?route_scope=%00",
    "/admin/ledger/workflowworkitem/?a%00b=1",
]


@pytest.mark.parametrize("url", NUL_QUERIES)
def test_a_nul_in_a_query_parameter_is_a_400_never_a_500(
    admin_client, url: str
) -> None:
    response = admin_client.get(url)
    assert response.status_code == 400
    assert "NUL" in response.json()["error"]


def test_a_nul_in_a_form_field_is_a_400_and_signs_nobody_in(client, admin_user) -> None:
    response = client.post(
        "/admin/login/", {"username": "admin\x00", "password": "password"}
    )
    assert response.status_code == 400
    assert "_auth_user_id" not in client.session
