"""What becomes of a run's work (docs/delivery.md §2): the route's `--deliver` option.

- `branch` (the default): the work stays on `loopsweb/run-<id>` in the project, as before.
- `none`: the branch of a run that succeeded goes with its worktree (nothing is kept).
- `push`: after a run that succeeded with changes (or any run that changed something, with
  `--deliver-failed`), `loopsweb/run-<id>` is pushed to `--deliver-remote` (default origin).
- `pull-request`: push, then open a pull request (runs.github) against the branch the run
  started from; a draft when the run did not succeed.

1. **The remote is read before the agent runs.** When the run's worktree is made
   (`delivery_start`), the remote's push URL (`remote.<name>.pushurl`, else `.url`), the
   branch the project was on and its commit are recorded on the run (`delivery_json`); the
   URL without any user or password in it. An agent that rewrites the remote afterwards
   (its worktree shares the repository's config) changes nothing.
2. **The push runs on loopsweb's own config.** It is made from a scratch bare repository
   that borrows the project's objects (`objects/info/alternates`), so no config of the
   project's (`url.*.insteadOf`, `remote.*`, hooks, `credential.helper`) is read; every
   override of runs.git applies, except that ssh is LOOPSWEB_GIT_SSH_COMMAND, the
   credential helper LOOPSWEB_GIT_CREDENTIAL_HELPER (the operator's) and the file, ssh,
   http and https transports are allowed. Git runs as argv, never through a shell.
3. **A failure never changes the run's outcome.** A refused push, a forge that answers
   401/403/422/5xx or cannot be reached: the run records `state: failed` and
   `error: "delivery failed: <the message>"`, an event `delivery_failed`, and "Deliver
   again" (`deliver_run`, from the console or `manage.py deliver_run RUN`) tries again.
   A pull request already opened is never opened twice.
4. **Reviewers are asked, not required.** With `--github-reviewer`, the pull request
   opened (or adopted) is given review requests for those logins; the logins GitHub then
   lists are recorded (`reviewers`). A refusal (a login that is no collaborator: 422) is
   a note on the record (`notes`) and the delivery stays delivered; a later delivery of
   the same run asks again only if no request went through.
5. **The remote is pinned per project.** The URL a project's first delivery to a remote
   went to is where every later delivery of that project to that remote goes: a run whose
   recorded URL differs (an agent wrote `remote.origin.pushurl` into the project's config,
   which the next, innocent run would have read) is refused delivery with the reason, and
   "Deliver again" refuses it too until the config names the pinned URL again.
6. **A revision updates its pull request.** A run that carries out a revision of an item
   whose earlier run delivered a pull request pushes to that pull request's branch (a
   fast-forward: the round started from the head loopsweb pushed, routing.revisions
   checks it) and records the same pull request: no second one is opened.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.utils import timezone

from domain.delivery import (
    DEFAULT_REMOTE,
    DELIVER_BRANCH,
    DELIVER_NONE,
    DELIVER_PULL_REQUEST,
    DELIVER_PUSH,
    parse_deliver,
    parse_github_reviewers,
    parse_remote,
)
from domain.errors import ApplicationError
from ledger.models import RunStatus, WorkflowRun, WorkItemRevision
from ledger.services.common import clean_text
from ledger.services.delivery import run_delivery_record
from ledger.services.revisions import item_pull_request
from runs.delivery_view import run_project
from runs.git import GitError, git_error_line, resolve_commit, run_git
from runs.github import (
    ForgeError,
    find_pull_request,
    github_repo_of,
    open_pull_request,
    request_reviewers,
)
from runs.pr_body import pull_request_body, pull_request_title
from runs.worktrees import Worktree, project_repository, worktree_branch

logger = logging.getLogger(__name__)

DELIVERY_FAILED = "delivery failed: {error}"
NO_REMOTE = "the project has no remote {name} (recorded when the run started)"
PUSH_REFUSED = "git push to {url} refused: {error}"
NO_BRANCH = "the run's branch {branch} is gone"
NOT_DELIVERED_FAILED = "the run did not succeed (the route has no --deliver-failed)"
NO_CHANGES = "the run changed nothing"
NO_WORK = "the run has no branch (it ran without a worktree)"
REVIEWERS_REFUSED = "reviewers {logins} not requested: {error}"
REMOTE_CHANGED = (
    "the project's remote {name} now names {url}, not {pinned}, where its first delivery "
    "went: delivery refused (an agent may have rewritten the project's config: check "
    "`git config --get-regexp 'remote|url'` in the project)"
)


class DeliveryError(ApplicationError):
    """The work could not be delivered (the run's outcome stays as it is)."""


def delivery_options(run: WorkflowRun) -> dict[str, Any]:
    """The route's delivery options as its work item stores them (validated at admission
    by routing.admission.options; read again here, the defaults for anything else)."""
    item = run.work_item if run.work_item_id else None
    route: Any = item.route_options_json if item is not None else None
    options = route.get("options") if isinstance(route, dict) else None
    options = options if isinstance(options, dict) else {}
    try:
        mode = parse_deliver(options.get("deliver"))
        remote = parse_remote(options.get("deliver_remote"))
    except ApplicationError:
        mode, remote = DELIVER_BRANCH, DEFAULT_REMOTE
    try:
        reviewers = list(parse_github_reviewers(options.get("github_reviewer")))
    except ApplicationError:
        reviewers = []
    return {
        "mode": mode,
        "remote": remote,
        "failed": options.get("deliver_failed") is True,
        "githubRepo": options.get("github_repo")
        if isinstance(options.get("github_repo"), str)
        else None,
        "reviewers": reviewers,
    }


def shown_url(url: str) -> str:
    """`url` without a user or password (it is stored and shown)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if parts.scheme and "@" in parts.netloc:
        host = parts.netloc.rsplit("@", 1)[1]
        return urlunsplit(parts._replace(netloc=host))
    return url


def _config(common_dir: str, name: str) -> str | None:
    result = run_git(
        "config", "--get", name, git_dir=common_dir, cwd=common_dir, check=False
    )
    return result.text if result.returncode == 0 and result.text else None


def delivery_start(run: WorkflowRun, worktree: Worktree) -> None:
    """Record, before any agent step, where the work would go (module docstring,
    "the remote is read before the agent runs")."""
    options = delivery_options(run)
    record: dict[str, Any] = {"mode": options["mode"], "remote": options["remote"]}
    try:
        repo = project_repository(worktree.project)
        common = repo.common_dir
        remote = options["remote"]
        url = _config(common, f"remote.{remote}.pushurl") or _config(
            common, f"remote.{remote}.url"
        )
        base = run_git(
            "symbolic-ref",
            "--short",
            "-q",
            "HEAD",
            git_dir=repo.git_dir,
            cwd=repo.git_dir,
            check=False,
        ).text
        record.update(
            url=shown_url(url) if url else None,
            base=base or None,
            baseCommit=resolve_commit(repo.git_dir, "HEAD"),
        )
    except (GitError, ApplicationError) as exc:
        record["startError"] = str(exc)
    run_delivery_record(run.id, record)


def push_branch(common_dir: str, url: str, commit: str, branch: str) -> None:
    """Push `commit` to `refs/heads/<branch>` at `url` from a scratch repository of
    loopsweb's own (module docstring, "the push runs on loopsweb's own config");
    DeliveryError with git's message if refused."""
    extra = {
        name: os.environ[name] for name in ("SSH_AUTH_SOCK",) if name in os.environ
    }
    with tempfile.TemporaryDirectory(prefix="loopsweb-push-") as scratch:
        run_git(
            "init", "--bare", "-q", "--template=", scratch, git_dir=scratch, cwd=scratch
        )
        alternates = os.path.join(scratch, "objects", "info", "alternates")
        os.makedirs(os.path.dirname(alternates), exist_ok=True)
        with open(alternates, "w", encoding="utf-8") as handle:
            handle.write(os.path.join(os.path.realpath(common_dir), "objects") + "\n")
        pushed = run_git(
            "push",
            "--porcelain",
            "--no-verify",
            "--",
            url,
            f"{commit}:refs/heads/{branch}",
            git_dir=scratch,
            cwd=scratch,
            extra_env=extra,
            check=False,
            transport=True,
        )
    if pushed.returncode != 0:
        raise DeliveryError(PUSH_REFUSED.format(url=url, error=git_error_line(pushed)))


def _github_repo(record: Mapping[str, Any], options: Mapping[str, Any]) -> str:
    if options["githubRepo"]:
        return str(options["githubRepo"])
    found = github_repo_of(str(record.get("url") or ""))
    if found is None:
        raise DeliveryError(
            f"the remote {record.get('url')} is not a GitHub URL: give the route "
            "--github-repo OWNER/NAME"
        )
    return f"{found[0]}/{found[1]}"


def _deliver(
    run: WorkflowRun, record: dict[str, Any], options: Mapping[str, Any]
) -> None:
    """Push, then open the pull request (updating `record`); DeliveryError/ForgeError."""
    branch = run.worktree_branch or worktree_branch(run.id)
    if not record.get("url"):
        raise DeliveryError(NO_REMOTE.format(name=record.get("remote") or "origin"))
    project = run_project(run)
    if project is None:
        raise DeliveryError(NO_WORK)
    pinned = _pinned_url(run, record)
    if pinned is not None and pinned != record["url"]:
        raise DeliveryError(
            REMOTE_CHANGED.format(
                name=record.get("remote") or "origin", url=record["url"], pinned=pinned
            )
        )
    common = project_repository(project).common_dir
    commit = resolve_commit(common, f"refs/heads/{branch}")
    if commit is None:
        raise DeliveryError(NO_BRANCH.format(branch=branch))
    continued = _continued_pull_request(run)
    pushed_to = continued[0] if continued else branch
    push_branch(common, str(record["url"]), commit, pushed_to)
    record.update(
        ref=f"refs/heads/{pushed_to}",
        commit=commit,
        pushedAt=timezone.now().isoformat(),
    )
    if options["mode"] != DELIVER_PULL_REQUEST:
        return
    if continued is not None:
        record["pr"] = continued[1]  # the same pull request, updated by the push
    elif not record.get("pr"):
        record["pr"] = _open_pull_request(run, record, options, branch)
    if options["reviewers"] and not record.get("reviewers"):
        _ask_reviewers(record, options["reviewers"])


def _continued_pull_request(run: WorkflowRun) -> tuple[str, dict[str, Any]] | None:
    """(branch, pull request record) a revision round pushes to (module docstring, "a
    revision updates its pull request"): the pull request an earlier run of the item
    delivered, when this run carries out a revision; None otherwise."""
    if (
        not run.work_item_id
        or not WorkItemRevision.objects.filter(run_id=run.id).exists()
    ):
        return None
    delivered = item_pull_request(run.work_item_id)
    if delivered is None or delivered[0] == run.id:
        return None
    ref = str(delivered[1].get("ref") or "")
    if not ref.startswith("refs/heads/"):
        return None
    return ref.removeprefix("refs/heads/"), dict(delivered[1]["pr"])


def _pinned_url(run: WorkflowRun, record: Mapping[str, Any]) -> str | None:
    """The remote URL the project's first delivery to this remote went to: every later
    delivery goes there or nowhere (module docstring, "the remote is pinned per
    project")."""
    key = run.work_item.project_key if run.work_item_id and run.work_item else None
    if not key:
        return None
    first = (
        WorkflowRun.objects.filter(
            work_item__project_key=key,
            delivery_json__state="delivered",
            delivery_json__remote=record.get("remote") or "origin",
        )
        .exclude(pk=run.pk)
        .order_by("created_at")
        .values_list("delivery_json", flat=True)
        .first()
    )
    url = first.get("url") if isinstance(first, dict) else None
    return str(url) if url else None


def _ask_reviewers(record: dict[str, Any], logins: list[str]) -> None:
    """Request `logins`' reviews on the record's pull request (module docstring,
    "reviewers are asked, not required")."""
    pr = record["pr"]
    try:
        record["reviewers"] = request_reviewers(pr["repo"], pr["number"], logins)
    except ForgeError as exc:
        note = REVIEWERS_REFUSED.format(logins=",".join(logins), error=exc)
        record["notes"] = [*(record.get("notes") or []), clean_text(note)]
        logger.warning("%s", record["notes"][-1])


def _open_pull_request(
    run: WorkflowRun,
    record: Mapping[str, Any],
    options: Mapping[str, Any],
    branch: str,
) -> dict[str, Any]:
    """Open the run's pull request (or adopt the one its branch has): its record."""
    repo = _github_repo(record, options)
    try:
        pr = open_pull_request(
            repo,
            head=branch,
            base=str(record.get("base") or "main"),
            title=pull_request_title(run),
            body=pull_request_body(run, repo=repo),
            draft=run.status != RunStatus.SUCCEEDED,
        )
    except ForgeError as exc:
        # 422 for a branch that has its pull request already (one opened before an answer
        # was lost): that one is the run's.
        existing = find_pull_request(repo, head=branch) if exc.status == 422 else None
        if existing is None:
            raise
        pr = existing
    return {
        "repo": repo,
        "number": pr.number,
        "url": pr.url,
        "state": pr.state,
        "draft": pr.draft,
    }


def _skip_reason(run: WorkflowRun, options: Mapping[str, Any]) -> str | None:
    """Why a push or pull-request route does not deliver this ended run's work (no branch,
    no changes, a failed run without --deliver-failed), or None: it does."""
    if not run.worktree_branch or run.commit_head is None:
        return NO_WORK
    if not run.commit_diffstat:
        return NO_CHANGES
    if run.status != RunStatus.SUCCEEDED and not options["failed"]:
        return NOT_DELIVERED_FAILED
    return None


def deliver_run(run_id: str, *, held: str | None = None) -> dict[str, Any]:
    """Deliver the ended run's work as its route says (module docstring); the record.
    Never raises for a refused delivery: the record says why. `held`: why the work is not
    delivered now (its verifier sent it back: runs.revision_run), recorded as `skipped`."""
    run = WorkflowRun.objects.select_related("workflow", "work_item", "invocation").get(
        pk=run_id
    )
    options = delivery_options(run)
    record = dict(run.delivery_json or {})
    record.setdefault("mode", options["mode"])
    record.update(error=None, attemptedAt=timezone.now().isoformat())
    mode = options["mode"]
    skipped = _skip_reason(run, options)
    if mode in (DELIVER_NONE, DELIVER_BRANCH):
        record["state"] = "kept" if mode == DELIVER_BRANCH else "not-kept"
    elif held is not None:
        record.update(state="skipped", reason=held)
    elif skipped is not None:
        record.update(state="skipped", reason=skipped)
    else:
        try:
            _deliver(run, record, options)
            record.update(state="delivered", reason=None)
        except (DeliveryError, ForgeError, GitError, ApplicationError, OSError) as exc:
            record.update(state="failed", error=DELIVERY_FAILED.format(error=exc))
            logger.warning("run %s: %s", run.id, record["error"])
    run_delivery_record(run.id, record)
    return record


def redeliverable(run: WorkflowRun) -> bool:
    """Whether "Deliver again" applies: a push or pull-request route's ended run, not
    delivered yet, whose work its route delivers (`_skip_reason`: a failed run without
    --deliver-failed, or one that changed nothing, has nothing to deliver again)."""
    record = run.delivery_json or {}
    return (
        run.status in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.TIMED_OUT)
        and record.get("mode") in (DELIVER_PUSH, DELIVER_PULL_REQUEST)
        and record.get("state") != "delivered"
        and run.work_discarded_at is None
        and _skip_reason(run, delivery_options(run)) is None
    )


def delivery_outcome(run_id: str, record: Mapping[str, Any]) -> tuple[bool, str]:
    """(delivered, one line for the operator) of a delivery's record, as "Deliver again"
    reports it: delivered only when the record says so; else its error or why not."""
    state = record.get("state")
    if state == "delivered":
        return True, f"Run {run_id}: delivered."
    why = record.get("error") or record.get("reason") or f"state {state}"
    return False, f"Run {run_id}: not delivered ({why})."
