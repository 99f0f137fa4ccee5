"""Control characters in text a producer or an operator hands us.

Contract:
1. ``control_character(text)`` is the first C0 (U+0000-U+001F), DEL or C1 (U+0080-U+009F)
   character of ``text``, or None. Ids, sources, types and option values carrying one are
   refused where they enter (an escape sequence there would drive a terminal later).
2. ``terminal_text(text)`` is ``text`` safe to print: every control character written as its
   Python escape (``\\x1b``, ``\\n``, ``\\x9b``), so a title keeps its words but cannot set the
   clipboard (OSC 52), retitle or clear the operator's terminal; a backslash stays as it is.
   ``terminal_lines(text)`` is the same but keeps newlines and tabs.
"""

from __future__ import annotations

import re

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def control_character(text: str) -> str | None:
    match = _CONTROL.search(text)
    return match.group(0) if match else None


def control_refused(what: str, text: str) -> str | None:
    """The error for `text` holding a control character (`what` names the field), or None."""
    char = control_character(text)
    if char is None:
        return None
    return f"{what} must not contain control characters (found {char!r})"


def terminal_text(text: str) -> str:
    if not _CONTROL.search(text):
        return text
    return _CONTROL.sub(lambda m: repr(m.group(0))[1:-1], text)


_CONTROL_BUT_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def terminal_lines(text: str) -> str:
    """`text` with its newlines and tabs kept and every other control character escaped
    (output made of several lines: a command's report, a step's output tail)."""
    if not _CONTROL_BUT_LINES.search(text):
        return text
    return _CONTROL_BUT_LINES.sub(lambda m: repr(m.group(0))[1:-1], text)
