"""Prometheus `/metrics`, computed from the ledger rows at each scrape. A web surface."""
