"""The PR review gate of a todos task, the task side (docs/upstream.md §3.2.11).

Contract:
1. **Evidence text.** The gate reads the task's *evidence text*: over the records
   eligibility reads (domain.eligibility, docs/upstream.md §3.2.2, with their automation
   records), the values of the fields ``title``, ``task_title``, ``description``, ``body``,
   ``reason``, ``message``, ``fingerprint``, ``reviewDecision`` and ``mergeStateStatus``
   (field names compared without case, ``_`` or ``-``: ``review_decision`` is
   ``reviewDecision``), and the record's tags, one per line.
2. **Applies.** It applies (``required``) when that text references a pull request (a GitHub
   pull URL, a ``github-pr:OWNER/REPO#N`` handle, the words ``pull request``, or ``PR #N`` /
   ``PR N``) and shows review or merge intent: a truthy review-required field
   (REVIEW_REQUIRED_FIELDS), review-required text (``reviewDecision=REVIEW_REQUIRED``,
   ``review_required``, ``review required``, ``requires N approving review``, ``branch
   protection`` followed within 160 characters by ``approving review``),
   ``mergeStateStatus=BLOCKED`` (or ``merge state status blocked``), or one of the words
   approve, approval, merge, review. Each kind of evidence found is named in ``signals``.
3. **PR state.** The PR state the task states: the first of the fields PR_STATE_FIELDS, else
   ``pr_state`` / ``pull request state`` / ``state`` ``=`` or ``:`` ``MERGED``, ``CLOSED``
   or ``OPEN`` in the text; upper case. ``MERGED`` and ``CLOSED`` end the gate with
   FRESHNESS_SKIP (the caller may ask the forge first).
4. **Author.** The PR's author: the first of the fields AUTHOR_FIELDS, else ``author is X``
   / ``author = X`` / ``author : X`` in the text (also ``PR #N author is X``, ``github
   author is X``); a GitHub login (a leading ``@`` dropped), else nothing (the caller may
   ask the forge).
5. **Reviewers.** The reviewers: the caller's (``--github-reviewer``), then the fields
   REVIEWER_FIELDS and REVIEWER_POOL_FIELDS (text split at commas, or lists), then ``github
   reviewer pool is|=|: A, B`` and ``github reviewer(s) is|are|=|: A, B`` lines in the text;
   only GitHub logins, each once (compared without case), in that order.
6. **Decision.** ``reviewer_decision``: no author is AUTHOR_MISSING; no reviewer is
   REVIEWER_MISSING; every reviewer being the author (without case) is SELF_REVIEW; else the
   first reviewer who is not the author is selected. The reasons are upstream's words.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from domain.eligibility import automation_records, eligibility_records, is_truthy
from domain.events import record_tags

AUTHOR_MISSING = (
    "PR approval/merge route requires PR author evidence before selecting a "
    "non-author GitHub reviewer"
)
REVIEWER_MISSING = (
    "PR approval/merge route requires --github-reviewer, --github-reviewer-pool, or task "
    "metadata github_reviewer/github_reviewer_pool with a login different from the PR "
    "author"
)
SELF_REVIEW = (
    "PR approval/merge route reviewer candidates match PR author {author}; self-review "
    "is not routable"
)
FRESHNESS_SKIP = "PR is already {state}; skipping merge/review route (freshness gate)"
CLOSED_STATES = ("MERGED", "CLOSED")

EVIDENCE_FIELDS: tuple[str, ...] = (
    "title",
    "task_title",
    "description",
    "body",
    "reason",
    "message",
    "fingerprint",
    "reviewDecision",
    "mergeStateStatus",
)
AUTHOR_FIELDS: tuple[str, ...] = (
    "github_author",
    "github_pr_author",
    "pr_author",
    "pull_request_author",
    "author_login",
)
REVIEWER_FIELDS: tuple[str, ...] = (
    "github_reviewer",
    "github_review_actor",
    "github_review_login",
    "github_actor",
    "reviewer_login",
    "review_actor",
    "merge_actor",
)
REVIEWER_POOL_FIELDS: tuple[str, ...] = (
    "github_reviewer_pool",
    "github_review_pool",
    "github_reviewers",
    "reviewer_pool",
    "reviewers",
)
REVIEW_REQUIRED_FIELDS: tuple[str, ...] = (
    "github_review_required",
    "pr_review_required",
    "review_required",
    "requires_non_author_review",
    "branch_protection_review_required",
)
PR_STATE_FIELDS: tuple[str, ...] = (
    "pr_state",
    "pull_request_state",
    "state",
    "pr_status",
)

_FLAGS = re.IGNORECASE | re.ASCII
_LOGIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,38}", re.ASCII)


def _patterns(*sources: str) -> list[re.Pattern[str]]:
    return [re.compile(source, _FLAGS) for source in sources]


_REFERENCES = _patterns(
    r"github\.com/[^/\s]+/[^/\s]+/pull/\d+",
    r"\bgithub-pr:\S+#\d+",
    r"\bpull request\b",
    r"\bpr\s*#?\d+\b",
)
_REVIEW_REQUIRED_TEXT = _patterns(
    r"reviewdecision\s*[:=]\s*review_required",
    r"\breview_required\b",
    r"\breview required\b",
    r"\brequires?\s+\d+\s+approving review",
    r"\bbranch protection\b[\s\S]{0,160}\bapproving review",
)
_MERGE_BLOCKED_TEXT = _patterns(
    r"mergestatestatus\s*[:=]\s*blocked",
    r"\bmerge state status\b[\s:=]+blocked",
)
_APPROVAL_WORD = re.compile(r"\b(?:approve|approval|merge|review)\b", _FLAGS)
# A GitHub owner, then a repository name other than "." and "..": the reference becomes a
# path of the forge's API (`/repos/{owner}/{repo}/pulls/{n}`).
_SLUG = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?/(?!\.\.?(?![A-Za-z0-9_.-]))[A-Za-z0-9_.-]+"
_CONCRETE = _patterns(
    rf"github\.com/({_SLUG})/pull/(\d+)",
    rf"github-pr:({_SLUG})#(\d+)",
)
_STATE_TEXT = re.compile(
    r"\b(?:pr[_\s-]?state|pull[_\s-]?request[_\s-]?state|state)\s*[:=]\s*"
    r"(MERGED|CLOSED|OPEN)\b",
    _FLAGS,
)
_SAID = r"\s+(?:is\s+also|is|=|:)\s+@?(" + _LOGIN.pattern + ")"
_AUTHOR_TEXT = _patterns(
    r"\bauthor" + _SAID,
    r"\bPR\s*#?\d+\s+author" + _SAID,
    r"\bgithub\s+author" + _SAID,
)
_REVIEWERS_TEXT = _patterns(
    r"\bgithub\s+reviewer\s+pool\s*(?:is|=|:)\s*([^\r\n]+)",
    r"\bgithub\s+reviewers?\s*(?:are|is|=|:)\s*([^\r\n]+)",
)


def _canonical(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _texts(value: object) -> list[str]:
    """A field's value as text: strings (trimmed, not blank), numbers, booleans, lists."""
    if isinstance(value, list):
        return [text for entry in value for text in _texts(entry)]
    if isinstance(value, bool):
        return ["true" if value else "false"]
    if isinstance(value, int | float):
        return [str(int(value)) if float(value).is_integer() else str(value)]
    if isinstance(value, str) and value.strip():
        return [value.strip()]
    return []


