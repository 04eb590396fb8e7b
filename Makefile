# Kumo's two entry points: `make run` (the whole topology on embedded defaults) and
# `make test` (the suite; on PostgreSQL and Redis when they answer on 127.0.0.1).
# Both install what they need first: Debian packages through apt-get when missing,
# a virtual environment in .venv, and the pinned Python dependencies of requirements.lock.

PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
APT_PACKAGES := libvirt-dev pkg-config iproute2
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test lint bench-api sysdeps install lock clean

run: install
	$(PY) manage.py run

test: install
	$(VENV)/bin/ruff check .
	$(PY) tests/run.py $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench-api: install
	$(PY) bench/api.py

# System packages: only what is missing is installed, so a prepared machine pays nothing.
sysdeps:
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi

install: sysdeps $(VENV)/.installed

$(VENV)/.installed: requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.lock
	$(PY) -m pip install -q --no-deps -e .
	touch $@

# Re-pin after changing pyproject.toml: resolves the ranges afresh into requirements.lock.
lock:
	rm -rf /tmp/kumo-lock && $(PYTHON) -m venv /tmp/kumo-lock
	/tmp/kumo-lock/bin/pip install -q ".[dev]"
	/tmp/kumo-lock/bin/pip freeze --exclude kumo | grep -v '^-e' > requirements.lock
	rm -rf /tmp/kumo-lock

clean:
	rm -rf $(VENV) var
