from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

from loopsweb.startup import collect_after_setup

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "loopsweb.settings")
collect_after_setup()  # no garbage collection while Django loads (gunicorn's workers)
application = get_wsgi_application()
