"""Management commands of execution on this host (account, deliver_run, discard_run,
prune_worktrees, qcluster, run_workflow). The top of runs: may import anything of it and
below it, never `routing`."""
