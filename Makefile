# The two set-up commands are `make run` and `make test` (see README.md).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install run serve test test-fast bench lint format check-migrations

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

install: $(VENV)/.installed

run: install
	PY=$(PY) scripts/run.sh

# production: gunicorn + both clusters (SECRET_KEY and ALLOWED_HOSTS required; README "Production")
serve: install
	PY=$(PY) scripts/serve.sh

test: install
	PY=$(PY) scripts/test.sh

# The tests that start no process and wait on no timer (not marked slow), on SQLite. Two
# workers (TEST_WORKERS overrides): these tests only compute, so a third worker on the 2-core
# machine adds its start-up (about 4 s of CPU) and contention, not speed (58 s against 48 s).
test-fast: install
	PY=$(PY) TEST_BACKENDS=sqlite TEST_WORKERS=$${TEST_WORKERS:-2} scripts/test.sh -m "not slow"

bench: install
	PY=$(PY) $(PY) -m tests.bench

# mypy imports the settings (django-stubs): they need a SECRET_KEY, or DEBUG for the dev key.
# --no-incremental: a warm cache missed errors after a merge and after a config change
# (about 10 s cold).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	SECRET_KEY=lint DEBUG=1 $(VENV)/bin/mypy --no-incremental

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

check-migrations: install
	$(PY) manage.py check_migrations
