"""The story of a run as a pull request's title and body (docs/delivery.md §3).

The body: the task's title (its heading) and description; a table with one row per attempt
of each step (account, provider, outcome, duration, tokens / cost, commit), so a step that
moved to another account after a rate limit has a row on each; the verifier's last message,
what its agent said last in its own words (agents.agent_message; its error when it said
nothing); and a link to the item page (LOOPSWEB_BASE_URL + /ops/items/<id>/). A cost reads
in dollars to the cent: `$0.20`, `<$0.01` under half a cent.

Text from the task and the agents is untrusted, and GitHub does more than render Markdown:
`@login` notifies, `#12` / `owner/repo#12` / `GH-12` link and cross-reference issues, a
closing keyword before an issue closes it when the pull request merges, `![x](url)` loads a
remote image, HTML renders. So:
1. **Neutralized.** `domain.forge_text.neutralize` makes mentions, issue references and
   closing keywords inert (a zero-width joiner in each): the text reads the same and acts on
   nothing;
2. **Escaped.** inline text (the heading, table cells) also has Markdown's punctuation
   backslash-escaped (`inline`): no emphasis, link, image, HTML tag or cell boundary comes
   of it;
3. **Fenced.** longer text (the description, the verifier's message) goes in a fenced block
   whose fence is longer than any run of backticks in it;
4. **One line.** control characters are dropped first; a title is one line of at most
   TITLE_CHARS;
5. **Redacted.** no secret loopsweb holds reaches the forge (ledger.held_secrets): the
   task's and the agent's text is redacted as it is, before neutralizing and escaping could
   split a secret, and the whole body once more.
The pull request's title is plain text: the task's title as one line, neutralized.

A task that came from an issue of the repository the pull request is opened in (source
`github`, task id `OWNER/NAME#N`: docs/github-intake.md) gets a line `Closes #N`, written by
loopsweb and so left live: merging the pull request closes the issue.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from django.conf import settings

from agents.agent_message import final_message
from agents.redaction import Redactor
from domain.forge_text import neutralize
from domain.github_issues import closed_issue
from ledger.display import ATTEMPT_OUTCOMES
from ledger.held_secrets import held_secrets
from ledger.models import WorkflowRun, WorkflowStepAttempt, WorkflowStepRun
from ledger.selectors import step_attempts
from runs.step_commits import one_line, task_of

TITLE_CHARS = 200
DESCRIPTION_CHARS = 20_000
MESSAGE_CHARS = 4_000
CELL_CHARS = 200

_MARKDOWN = re.compile(r"([\\`*_\[\]<>|~&#])")


def inline(text: object, limit: int = CELL_CHARS) -> str:
    """Untrusted text as one line of Markdown that renders as itself (module docstring,
    "escaped")."""
    return neutralize(_MARKDOWN.sub(r"\\\1", one_line(text, limit)))


def _printable(text: str, limit: int) -> str:
    kept = "".join(ch if ch.isprintable() or ch in "\n\t" else " " for ch in text)
    return kept if len(kept) <= limit else kept[: limit - 1] + "…"


def _fenced(text: str, limit: int) -> str:
    body = neutralize(_printable(text, limit))
    fence = "```"
    while fence in body:
        fence += "`"
    return f"{fence}text\n{body}\n{fence}"


def _code(text: object) -> str:
    """One line as a code span, whatever backticks it holds."""
    value = one_line(text, CELL_CHARS) or "-"
    ticks = "`" * (max((len(r) for r in re.findall("`+", value)), default=0) + 1)
    pad = " " if value.startswith("`") or value.endswith("`") else ""
    return f"{ticks}{pad}{value}{pad}{ticks}"


def cost_text(usd: float | None) -> str:
    """A cost in dollars to the cent: `$0.20`, `<$0.01` (under half a cent), "" for none."""
    if usd is None:
        return ""
    return "<$0.01" if 0 < usd < 0.005 else f"${usd:.2f}"


def _redactor() -> Redactor:
    return Redactor(held_secrets())


def _task(run: WorkflowRun, redactor: Redactor) -> dict[str, str]:
    """The run's task, its text redacted as it is (module docstring, "redacted")."""
    return {key: redactor.redact(value) for key, value in task_of(run).items()}


