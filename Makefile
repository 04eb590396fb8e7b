# Kumo's two entry points: `make run` (the whole topology on embedded defaults) and
# `make test` (the suite; on PostgreSQL and Redis when they answer on 127.0.0.1).
# Both install what they need first: Debian packages through apt-get when missing,
# a virtual environment in .venv, and the pinned Python dependencies of requirements.lock.
# `make kvm-host` makes this Debian machine a real KVM host (libvirtd with QEMU, a kernel to
# boot, busybox) for the opt-in test tests/compute/test_kvm_boot.py; nothing depends on it.

PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
# chromium: the headless browser the portal tests drive through Playwright (never a
# browser Playwright downloads itself).
APT_PACKAGES := libvirt-dev pkg-config iproute2 iputils-ping tcpdump nftables chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test lint bench-api bench-placement bench-provision bench-netagent bench-preempt bench-billing sysdeps install kvm-host lock clean

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

bench-placement: install
	$(PY) bench/placement.py

bench-provision: install
	$(PY) bench/provision.py

bench-netagent: install
	$(PY) bench/netagent.py

bench-preempt: install
	$(PY) bench/preempt.py

bench-billing: install
	$(PY) bench/billing.py

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

$(VENV)/.installed: requirements.lock pyproject.toml sdk/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.lock
	$(PY) -m pip install -q --no-deps -e .
	$(PY) -m pip install -q --no-deps -e sdk
	touch $@

# A real KVM host for tests/compute/test_kvm_boot.py (run with KUMO_TEST_KVM=1; see README):
# QEMU and libvirtd, and Debian's kernel, which the test boots directly with a tiny initramfs
# it builds from busybox-static. Safe to repeat: only missing packages, accounts and folders
# are added and only daemons not running are started. Without systemd and udev, this does by
# hand what they would: /dev/kvm for group kvm, virtlogd before libvirtd.
KVM_APT_PACKAGES := libvirt-daemon libvirt-daemon-driver-qemu qemu-system-x86 libvirt-clients \
	linux-image-amd64 busybox-static

kvm-host:
	@test -c /dev/kvm || { echo "kvm-host: no /dev/kvm, this machine cannot run KVM guests" >&2; exit 1; }
	@missing=""; for p in $(KVM_APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq \
	    --no-install-recommends $$missing; \
	fi
	@getent group kvm >/dev/null || $(SUDO) groupadd -r kvm
	@getent group libvirt-qemu >/dev/null || $(SUDO) groupadd -r libvirt-qemu
	@getent passwd libvirt-qemu >/dev/null || $(SUDO) useradd -r -g libvirt-qemu \
	  -d /var/lib/libvirt -s /usr/sbin/nologin libvirt-qemu
	@id -nG libvirt-qemu | grep -qw kvm || $(SUDO) usermod -a -G kvm libvirt-qemu
	@$(SUDO) chgrp kvm /dev/kvm && $(SUDO) chmod 0660 /dev/kvm
	@$(SUDO) mkdir -p /var/log/libvirt/qemu /var/run/libvirt
	@pgrep -x virtlogd >/dev/null || { echo "starting virtlogd"; $(SUDO) virtlogd -d; }
	@pgrep -x libvirtd >/dev/null || { echo "starting libvirtd"; $(SUDO) libvirtd -d; }
	@for i in $$(seq 50); do \
	  $(SUDO) virsh -c qemu:///system version >/dev/null 2>&1 && break; sleep 0.2; \
	done; \
	$(SUDO) virsh -c qemu:///system version
	@ls /boot/vmlinuz-* /bin/busybox

# Re-pin after changing pyproject.toml: resolves the ranges afresh into requirements.lock.
lock:
	rm -rf /tmp/kumo-lock && $(PYTHON) -m venv /tmp/kumo-lock
	/tmp/kumo-lock/bin/pip install -q ".[dev]"
	/tmp/kumo-lock/bin/pip freeze --exclude kumo | grep -v '^-e' > requirements.lock
	rm -rf /tmp/kumo-lock

clean:
	rm -rf $(VENV) var
