"""A run's work as the console, the API and `routes show` show it (docs/delivery.md §4):
its branch, its commits (one per step that changed files, with the step's account), the
diffstat, what was delivered (pushed ref and commit, pull request) and the patch of the
branch against where it started, capped (`run_patch`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ledger.models import WorkflowRun, WorkflowStepRun
from runs.git import GitError, resolve_commit, run_git
from runs.worktrees import WorktreeError, project_repository

PATCH_CHARS = 60_000  # the page shows this much of the patch, then "show all"
PATCH_MOST_CHARS = 2_000_000  # "show all" stops here too


def run_commits(
    run: WorkflowRun, steps: list[WorkflowStepRun] | None = None
) -> list[dict[str, Any]]:
    """The run's commits oldest first: one per step that changed files (`steps`: the
    run's step runs, when the caller has them)."""
    every = run.step_runs.all() if steps is None else steps
    steps = [s for s in every if s.commit_sha]
    return [
        {
            "sha": step.commit_sha,
            "stepId": step.step_id,
            "account": step.account_profile,
            "provider": step.account_tool,
            "diffstat": step.commit_diffstat or "",
        }
        for step in sorted(steps, key=lambda s: s.sequence)
    ]


def pull_request(run: WorkflowRun) -> dict[str, Any] | None:
    pr = (run.delivery_json or {}).get("pr")
    return dict(pr) if isinstance(pr, dict) else None


def delivery_fields(run: WorkflowRun) -> dict[str, Any]:
    """The API's and `routes show`'s delivery fields of one run (steps prefetched)."""
    record = run.delivery_json or {}
    pr = pull_request(run)
    return {
        "diffstat": run.commit_diffstat,
        "commits": run_commits(run),
        "delivery": {
            "mode": record.get("mode"),
            "state": record.get("state"),
            "remote": record.get("remote"),
            "remoteUrl": record.get("url"),
            "base": record.get("base"),
            "ref": record.get("ref"),
            "commit": record.get("commit"),
            "error": record.get("error"),
            "reason": record.get("reason"),
        }
        if record
        else None,
        "pullRequest": pr,
        "workDiscardedAt": run.work_discarded_at.isoformat()
        if run.work_discarded_at
        else None,
    }


def delivery_line(run: WorkflowRun) -> str | None:
    """One line for `routes show` and the item page's run header, or None."""
    record = run.delivery_json or {}
    if not record:
        return None
    pr = pull_request(run)
    if record.get("error"):
        return str(record["error"])
    if pr:
        draft = " (draft)" if pr.get("draft") else ""
        return f"pull request #{pr.get('number')} {pr.get('state')}{draft}: {pr.get('url')}"
    if record.get("state") == "delivered":
        return f"pushed {record.get('ref')} at {str(record.get('commit'))[:12]}"
    if record.get("state") == "skipped":
        return f"deliver {record.get('mode')}: not delivered ({record.get('reason')})"
    return f"deliver {record.get('mode')}"


@dataclass(frozen=True)
class Patch:
    text: str
    truncated: bool
    error: str | None = None


def run_patch(run: WorkflowRun, *, limit: int | None = None) -> Patch | None:
    """The patch of the run's branch against the commit it started from, as git shows it
    with every program off (runs.git), at most `limit` characters; None without a
    branch. Plain text: the page escapes it."""
    limit = limit or PATCH_CHARS
    record = run.delivery_json or {}
    if not run.worktree_branch or run.commit_head is None or run.work_discarded_at:
        return None
    project = run_project(run)
    if project is None:
        return None
    try:
        common = project_repository(project).common_dir
        head = resolve_commit(common, f"refs/heads/{run.worktree_branch}")
        base = record.get("baseCommit")
        if head is None:
            return Patch("", False, error=f"the branch {run.worktree_branch} is gone")
        if not isinstance(base, str) or resolve_commit(common, base) is None:
            base = (
                run_git(
                    "rev-parse",
                    f"{head}~{_own_commits(run)}",
                    git_dir=common,
                    cwd=common,
                    check=False,
                ).text
                or None
            )
        if base is None:
            return None
        done = run_git(
            "diff",
            "--no-color",
            "--patch",
            "--stat",
            base,
            head,
            git_dir=common,
            cwd=common,
        )
    except (GitError, WorktreeError) as exc:
        return Patch("", False, error=str(exc))
    text = done.stdout[: limit * 4].decode("utf-8", "replace")
    return Patch(
        text[:limit], truncated=len(text) > limit or len(done.stdout) > limit * 4
    )


def _own_commits(run: WorkflowRun) -> int:
    return max(
        1,
        WorkflowStepRun.objects.filter(
            workflow_run_id=run.id, commit_sha__isnull=False
        ).count(),
    )


def run_project(run: WorkflowRun) -> str | None:
    """The project a run's agent steps work in (their `cwd`), or None."""
    for step in run.workflow.steps_json or []:
        target = step.get("target") if isinstance(step, dict) else None
        if isinstance(target, dict) and isinstance(target.get("cwd"), str):
            return str(target["cwd"])
    return None
