"""The record: models, the admission lock, lifecycle services, selectors, the runner and its
provider adapters. Imports nothing from `routing` but the pure `domain`; the layers
above learn of its changes through `ledger.signals`. `admin/` (a web surface) and
`management/` (commands) sit on top and may import anything below them.
"""
