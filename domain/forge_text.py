"""Untrusted text made inert for a forge (docs/delivery.md §3).

GitHub acts on text as well as rendering it: `@login` notifies, `#12`, `owner/repo#12` and
`GH-12` link and cross-reference issues, and a closing keyword before an issue (or its URL)
closes it when the commit or pull request reaches the default branch. `neutralize` puts a
zero-width joiner (U+200D) after the `@` of a mention, the `#` of an issue reference, the `GH`
of `GH-12` and the first letter of a closing keyword before an issue URL: the text reads the
same and acts on nothing. It is a function of the task's (or agent's) text alone, so what
loopsweb adds around it on purpose stays live. Pull request bodies and titles and the
subjects of step commits use it.
"""

from __future__ import annotations

import re

ZWJ = "\u200d"
_MENTION = re.compile(r"(?<!\w)@(?=[A-Za-z0-9])")
_ISSUE = re.compile(r"#(?=\d)")
_GH_ISSUE = re.compile(r"\b(GH)(?=-\d)", re.I)
_CLOSING = re.compile(
    r"\b(?=(?:close[sd]?|fix(?:e[sd])?|resolve[sd]?):?\s+https?://)(\w)", re.I
)


def neutralize(text: str) -> str:
    """`text` with its mentions, issue references and closing keywords made inert."""
    text = _MENTION.sub("@" + ZWJ, text)
    text = _ISSUE.sub("#" + ZWJ, text)
    text = _GH_ISSUE.sub(lambda m: m.group(1) + ZWJ, text)
    return _CLOSING.sub(lambda m: m.group(1) + ZWJ, text)
