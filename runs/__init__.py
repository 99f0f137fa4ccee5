"""Executing an admitted run on this host: the django-q2 tasks (`tasks`), the runner and its
step start, process and watch (`runner`, `step_*`, `agent_step`, `processes`), the providers'
argv and environment (`providers`), the agent sandbox and where it may connect (`sandbox`, `sandbox_egress`),
projects, worktrees and git, delivery and GitHub, discard and prune, the account self-test,
the heartbeat and the run cluster's start, and their commands. A Django app with no models:
it reads and writes the record through `ledger` (selectors, services) and imports nothing of
`routing` (`tests/test_layers.py`)."""
