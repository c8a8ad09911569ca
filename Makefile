# Two commands from a fresh clone: `make run` (the embedded console) and `make test` (the suite).
SHELL := /bin/bash
export SSL_CERT_FILE ?= /etc/ssl/certs/ca-certificates.crt
export UV_PYTHON_DOWNLOADS := never
export UV_LINK_MODE := copy
VENV := .venv
PY := $(VENV)/bin/python
UV := python3 -m uv

.PHONY: run test lint format

$(VENV)/.synced: pyproject.toml uv.lock
	@python3 -m uv --version >/dev/null 2>&1 || python3 -m pip install --quiet --disable-pip-version-check uv
	$(UV) sync --locked --quiet
	@touch $@

run: $(VENV)/.synced
	$(PY) manage.py run_console

# The suite runs on PostgreSQL and a real Redis-backed Celery worker (started here if stopped).
test: export DATABASE_URL ?= postgres://e31:e31@127.0.0.1:5432/e31
test: export CELERY_BROKER_URL ?= redis://127.0.0.1:6379/0
test: $(VENV)/.synced
	@bin/ensure-services
	@# axe-core for the browser tests' accessibility audit (package-lock.json pins it); skipped without npm.
	@if command -v npm >/dev/null 2>&1; then npm ci --no-audit --no-fund --silent; fi
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(VENV)/.synced
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(VENV)/.synced
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .
