"""What production serving needs before anything starts (scripts/serve.sh, gunicorn's config).

`python -m loopsweb.production` prints each missing or wrong setting on one line and exits 2,
or exits 0 silently: a clear message instead of a traceback from the first process that reads
the settings, and before anything is migrated or started.
"""

from __future__ import annotations

import os
import sys


def problems() -> list[str]:
    """Settings production serving cannot run with (reads the settings once)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "loopsweb.settings")
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    try:
        debug = settings.DEBUG
    except ImproperlyConfigured as exc:
        return [str(exc)]
    found = []
    if debug:
        found.append(
            "DEBUG must be 0 to serve in production (scripts/serve.sh sets it)"
        )
    if not settings.ALLOWED_HOSTS:
        found.append(
            "ALLOWED_HOSTS must be set when DEBUG is off: the comma list of host names "
            "clients use (e.g. ALLOWED_HOSTS=loops.example.com)"
        )
    return found


def main() -> int:
    found = problems()
    for problem in found:
        print(f"loopsweb: {problem}", file=sys.stderr)
    return 2 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
