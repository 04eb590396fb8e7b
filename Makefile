# Kumo's two entry points: `make run` (the whole topology on embedded defaults) and
# `make test` (the suite; on PostgreSQL and Redis when they answer on 127.0.0.1).
# Both install what they need first: Debian packages through apt-get when missing,
# a virtual environment in .venv, and the pinned Python dependencies of requirements.lock.
# `make kvm-host` makes this Debian machine a real host (libvirtd with QEMU: KVM where /dev/kvm
# works, QEMU's TCG elsewhere) and `make image` builds Kumo's Debian guest image (cached by its
# recipe); `make test` needs both, for the real-guest test (tests/e2e/test_real_guest.py).

PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
# chromium: the headless browser the portal tests drive through Playwright (never a
# browser Playwright downloads itself). nfs-ganesha, nfs-ganesha-vfs, rpcbind: the userspace NFS
# server the share tests export through (tests/storage/test_nfs_ganesha.py).
# xmlsec1: pysaml2 signs and verifies SAML messages and the federation metadata with it.
# dnsmasq-base: the project networks' resolvers (network.drivers.dns) and their tests.
# curl, jq, openssh-client: the README's tour, which tests/docs/test_readme_tour.py runs.
# redis-server: tests/e2e/test_broker_restart.py starts a private Redis on a free port and
# kills it (never the machine's own).
# gettext: msgfmt compiles the portal's translations (locale/*/LC_MESSAGES/django.po) into
# the .mo files Django reads; makemessages (xgettext, msgmerge) refreshes the catalogues.
APT_PACKAGES := libvirt-dev pkg-config iproute2 iputils-ping tcpdump nftables chromium \
	curl jq openssh-client redis-server nfs-ganesha nfs-ganesha-vfs rpcbind xmlsec1 dnsmasq-base \
	gettext
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: image image-file bench-boot run test docs lint bench-api bench-placement bench-provision bench-netagent bench-preempt bench-billing bench-reports sysdeps install kvm-host lock clean

run: install
	$(PY) manage.py run

test: install kvm-host image-file
	$(VENV)/bin/ruff check .
	$(PY) tests/run.py $(PYTEST_ARGS)

# The documentation site (docs/, mkdocs.yml) into site/, offline; --strict fails on a broken
# link or a page left out. tests/docs/test_site.py runs the same build in `make test`.
docs: install
	$(VENV)/bin/mkdocs build --strict --quiet

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

bench-reports: install
	$(PY) bench/reports.py

bench-boot: install kvm-host image-file
	$(PY) bench/boot.py

# Kumo's guest image (compute/imagebuild.py): Debian 12 from Debian's archive with
# mmdebstrap, a disk written without loop devices (mke2fs -d, mtools, SYSLINUX, sfdisk),
# cached in $KUMO_IMAGE_CACHE (default /var/cache/kumo/images for root) by the hash of its recipe.
# `image` also registers it as a public image (`make run` then offers it).
IMAGE_APT_PACKAGES := mmdebstrap qemu-utils e2fsprogs dosfstools mtools syslinux \
	syslinux-common fdisk

image-file: install
	@missing=""; for p in $(IMAGE_APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq \
	    --no-install-recommends $$missing; \
	fi
	$(SUDO) $(PY) manage.py image-build --no-register

image: image-file
	$(PY) manage.py migrate --no-input -v 0
	$(PY) manage.py image-build

# System packages: only what is missing is installed, so a prepared machine pays nothing.
sysdeps:
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi

# The portal's compiled translations: generated from the committed .po, never committed.
MO_FILES := $(patsubst %.po,%.mo,$(wildcard locale/*/LC_MESSAGES/django.po))

install: sysdeps $(VENV)/.installed $(MO_FILES)

locale/%/LC_MESSAGES/django.mo: locale/%/LC_MESSAGES/django.po $(VENV)/.installed | sysdeps
	$(PY) manage.py compilemessages -v 0 -l $* --ignore .venv --ignore var --ignore .git

$(VENV)/.installed: requirements.lock pyproject.toml sdk/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.lock
	$(PY) -m pip install -q --no-deps -e .
	$(PY) -m pip install -q --no-deps -e sdk
	touch $@

# A real host: QEMU and libvirtd (KVM where /dev/kvm works, else QEMU's TCG), and Debian's
# kernel and busybox-static for the opt-in tests/compute/test_kvm_boot.py. Safe to repeat:
# only missing packages, accounts and folders are added and only daemons not running are
# started. Without systemd and udev, this does by hand what they would: /dev/kvm for group
# kvm, virtlogd before libvirtd. See docs/operator/real-hosts.md and docs/operator/hosts.md.
KVM_APT_PACKAGES := libvirt-daemon libvirt-daemon-driver-qemu qemu-system-x86 libvirt-clients \
	linux-image-amd64 busybox-static

kvm-host:
	@test -c /dev/kvm || echo "kvm-host: no /dev/kvm, guests will run on QEMU's TCG" >&2
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
	@if [ -c /dev/kvm ]; then $(SUDO) chgrp kvm /dev/kvm && $(SUDO) chmod 0660 /dev/kvm; fi
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
	rm -rf $(VENV) var site