def _values(records: Iterable[Mapping[str, Any]], name: str) -> list[str]:
    """Every value of the field `name` (canonically compared) over `records`, in order."""
    wanted = _canonical(name)
    return [
        text
        for record in records
        for key, value in record.items()
        if _canonical(str(key)) == wanted
        for text in _texts(value)
    ]


def _first_string(records: Sequence[Mapping[str, Any]], names: Sequence[str]) -> str:
    for name in names:
        wanted = _canonical(name)
        for record in records:
            for key, value in record.items():
                if (
                    _canonical(str(key)) == wanted
                    and isinstance(value, str)
                    and value.strip()
                ):
                    return value.strip()
    return ""


def github_login(value: object) -> str | None:
    """`value` as a GitHub login (trimmed, one leading `@` dropped), or None."""
    if not isinstance(value, str):
        return None
    login = value.strip()
    login = login[1:] if login.startswith("@") else login
    return login if _LOGIN.fullmatch(login) else None


def github_logins(values: Iterable[object]) -> tuple[str, ...]:
    """The logins among `values`, each once (compared without case), first kept."""
    seen: set[str] = set()
    logins: list[str] = []
    for value in values:
        login = github_login(value)
        if login is not None and login.lower() not in seen:
            seen.add(login.lower())
            logins.append(login)
    return tuple(logins)


def _split(values: Iterable[str]) -> list[str]:
    return [part.strip() for value in values for part in value.split(",")]


@dataclass(frozen=True)
class ReviewEvidence:
    """What the task says for the gate (module docstring)."""

    required: bool
    signals: tuple[str, ...]
    reference: str | None  # `owner/repo#n` from a pull URL or github-pr handle
    stated_state: str | None
    author: str | None
    reviewers: tuple[str, ...]  # the task's own (fields, then text)


