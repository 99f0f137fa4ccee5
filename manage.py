#!/usr/bin/env python
"""Django's command-line utility for loopsweb."""

from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "loopsweb.settings")
    from loopsweb.startup import collect_after_setup

    collect_after_setup()  # no garbage collection while Django loads
    # Every command, runserver included: a damaged SQLite file is one line, not a traceback.
    from loopsweb.dbhealth import run_command

    run_command(sys.argv)


if __name__ == "__main__":
    main()
