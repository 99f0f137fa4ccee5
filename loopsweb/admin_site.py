"""django.contrib.admin, its ModelAdmins loaded with the pages rather than at start-up.

Django's AdminConfig imports every app's `admin` module in `ready()`, so each `manage.py`
command paid for the admin (about 60 ms of a 380 ms start, measured) though only a web
process shows it. Here the URLconf discovers them
(loopsweb/urls.py) and so does the admin's system check, before it checks them: `manage.py
check`, runserver and migrate check every ModelAdmin as before.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.apps import SimpleAdminConfig


class AdminSite(admin.AdminSite):
    def check(self, app_configs: Any) -> list[Any]:
        admin.autodiscover()
        return super().check(app_configs)


class AdminConfig(SimpleAdminConfig):
    default_site = "loopsweb.admin_site.AdminSite"
