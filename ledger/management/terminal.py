"""loopsweb's command base classes, and command output an operator's terminal can show safely.

Event text (task ids, sources, titles, loop names made from them) reaches `drain`,
`routes`, `loop` and the other commands' human output. `TerminalCommand` writes its stdout
through `domain.controls.terminal_lines`: every control character but the newline and the tab
is printed as its escape (`\\x1b]52;...`), so a producer's OSC 52, title sequence or clear
screen is shown, never obeyed, and a name cut mid-sequence cannot leave an open OSC that
swallows what follows. JSON output is escaped already (json.dumps).
"""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, OutputWrapper

from domain.controls import terminal_lines


class TerminalOutput(OutputWrapper):
    # as django-stubs' OutputWrapper.write: not TextIOBase's signature
    def write(  # type: ignore[override]
        self, msg: str = "", style_func: Any = None, ending: str | None = None
    ) -> None:
        super().write(terminal_lines(msg), style_func, ending)


class OperatorCommand(BaseCommand):
    """Every loopsweb command. Django's system checks (models, admin, URLs, templates: the
    code's configuration, not the installation's) run in `manage.py check`, migrate,
    runserver and qcluster, not again before each operator command: they were a seventh of
    its start, and they import every admin module (loopsweb/admin_site.py)."""

    requires_system_checks: list[str] = []  # noqa: RUF012  (Django's class attribute)


class TerminalCommand(OperatorCommand):
    """A command whose stdout escapes control characters (see the module docstring)."""

    def execute(self, *args: Any, **options: Any) -> Any:
        self.stdout = TerminalOutput(options.pop("stdout", None) or sys.stdout)
        return super().execute(*args, **options)
