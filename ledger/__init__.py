"""The record: models, the admission lock, the run queue, hosts and cluster instances,
lifecycle services, selectors, the admin, and the reaper that ends a run's leftover
processes ("nothing outlives its record"), in floors that import only downwards
(`tests/test_layers.py`): record (models, ids, locks, hosts, queue, signals) -> reads
(selectors, loads) -> services -> the admin and the commands. Imports only the pure `domain`
and `agents` (what the CLIs print); never `runs` (execution) or `routing`. The layers above
learn of its changes through `ledger.signals`.
"""
