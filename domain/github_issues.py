"""GitHub issues as todos tasks, the pure side (docs/github-intake.md).

Contract:
1. **Names.** A repository is ``OWNER/NAME`` as GitHub allows them: the owner 1-39 letters,
   digits and hyphens, neither first nor last a hyphen; the name 1-100 letters, digits,
   ``.``, ``_`` and ``-``, not ``.`` or ``..``. ``checked_repo_name`` returns it trimmed, or
   raises ``ValidationError``. GitHub compares names without case, and so does loopsweb.
2. **The intake label.** 1-50 characters once trimmed (GitHub's longest label), no control
   character, and not a tag that makes drains skip a task (domain.eligibility's disallowed
   tags): such a label would make every issue it brings in a skipped task.
3. **The payload.** ``issue_of`` reads the ``issues`` webhook's payload: ``repository.full_name``
   (a name as above), ``issue.number`` (a whole number from 1), ``issue.title`` (text),
   ``issue.body`` (text or null), ``issue.state`` (text), ``issue.labels`` (at most
   MAX_LABELS objects, each with a text ``name``), ``issue.html_url`` (an http(s) URL
   without spaces or control characters); ``issue.user.login`` and ``issue.updated_at`` are
   kept when they are what GitHub writes, and ignored otherwise. Anything else is a
   ``ValidationError`` naming the field. ``pull_request`` in the issue marks a pull request.
4. **Untrusted text, bounded.** The title is one line (whitespace runs become one space) of
   at most TITLE_CHARS, the body at most BODY_CHARS with its line ends made ``\\n``, each
   label at most LABEL_CHARS on one line; every other control character is written as its
   escape (domain.controls), so the text keeps its words and drives no terminal. Mentions
   and issue references stay as written: the task is data for the agent, and what loopsweb
   sends to GitHub neutralizes them there (docs/delivery.md §3).
5. **The envelope.** Source ``github``, type ``task.created`` (a todos task, as the drains
   take ``task.*``), id ``owner/name#N`` in lower case (one inbox row per issue, whatever
   the case a delivery spells the repository in), subject and task id ``OWNER/NAME#N`` as
   GitHub spells it; the task's title, description, tags (the labels), project path (the
   mapping's), URL, and ``route_enabled`` (the mapping and its label are the opt-in,
   whatever the label's name); ``data.github`` keeps the repository, number, author, the
   issue's ``updated_at`` and the intake label.
6. **The closing line.** ``closed_issue``: a pull request opened in ``repo`` for a task whose
   source is ``github`` and whose id is ``repo#N`` (names compared without case) closes
   issue N; any other task closes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from domain.controls import (
    control_character,
    control_refused,
    terminal_lines,
    terminal_text,
)
from domain.eligibility import DISALLOWED_TAGS
from domain.errors import ValidationError

SOURCE = "github"
TASK_EVENT_TYPE = "task.created"

TITLE_CHARS = 256  # GitHub's own limit on an issue title
BODY_CHARS = 20_000
LABEL_CHARS = 100
LABEL_MAX_CHARS = 50  # GitHub's own limit on a label's name
MAX_LABELS = 100
URL_CHARS = 2_000
MAX_NUMBER = 2**31 - 1

_OWNER = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,37}[A-Za-z0-9])?$")
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,100}$")
_TASK_ID = re.compile(r"^(?P<repo>[^/#\s]+/[^/#\s]+)#(?P<number>[1-9][0-9]{0,9})$")
_URL = re.compile(r"^https?://[^\s]+$")
_LOGIN = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})(?:\[bot\])?$")
_TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")

REPO_NAME_INVALID = (
    "{what} must be OWNER/NAME as GitHub names them (owner: letters, digits and inner "
    "hyphens, at most 39; name: letters, digits, '.', '_' and '-', at most 100): {value}"
)
LABEL_EMPTY = "the intake label must not be empty"
LABEL_TOO_LONG = "the intake label is longer than {limit} characters"
LABEL_DISALLOWED = (
    "the intake label {label!r} is a tag that makes drains skip a task "
    "(domain/eligibility.py, disallowed tags): choose another"
)
PAYLOAD_INVALID = "GitHub issues payload: {what}"


def checked_repo_name(value: object, *, what: str = "the repository") -> str:
    """``value`` as ``OWNER/NAME``, trimmed (module docstring, "names")."""
    text = value.strip() if isinstance(value, str) else ""
    owner, slash, name = text.partition("/")
    if (
        not slash
        or not _OWNER.match(owner)
        or not _NAME.match(name)
        or name in (".", "..")
    ):
        shown = repr(value)
        shown = shown if len(shown) <= 120 else shown[:119] + "…"
        raise ValidationError(REPO_NAME_INVALID.format(what=what, value=shown))
    return text


def checked_intake_label(value: object) -> str:
    """The intake label, trimmed (module docstring, "the intake label")."""
    text = value.strip() if isinstance(value, str) else ""
    if not text:
        raise ValidationError(LABEL_EMPTY)
    refused = control_refused("the intake label", text)
    if refused:
        raise ValidationError(refused)
    if len(text) > LABEL_MAX_CHARS:
        raise ValidationError(LABEL_TOO_LONG.format(limit=LABEL_MAX_CHARS))
    if text.casefold() in DISALLOWED_TAGS:
        raise ValidationError(LABEL_DISALLOWED.format(label=text))
    return text


def issue_task_id(repo: str, number: int) -> str:
    return f"{repo}#{number}"


def issue_event_id(repo: str, number: int) -> str:
    """The inbox event id of an issue: one per issue, whatever the case of the delivery."""
    return f"{repo.lower()}#{number}"


def closed_issue(task_id: object, *, source: object, repo: str | None) -> int | None:
    """The issue a pull request opened in `repo` closes (module docstring, "the closing
    line"), or None."""
    if source != SOURCE or not repo or not isinstance(task_id, str):
        return None
    match = _TASK_ID.match(task_id)
    if match is None or match["repo"].lower() != repo.strip().lower():
        return None
    return int(match["number"])


def one_line(text: str, limit: int) -> str:
    """`text` on one line (whitespace runs one space), control characters escaped, cut at
    `limit` characters with an ellipsis."""
    flat = terminal_text(" ".join(text.split()))
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def body_text(text: str) -> str:
    """A body with its line ends made ``\\n``, its other control characters escaped, cut at
    BODY_CHARS with an ellipsis."""
    kept = terminal_lines(text.replace("\r\n", "\n").replace("\r", "\n"))
    return kept if len(kept) <= BODY_CHARS else kept[: BODY_CHARS - 1] + "…"


@dataclass(frozen=True)
class Issue:
    """An issue as the payload describes it, its text bounded (module docstring)."""

    repo: str
    number: int
    title: str
    body: str
    open: bool
    labels: tuple[str, ...]  # the names as GitHub sent them (for the label's match)
    tags: tuple[str, ...]  # the same, each bounded to one line (the task's tags)
    url: str
    author: str | None
    updated_at: str | None
    pull_request: bool
    # GitHub's `author_association` of the issue's author (OWNER, MEMBER, NONE, ...).
    author_association: str = "NONE"

    @property
    def task_id(self) -> str:
        return issue_task_id(self.repo, self.number)

    @property
    def event_id(self) -> str:
        return issue_event_id(self.repo, self.number)

    def carries(self, label: str) -> bool:
        """Whether the issue carries `label` (compared without case, as GitHub does)."""
        wanted = label.strip().casefold()
        return any(name.strip().casefold() == wanted for name in self.labels)


def _invalid(what: str) -> ValidationError:
    return ValidationError(PAYLOAD_INVALID.format(what=what))


def _object(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise _invalid(f"{what} must be an object")
    return value


def _text(issue: Mapping[str, Any], key: str, *, nullable: bool = False) -> str:
    value = issue.get(key)
    if value is None and nullable:
        return ""
    if not isinstance(value, str):
        raise _invalid(f"issue.{key} must be text")
    return value


def _number(issue: Mapping[str, Any]) -> int:
    value = issue.get("number")
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid("issue.number must be a whole number")
    if not 1 <= value <= MAX_NUMBER:
        raise _invalid(f"issue.number must be from 1 to {MAX_NUMBER}")
    return value


def _labels(issue: Mapping[str, Any]) -> tuple[str, ...]:
    value = issue.get("labels")
    if not isinstance(value, list):
        raise _invalid("issue.labels must be an array")
    if len(value) > MAX_LABELS:
        raise _invalid(f"issue.labels holds more than {MAX_LABELS} labels")
    names = []
    for label in value:
        name = label.get("name") if isinstance(label, dict) else None
        if not isinstance(name, str):
            raise _invalid("each of issue.labels must be an object with a text name")
        names.append(name)
    return tuple(names)


def _url(issue: Mapping[str, Any]) -> str:
    value = _text(issue, "html_url")
    if len(value) > URL_CHARS or not _URL.match(value) or control_character(value):
        raise _invalid("issue.html_url must be an http(s) URL")
    return value


def _optional(value: object, pattern: re.Pattern[str]) -> str | None:
    return value if isinstance(value, str) and pattern.match(value) else None


def issue_of(payload: object) -> Issue:
    """The issue an ``issues`` payload describes (module docstring, "the payload");
    ValidationError naming the field when its shape is wrong."""
    body = _object(payload, "the payload")
    repository = _object(body.get("repository"), "repository")
    repo = checked_repo_name(
        repository.get("full_name"),
        what=PAYLOAD_INVALID.format(what="repository.full_name"),
    )
    issue = _object(body.get("issue"), "issue")
    number = _number(issue)
    labels = _labels(issue)
    user = issue.get("user")
    tags: list[str] = []
    for name in labels:
        tag = one_line(name, LABEL_CHARS)
        if tag and tag not in tags:
            tags.append(tag)
    return Issue(
        repo=repo,
        number=number,
        title=one_line(_text(issue, "title"), TITLE_CHARS),
        body=body_text(_text(issue, "body", nullable=True)),
        open=_text(issue, "state") == "open",
        labels=labels,
        tags=tuple(tags),
        url=_url(issue),
        author=_optional(user.get("login"), _LOGIN) if isinstance(user, dict) else None,
        updated_at=_optional(issue.get("updated_at"), _TIMESTAMP),
        pull_request="pull_request" in issue,
        author_association=_association(issue.get("author_association")),
    )


def _association(value: object) -> str:
    text = value.strip().upper() if isinstance(value, str) else ""
    return text if re.fullmatch(r"[A-Z_]{1,40}", text) else "NONE"


def applied_label(payload: object) -> str | None:
    """The label a `labeled` or `unlabeled` delivery names (`label.name`), else None."""
    label = payload.get("label") if isinstance(payload, dict) else None
    name = label.get("name") if isinstance(label, dict) else None
    return name if isinstance(name, str) else None


def issue_envelope(
    issue: Issue, *, project_path: str, intake_label: str
) -> dict[str, Any]:
    """The todos-task envelope of `issue` (module docstring, "the envelope")."""
    return {
        "id": issue.event_id,
        "type": TASK_EVENT_TYPE,
        "source": SOURCE,
        "subject": issue.task_id,
        "data": {
            "id": issue.task_id,
            "title": issue.title,
            "description": issue.body,
            "tags": list(issue.tags),
            "project_path": project_path,
            "url": issue.url,
            "route_enabled": True,
            "github": {
                "repo": issue.repo,
                "number": issue.number,
                "author": issue.author,
                "updatedAt": issue.updated_at,
                "intakeLabel": intake_label,
            },
        },
        "metadata": {"intake": "github issue"},
    }


def older_than(issue: Issue, data: object) -> str | None:
    """The ``updated_at`` an inbox row's `data` holds when `issue` is older than it (a
    delivery that arrives after a later one), else None."""
    github = data.get("github") if isinstance(data, dict) else None
    held = github.get("updatedAt") if isinstance(github, dict) else None
    if not isinstance(held, str) or not _TIMESTAMP.match(held):
        return None
    if issue.updated_at is None or issue.updated_at >= held:
        return None
    return held
