# Two commands for a fresh clone (only Python 3.11 and pip needed):
#   make run    install into .venv, migrate, seed samples, start web (127.0.0.1:8080) + workers
#   make test   install into .venv and run the whole test suite (TEST_WORKERS processes)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: run test unit install bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $(STAMP)

# The Python client (client/, its own package) is installed with the test extras: tests/client
# exercises it against the broker; the otel extra too: the span tests run the real OpenTelemetry SDK.
$(TEST_STAMP): $(STAMP) pyproject.toml client/pyproject.toml
	$(PY) -m pip install -q -e ".[test,spark,otel]" -e ./client
	touch $(TEST_STAMP)

install: $(STAMP)

run: $(STAMP)
	@mkdir -p .data
	@test -s .data/secret_key || $(PY) -c "import secrets; print(secrets.token_urlsafe(50))" > .data/secret_key
	DJANGO_SECRET_KEY=$${DJANGO_SECRET_KEY:-$$(cat .data/secret_key)} $(PY) manage.py runbroker

# The plan tests run once more on each PostgreSQL the machine has installed (Debian's
# /usr/lib/postgresql/<version>/bin): planners differ between versions, and users run theirs.
PG_SYSTEM_BINS ?= $(wildcard /usr/lib/postgresql/*/bin)

# The whole suite runs in two parts: the tests that share the session's PostgreSQL in TEST_WORKERS
# processes (pytest-xdist; each has its own test database, a test file stays in one process), then
# the ones marked serial alone (the chaos test: it restarts that server). With
# PYTEST_ARGS, one plain pytest run in this process.
TEST_WORKERS ?= 2

test: $(TEST_STAMP)
	@if [ -n "$(PYTEST_ARGS)" ]; then $(PY) -m pytest $(PYTEST_ARGS); else \
		$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not serial" \
		&& echo "== the serial tests" && $(PY) -m pytest -m serial; fi
	@if [ -z "$(PYTEST_ARGS)" ]; then for bin in $(PG_SYSTEM_BINS); do \
		echo "== the plan tests on $$bin"; \
		env -u DATABASE_URL BROKER_PG_BIN=$$bin $(PY) -m pytest -q -p no:cacheprovider tests/plans || exit 1; \
	done; fi

# DB-free unit tests of the pure rules: DATABASE_URL names a closed port, so no PostgreSQL is
# started and any query fails.
unit: $(TEST_STAMP)
	DATABASE_URL=postgres://unit:unit@127.0.0.1:9/no_database $(PY) -m pytest -m unit -q $$(find tests -type d -name unit) $(PYTEST_ARGS)

clean:
	-$(PY) -m broker.embedded_db stop
	rm -rf .data
