"""Untrusted JSON: parsed within limits, into values every supported database can store.

Contract:
1. ``json_depth_exceeds(text, max_depth)`` measures bracket nesting on the text itself, in
   one linear pass that stops at the first bracket past the limit. A deeply nested body is
   refused before ``json.loads`` (recursive in C) ever sees it, so no RecursionError and no
   quadratic work, however deep the input.
2. ``loads_limited`` parses UTF-8 text or bytes: nesting within ``max_depth`` (a top-level
   array may add one level when ``array_wrapper`` is set, so a batch holds envelopes as deep
   as a single delivery), no NaN/Infinity, and only storable strings
   (``unstorable_reason``). Every failure is a ``ValidationError``.
3. ``unstorable_reason(value)`` walks a value iteratively and names the first thing
   PostgreSQL or SQLite cannot store faithfully: NUL characters (text and jsonb refuse
   them), lone surrogates (not encodable as UTF-8), and non-finite floats (not JSON).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from domain.errors import ValidationError

DEFAULT_MAX_DEPTH = 32

JSON_NOT_UTF8 = "JSON text is not valid UTF-8"
JSON_TOO_DEEP = "JSON is nested deeper than {limit} levels"
JSON_INVALID = "invalid JSON: {error}"
JSON_NON_FINITE = "JSON numbers must be finite (NaN and Infinity are not JSON)"
JSON_UNSTORABLE_STRING = (
    "JSON strings must not contain NUL characters or unpaired surrogates"
)

# Characters that matter to nesting: brackets, and the quote and backslash that decide
# whether a bracket sits inside a string.
_SIGNIFICANT = re.compile(r'[\[\]{}"\\]')
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_OPENERS = frozenset("[{")


def json_depth_exceeds(text: str, max_depth: int) -> bool:
    """True when brackets outside strings nest deeper than ``max_depth``.

    Malformed text is measured as best it can be; json.loads rejects it afterwards anyway.
    """
    depth = 0
    in_string = False
    escaped_at = -1  # index of the character a backslash escapes inside a string
    for match in _SIGNIFICANT.finditer(text):
        char, at = match.group(), match.start()
        if in_string:
            if at == escaped_at:
                continue
            if char == "\\":
                escaped_at = at + 1
            elif char == '"':
                in_string = False
            continue
        if char == '"':
            in_string = True
        elif char in _OPENERS:
            depth += 1
            if depth > max_depth:
                return True
        elif char != "\\":
            depth -= 1
    return False


class JsonSyntaxError(ValidationError):
    """The text is not JSON at all; ``error`` is the decoder's own message."""

    def __init__(self, error: str) -> None:
        super().__init__(JSON_INVALID.format(error=error))
        self.error = error


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # "1e400" parses to inf
        raise ValidationError(JSON_NON_FINITE)
    return value


def _no_constants(name: str) -> Any:
    raise ValidationError(JSON_NON_FINITE)


def loads_limited(
    raw: str | bytes, *, max_depth: int, array_wrapper: bool = False
) -> Any:
    """Parse untrusted JSON (see the module contract); raises ValidationError."""
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ValidationError(JSON_NOT_UTF8) from None
    else:
        text = raw
    limit = max_depth + 1 if array_wrapper and text.lstrip()[:1] == "[" else max_depth
    if json_depth_exceeds(text, limit):
        raise ValidationError(JSON_TOO_DEEP.format(limit=max_depth))
    try:
        value = json.loads(
            text, parse_float=_finite_float, parse_constant=_no_constants
        )
    except RecursionError:  # cannot happen after the depth check; kept as a backstop
        raise ValidationError(JSON_TOO_DEEP.format(limit=max_depth)) from None
    except (
        ValueError
    ) as exc:  # JSONDecodeError, and int strings past Python's digit limit
        raise JsonSyntaxError(str(exc)) from None
    reason = unstorable_reason(value)
    if reason:
        raise ValidationError(reason)
    return value


def unstorable_reason(value: object) -> str | None:
    """Why ``value`` cannot be stored as JSON in every supported database, or None."""
    stack: list[object] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _UNSTORABLE.search(item):
                return JSON_UNSTORABLE_STRING
        elif isinstance(item, float):
            if not math.isfinite(item):
                return JSON_NON_FINITE
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return None
