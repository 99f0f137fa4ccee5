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
def test_a_nul_in_the_path_is_a_404_never_a_500(admin_client, path: str) -> None:  # type: ignore[no-untyped-def]
    if "%00" not in path:
        path += "%00"
    response = admin_client.get(path)
    assert response.status_code == 404
