"""The record: models, the admission lock, the run queue, lifecycle services, selectors, the
runner and its provider adapters, in floors that import only downwards (`tests/test_layers.py`):
record (models, ids, locks, hosts, queue, signals) -> reads (selectors, loads) -> adapters
(providers, processes) -> services -> execution (worktrees, runner) -> tasks. Imports nothing
from `routing`, only the pure `domain`; the layers above learn of its changes through
`ledger.signals`. `admin/` (a web surface) and `management/` (commands) sit on top and may
import anything below them.
"""
