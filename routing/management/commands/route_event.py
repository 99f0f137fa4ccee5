"""Route one event envelope through admission (upstream `loops routes create <kind>`).

Reads the envelope from --event-file (or - for stdin), --event-json, $HASNA_EVENT_JSON or
stdin. Exit 0 for created, deduped, throttled and skipped; non-zero with a one-line error on
bad input, which writes nothing.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from domain.errors import ROUTE_KIND_INVALID, ApplicationError
from ledger.management.terminal import TerminalCommand
from routing.admission import route_event
from routing.management.arguments import (
    KINDS,
    add_route_arguments,
    options_from_argparse,
    read_event_text,
)


class Command(TerminalCommand):
    help = "Route one event envelope: create, dedupe, throttle or skip its work item."
    stealth_options = ("stdin",)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("kind", help=f"route kind: {' or '.join(KINDS)}")
        parser.add_argument(
            "--event-file", help="JSON file with the envelope, or - for stdin"
        )
        parser.add_argument("--event-json", help="the envelope as a JSON string")
        add_route_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        if options["kind"] not in KINDS:
            raise CommandError(ROUTE_KIND_INVALID)
        route_options = options_from_argparse(options["kind"], options)
        text = read_event_text(
            event_file=options["event_file"],
            event_json=options["event_json"],
            stdin=options.get("stdin"),
        )
        try:
            result = route_event(
                kind=options["kind"], envelope=text, options=route_options
            )
        except ApplicationError as exc:
            raise CommandError(str(exc)) from None
        if options["json"]:
            self.stdout.write(json.dumps(result.to_dict(), sort_keys=True))
        else:
            self.stdout.write(result.human())