def gate_records(
    data: Mapping[str, Any], metadata: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The records the gate reads (module docstring, "evidence text")."""
    records = eligibility_records(data, metadata)
    extra = [a for a in automation_records(records) if all(a is not r for r in records)]
    return records + extra


def evidence_text(records: Sequence[Mapping[str, Any]]) -> str:
    """The task's evidence text (module docstring, "evidence text")."""
    lines: list[str] = []
    for record in records:
        for name in EVIDENCE_FIELDS:
            lines += _values([record], name)
        lines += record_tags(dict(record))
    return "\n".join(lines)


def concrete_reference(text: str) -> str | None:
    """`owner/repo#n` of the first pull URL, else the first github-pr handle, in `text`
    (lower case, the number without leading zeros)."""
    for pattern in _CONCRETE:
        found = pattern.search(text)
        if found:
            return f"{found.group(1)}#{int(found.group(2))}".lower()
    return None


def _signals(records: Sequence[Mapping[str, Any]], text: str) -> tuple[bool, list[str]]:
    """Whether the gate applies, and the evidence it found (module docstring, "applies")."""
    reference = any(p.search(text) for p in _REFERENCES)
    found = {
        "review-required-field": any(
            is_truthy(value)
            for name in REVIEW_REQUIRED_FIELDS
            for record in records
            for key, value in record.items()
            if _canonical(str(key)) == _canonical(name)
        ),
        "review-required-text": any(p.search(text) for p in _REVIEW_REQUIRED_TEXT),
        "merge-blocked-text": any(p.search(text) for p in _MERGE_BLOCKED_TEXT),
        "pr-approval-intent": bool(_APPROVAL_WORD.search(text)),
    }
    signals = [name for name, seen in found.items() if seen]
    if not reference and "pr-approval-intent" in signals:
        signals.remove("pr-approval-intent")
    return reference and any(found.values()), signals


def stated_state(records: Sequence[Mapping[str, Any]], text: str) -> str | None:
    """The PR state the task states, upper case (module docstring, "PR state"), or None."""
    field = _first_string(records, PR_STATE_FIELDS)
    if field:
        return field.upper()
    found = _STATE_TEXT.search(text)
    return found.group(1).upper() if found else None


def stated_author(records: Sequence[Mapping[str, Any]], text: str) -> str | None:
    """The PR's author as the task names it (module docstring, "author"), or None."""
    author = github_login(_first_string(records, AUTHOR_FIELDS))
    if author is not None:
        return author
    for pattern in _AUTHOR_TEXT:
        found = pattern.search(text)
        if found and github_login(found.group(1)):
            return github_login(found.group(1))
    return None


def stated_reviewers(
    records: Sequence[Mapping[str, Any]], text: str
) -> tuple[str, ...]:
    """The reviewers the task names (module docstring, "reviewers", without the caller's)."""
    fields = [
        value
        for name in (*REVIEWER_FIELDS, *REVIEWER_POOL_FIELDS)
        for value in _values(records, name)
    ]
    lines = [m.group(1) for p in _REVIEWERS_TEXT for m in p.finditer(text)]
    return github_logins(_split(fields) + _split(lines))


def review_evidence(
    data: Mapping[str, Any], metadata: Mapping[str, Any]
) -> ReviewEvidence:
    """The task's evidence for the gate (module docstring, "evidence text" to "reviewers")."""
    records = gate_records(data, metadata)
    text = evidence_text(records)
    required, signals = _signals(records, text)
    if not required:
        return ReviewEvidence(False, tuple(signals), None, None, None, ())
    return ReviewEvidence(
        required=True,
        signals=tuple(signals),
        reference=concrete_reference(text),
        stated_state=stated_state(records, text),
        author=stated_author(records, text),
        reviewers=stated_reviewers(records, text),
    )


@dataclass(frozen=True)
class ReviewerDecision:
    allowed: bool
    reviewers: tuple[str, ...]
    reason: str | None = None
    selected: str | None = None


def reviewer_decision(
    author: str | None, options: Sequence[str], stated: Sequence[str]
) -> ReviewerDecision:
    """The decision (module docstring, "decision") over the caller's reviewers (`options`)
    and the task's (`stated`)."""
    reviewers = github_logins([*options, *stated])
    if author is None:
        return ReviewerDecision(False, reviewers, AUTHOR_MISSING)
    if not reviewers:
        return ReviewerDecision(False, reviewers, REVIEWER_MISSING)
    for reviewer in reviewers:
        if reviewer.lower() != author.lower():
            return ReviewerDecision(True, reviewers, selected=reviewer)
    return ReviewerDecision(False, reviewers, SELF_REVIEW.format(author=author))
