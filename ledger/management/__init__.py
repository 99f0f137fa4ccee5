"""Management commands of the record (check_migrations, lock_migrations, hosts, loop,
recover_runs, recount_account_loads). The top of the ledger: may import anything of it."""
