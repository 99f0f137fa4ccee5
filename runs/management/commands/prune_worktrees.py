"""Remove run worktrees that are due (what the periodic `prune-worktrees` task does).

Due: a succeeded run's worktree whose removal did not happen, and a failed, timed-out or
cancelled run's worktree LOOPSWEB_WORKTREE_KEEP_SECONDS after the run finished (or after
`--keep-seconds`). A removal that fails is reported and retried at the next prune.
Only this host's worktrees (LOOPSWEB_HOST_NAME). `--orphans` (what the periodic task also
does) removes the orphans on this disk too: directories under LOOPSWEB_WORKTREE_DIR the
ledger keeps no worktree for, with their branches.

Nothing that is not committed is ever removed: what a due worktree still holds is committed
on its run's branch first (`committed`), and a worktree or orphan whose work cannot be
committed or checked stays (`kept`, with the reason; `--json` lists them under `kept`).
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError

from domain.bounds import option_type
from ledger.management.terminal import OperatorCommand
from runs.discard import run_branches_prune
from runs.worktree_prune import worktree_orphans_prune, worktrees_prune


class Command(OperatorCommand):
    help = (
        "Remove the git worktrees of finished runs that are due (kept failures expire)."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="list what would be removed, change nothing",
        )
        parser.add_argument(
            "--keep-seconds",
            type=option_type("--keep-seconds"),
            help="keep failed runs' worktrees this long (default LOOPSWEB_WORKTREE_KEEP_SECONDS)",
        )
        parser.add_argument(
            "--orphans",
            action="store_true",
            help="also remove worktree directories on this disk the ledger keeps none for",
        )
        parser.add_argument("--json", action="store_true", help="print a JSON report")

    def handle(self, *args: Any, **options: Any) -> None:
        dry_run: bool = options["dry_run"]
        keep = options["keep_seconds"]
        pruned = worktrees_prune(keep_seconds=keep, dry_run=dry_run)
        if options["orphans"]:
            pruned += worktree_orphans_prune(dry_run=dry_run)
        branches = run_branches_prune(dry_run=dry_run)
        failed = [p for p in pruned if p.error]
        kept = [p for p in pruned if p.kept]
        pruned = [p for p in pruned if not p.kept]
        if options["json"]:
            report = {
                "dryRun": dry_run,
                "pruned": [p.to_dict() for p in pruned],
                "kept": [p.to_dict() for p in kept],
                "branches": [b.to_dict() for b in branches],
            }
            self.stdout.write(json.dumps(report, indent=2))
        else:
            verb = "would commit" if dry_run else "committed"
            for entry in pruned:
                note = f" (failed: {entry.error})" if entry.error else ""
                if entry.committed:
                    note += f" ({verb} {entry.committed} path(s) left on {entry.branch} first)"
                self.stdout.write(
                    f"  {entry.run_id} [{entry.status}] {entry.path}{note}"
                )
            verb = "would remove" if dry_run else "removed"
            self.stdout.write(f"{verb} {len(pruned) - len(failed)} worktree(s)")
            for entry in kept:
                self.stdout.write(f"  {entry.run_id} {entry.path} kept: {entry.kept}")
            if kept:
                self.stdout.write(f"kept {len(kept)} worktree(s) holding work")
            for gone in branches:
                self.stdout.write(
                    f"  branch {gone.branch} of {gone.run_id}: {gone.reason}"
                )
            verb = "would delete" if dry_run else "deleted"
            self.stdout.write(f"{verb} {len(branches)} run branch(es)")
        if failed:
            raise CommandError(f"{len(failed)} worktree(s) could not be removed")