def pull_request_title(run: WorkflowRun) -> str:
    title = _task(run, _redactor())["title"]
    return neutralize(one_line(title, TITLE_CHARS)) or f"loopsweb run {run.id}"


def _usage(row: WorkflowStepRun | WorkflowStepAttempt) -> str:
    parts = []
    if row.usage_input_tokens is not None or row.usage_output_tokens is not None:
        parts.append(
            f"{row.usage_input_tokens or 0:,} in / {row.usage_output_tokens or 0:,} out"
        )
    if cost := cost_text(row.usage_cost_usd):
        parts.append(cost)
    return ", ".join(parts) or "-"


def _row(row: WorkflowStepRun | WorkflowStepAttempt, commit: str | None) -> str:
    seconds = f"{row.duration_ms / 1000:.1f} s" if row.duration_ms else "-"
    outcome = ATTEMPT_OUTCOMES.get(row.status, row.status)
    named = (row.step_id, row.account_profile, row.account_tool, outcome)
    cells = [inline(value) or "-" for value in named]
    shown = f"`{commit[:12]}`" if commit else "-"
    return f"| {' | '.join(cells)} | {seconds} | {_usage(row)} | {shown} |"


def _step_rows(steps: Sequence[WorkflowStepRun]) -> list[str]:
    """One row per attempt of each step, its commit on its last (module docstring)."""
    attempts = step_attempts(step.id for step in steps)
    lines = [
        "| step | account | provider | outcome | duration | tokens / cost | commit |",
        "|---|---|---|---|---|---|---|",
    ]
    for step in steps:
        tries: Sequence[WorkflowStepRun | WorkflowStepAttempt] = attempts[step.id]
        rows = tries or [step]
        for n, row in enumerate(rows, 1):
            lines.append(_row(row, step.commit_sha if n == len(rows) else None))
    return lines


def _verifier_said(steps: Sequence[WorkflowStepRun], redactor: Redactor) -> list[str]:
    verifier = next((s for s in reversed(steps) if s.step_id == "verifier"), None)
    if verifier is None:
        return []
    said = final_message(verifier.account_tool, verifier.stdout)
    head, text = ("last message", said) if said else ("error", verifier.error)
    if not text:
        return []
    fenced = _fenced(redactor.redact(text), MESSAGE_CHARS)
    return ["", f"The verifier's {head}:", "", fenced]


def _event_source(run: WorkflowRun) -> object:
    """The source of the event the run's task came in as (its invocation's record)."""
    invocation = run.invocation if run.invocation_id else None
    source: Any = invocation.source_json if invocation is not None else None
    raw = source.get("raw") if isinstance(source, dict) else None
    return raw.get("source") if isinstance(raw, dict) else None


def pull_request_body(run: WorkflowRun, *, repo: str | None = None) -> str:
    """The body of the run's pull request, opened in `repo` (`OWNER/NAME`) when known."""
    redactor = _redactor()
    task = _task(run, redactor)
    steps = list(
        WorkflowStepRun.objects.filter(workflow_run_id=run.id).order_by("sequence")
    )
    lines = [f"## {inline(task['title'], TITLE_CHARS) or 'loopsweb run'}", ""]
    lines += [
        f"Task {_code(task['id'])}, loopsweb run `{run.id}`: **{run.status}**.",
        "",
    ]
    closes = closed_issue(task_of(run)["id"], source=_event_source(run), repo=repo)
    if closes is not None:  # loopsweb's own line: live (module docstring)
        lines += [f"Closes #{closes}", ""]
    if task["description"]:
        lines += [_fenced(task["description"], DESCRIPTION_CHARS), ""]
    lines += _step_rows(steps)
    lines += _verifier_said(steps, redactor)
    if run.work_item_id:
        base = settings.LOOPSWEB_BASE_URL
        link = f"{base}/ops/items/{run.work_item_id}/" if base else None
        lines += [
            "",
            f"Work item: {link}" if link else f"Work item `{run.work_item_id}`",
        ]
    return redactor.redact("\n".join(lines) + "\n")  # module docstring, "redacted"
