"""Health of the installation: the database and both clusters (see selectors)."""
