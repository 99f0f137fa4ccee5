"""Management commands of the ledger (check_migrations, lock_migrations, recover_runs,
run_workflow). The top layer: may import anything below it."""
