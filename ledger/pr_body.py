"""The story of a run as a pull request's title and body (docs/delivery.md §3).

The body: the task's title and description, each step with its account, provider, outcome,
duration and tokens/cost, the verifier's last message, and a link to the item page
(LOOPSWEB_BASE_URL + /ops/items/<id>/). Text from the task and the agents is quoted as it
is, its control characters dropped; GitHub renders it as Markdown, so it goes inside fenced
blocks where it could be read as markup.
"""

from __future__ import annotations

from django.conf import settings

from ledger.agent_output import summarize_output
from ledger.held_secrets import held_secrets
from ledger.models import WorkflowRun, WorkflowStepRun
from ledger.redaction import Redactor
from ledger.step_commits import one_line, task_of

TITLE_CHARS = 200
DESCRIPTION_CHARS = 20_000
MESSAGE_CHARS = 4_000


def _printable(text: str, limit: int) -> str:
    kept = "".join(ch if ch.isprintable() or ch in "\n\t" else " " for ch in text)
    return kept if len(kept) <= limit else kept[: limit - 1] + "…"


def _fenced(text: str) -> str:
    fence = "```"
    while fence in text:
        fence += "`"
    return f"{fence}text\n{text}\n{fence}"


def pull_request_title(run: WorkflowRun) -> str:
    task = task_of(run)
    return one_line(task["title"], TITLE_CHARS) or f"loopsweb run {run.id}"


def _usage(step: WorkflowStepRun) -> str:
    parts = []
    if step.usage_input_tokens is not None or step.usage_output_tokens is not None:
        parts.append(
            f"{step.usage_input_tokens or 0} in / {step.usage_output_tokens or 0} out"
        )
    if step.usage_cost_usd is not None:
        parts.append(f"${step.usage_cost_usd:.4f}")
    return ", ".join(parts) or "-"


def _cell(text: object) -> str:
    return one_line(text, 200).replace("|", "\\|") or "-"


def pull_request_body(run: WorkflowRun) -> str:
    task = task_of(run)
    steps = list(
        WorkflowStepRun.objects.filter(workflow_run_id=run.id).order_by("sequence")
    )
    lines = [f"## {one_line(task['title'], TITLE_CHARS) or 'loopsweb run'}", ""]
    lines += [
        f"Task `{_cell(task['id'])}`, loopsweb run `{run.id}`: **{run.status}**.",
        "",
    ]
    if task["description"]:
        lines += [_fenced(_printable(task["description"], DESCRIPTION_CHARS)), ""]
    lines += [
        "| step | account | provider | outcome | duration | tokens / cost | commit |",
        "|---|---|---|---|---|---|---|",
    ]
    for step in steps:
        seconds = f"{step.duration_ms / 1000:.1f} s" if step.duration_ms else "-"
        commit = f"`{step.commit_sha[:12]}`" if step.commit_sha else "-"
        lines.append(
            f"| {_cell(step.step_id)} | {_cell(step.account_profile)} | "
            f"{_cell(step.account_tool)} | {_cell(step.status)} | {seconds} | "
            f"{_usage(step)} | {commit} |"
        )
    verifier = next((s for s in reversed(steps) if s.step_id == "verifier"), None)
    if verifier is not None and verifier.stdout:
        said = summarize_output(verifier.account_tool, verifier.stdout).strip()
        said = said or verifier.stdout.strip()
        message = said.splitlines()[-1] if said else ""
        if message:
            lines += ["", "The verifier's last message:", ""]
            lines += [_fenced(_printable(message, MESSAGE_CHARS))]
    if run.work_item_id:
        base = settings.LOOPSWEB_BASE_URL
        link = f"{base}/ops/items/{run.work_item_id}/" if base else None
        lines += [
            "",
            f"Work item: {link}" if link else f"Work item `{run.work_item_id}`",
        ]
    # No secret loopsweb holds reaches the forge (ledger.held_secrets).
    return Redactor(held_secrets()).redact("\n".join(lines) + "\n")
