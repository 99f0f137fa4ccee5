"""Delivery of a run's work (docs/delivery.md): the route options' values and the commit
identity, parsed here so every entry point (argv, schedules, the API, settings) refuses bad
input with the same message."""

from __future__ import annotations

import re

from domain.errors import ValidationError

DELIVER_NONE = "none"
DELIVER_BRANCH = "branch"
DELIVER_PUSH = "push"
DELIVER_PULL_REQUEST = "pull-request"
DELIVER_MODES = (DELIVER_NONE, DELIVER_BRANCH, DELIVER_PUSH, DELIVER_PULL_REQUEST)
DEFAULT_DELIVER = DELIVER_BRANCH
DEFAULT_REMOTE = "origin"

DELIVER_INVALID = "--deliver must be one of " + ", ".join(DELIVER_MODES)
REMOTE_INVALID = (
    "--deliver-remote must be a git remote name (letters, digits, '.', '_', '-'; "
    "not starting with '-')"
)
GITHUB_REPO_INVALID = "--github-repo must be OWNER/NAME"
GITHUB_REVIEWER_INVALID = (
    "--github-reviewer must be GitHub logins separated by commas (each 1-39 letters, "
    "digits and single hyphens, not starting or ending with one): {login!r} is not one"
)
GITHUB_REVIEWER_TYPE = "--github-reviewer must be a string (LOGIN[,LOGIN])"
GIT_AUTHOR_INVALID = "LOOPSWEB_GIT_AUTHOR must be 'Name <email>', got {value!r}"

_REMOTE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,99}$")
_REPO_PART = r"[A-Za-z0-9_.-]{1,100}"
_REPO_RE = re.compile(rf"^({_REPO_PART})/({_REPO_PART})$")
_LOGIN_RE = re.compile(r"^[A-Za-z0-9](?:-?[A-Za-z0-9]){0,38}$")
_AUTHOR_RE = re.compile(r"^([^<>\x00-\x1f\x7f]+?) *<([^<>\s\x00-\x1f\x7f]+)>$")


def parse_deliver(value: object) -> str:
    if value is None or value == "":
        return DEFAULT_DELIVER
    if not isinstance(value, str) or value.strip() not in DELIVER_MODES:
        raise ValidationError(DELIVER_INVALID)
    return value.strip()


def parse_remote(value: object) -> str:
    if value is None or value == "":
        return DEFAULT_REMOTE
    if not isinstance(value, str) or not _REMOTE_RE.match(value.strip()):
        raise ValidationError(REMOTE_INVALID)
    name = value.strip()
    if name.endswith((".", ".lock")) or ".." in name:
        raise ValidationError(REMOTE_INVALID)
    return name


def parse_github_repo(value: object) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValidationError(GITHUB_REPO_INVALID)
    match = _REPO_RE.match(value.strip())
    if match is None or match.group(2) in (".", "..") or match.group(1) in (".", ".."):
        raise ValidationError(GITHUB_REPO_INVALID)
    return value.strip()


def parse_github_reviewers(value: object) -> tuple[str, ...]:
    """The logins of `--github-reviewer LOGIN[,LOGIN]` (a string, or a list from a stored
    route), in order, each once; () for none."""
    if value is None or value == "":
        return ()
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        parts = [str(v) for v in value]
    elif isinstance(value, str):
        parts = value.split(",")
    else:
        raise ValidationError(GITHUB_REVIEWER_TYPE)
    logins: list[str] = []
    for part in parts:
        login = part.strip()
        if not _LOGIN_RE.match(login) or len(login) > 39:
            raise ValidationError(GITHUB_REVIEWER_INVALID.format(login=login))
        if login.lower() not in (known.lower() for known in logins):
            logins.append(login)
    return tuple(logins)


def parse_git_author(value: str) -> tuple[str, str]:
    """(name, email) of `Name <email>`; ValueError naming LOOPSWEB_GIT_AUTHOR otherwise."""
    match = _AUTHOR_RE.match(value.strip())
    if match is None or not match.group(1).strip():
        raise ValueError(GIT_AUTHOR_INVALID.format(value=value))
    return match.group(1).strip(), match.group(2)
