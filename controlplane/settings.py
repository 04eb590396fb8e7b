"""Kumo's settings, all read from the environment with embedded defaults.

Every setting says who reads it and what values it takes. With nothing set, Kumo runs on a
SQLite file and a filesystem broker under ``var/``: no server needed. Production sets
``DATABASE_URL=postgres://…`` and ``CELERY_BROKER_URL=redis://…`` and the same code runs.
The host agent does not read this module: it has its own small configuration
(``controlplane/agent/config.py``) with no database and no secret key.
"""

import json
import os
import secrets
from pathlib import Path

import dj_database_url

from controlplane.broker import CONTROL_QUEUE, EMBEDDED_BROKER_URL, transport_options

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name: str, default: bool = False) -> bool:
    return os.environ.get(name, str(default)).strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


# KUMO_VAR_DIR: where the embedded defaults keep their state (SQLite file, broker folders,
# generated secret key, beat schedule). Read by this module and by `manage.py run`.
VAR_DIR = Path(os.environ.get("KUMO_VAR_DIR", BASE_DIR / "var")).resolve()
VAR_DIR.mkdir(parents=True, exist_ok=True)


def _secret_key() -> str:
    """SECRET_KEY from the environment, else one generated once into var/secret_key."""
    if key := os.environ.get("SECRET_KEY"):
        return key
    path = VAR_DIR / "secret_key"
    if not path.exists():
        # Written whole under a name of this process's own, then linked into place: the link
        # fails if another process won, so processes starting at once agree on one key, and
        # none ever reads a key half written.
        partial = path.with_name(f".secret_key.{os.getpid()}")
        partial.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(50))
        try:
            os.link(partial, path)
        except FileExistsError:
            pass
        finally:
            partial.unlink()
    return path.read_text().strip()


# SECRET_KEY: signs sessions and CSRF tokens. Set it in production; unset, a random key is
# generated into var/secret_key on first start and kept.
SECRET_KEY = _secret_key()

# DEBUG: "1" only on a developer's machine; off unless asked.
DEBUG = env_bool("DEBUG")

# ALLOWED_HOSTS: comma-separated host names the web process answers to.
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver")

# CSRF_TRUSTED_ORIGINS: comma-separated origins (https://kumo.example.ac.jp) allowed to post
# forms when Kumo sits behind a TLS-terminating proxy.
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI served by Kumo itself: /api/docs/ works offline
    "axes",
    "django_prometheus",
    "controlplane",
    "tenants",
    "compute",
    "network",
    "storage",
    "tenants.federation",
    "django_otp",
    "django_otp.plugins.otp_totp",
    "django_otp.plugins.otp_static",
]

MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "controlplane.api.errors.RefuseTraceMiddleware",  # TRACE/CONNECT: 405 everywhere
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    # The portal's language: the django_language cookie (the portal's language switch), else
    # the browser's Accept-Language, else LANGUAGE_CODE; the API stays English.
    "controlplane.portal.locale.PortalLocaleMiddleware",
    # The portal's times in the reader's time zone (the kumo_tz cookie its script sets from
    # the browser), else TIME_ZONE; the API stays UTC.
    "controlplane.portal.locale.PortalTimezoneMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # SAML login state (djangosaml2) in a cookie of its own, and the second factor.
    "djangosaml2.middleware.SamlSessionMiddleware",
    "django_otp.middleware.OTPMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "controlplane.portal.views.auth.RequireSecondFactorMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "controlplane.audit.AuditContextMiddleware",
    # Last, as django-axes asks: it turns a lock-out into a response.
    "axes.middleware.AxesMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]

ROOT_URLCONF = "controlplane.urls"
WSGI_APPLICATION = "controlplane.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "controlplane" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# DATABASE_URL: postgres://user:pass@host:5432/name in production and CI; unset, a SQLite
# file var/kumo.sqlite3. SQLite runs in WAL mode with IMMEDIATE transactions, so a write
# transaction takes the write lock at BEGIN and concurrent writers queue instead of failing.
DATABASE_URL = os.environ.get("DATABASE_URL") or f"sqlite:///{VAR_DIR / 'kumo.sqlite3'}"
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
else:
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    if env_bool("KUMO_DATABASE_PREPARED", True):
        # Values bound by PostgreSQL, not written into the text, and each statement the
        # connection runs a fifth time kept prepared on it (psycopg's statement cache): the
        # ORM sends the same few hundred statements over and over, and PostgreSQL would
        # parse and plan each again. Off (0) behind a pooler that shares one server
        # connection among clients by transaction, which cannot keep statements prepared.
        # (The engine is Django's, with what a statement of over 65,535 values needs.)
        DATABASES["default"]["ENGINE"] = "controlplane.postgresql"
        DATABASES["default"]["OPTIONS"] = {
            **DATABASES["default"].get("OPTIONS", {}),  # DATABASE_URL's own: sslmode, ...
            "server_side_binding": True,
            "prepare_threshold": 5,
        }
# DATABASE_TEST_NAME: name of the throwaway database the test suite creates. On SQLite it is a
# file under KUMO_VAR_DIR (test_kumo.sqlite3 when unset, never Django's in-memory default), so
# that the processes the end-to-end tests start (web, controller, agents) open it too.
test_name = os.environ.get("DATABASE_TEST_NAME")
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    test_name = str(VAR_DIR / f"{test_name or 'test_kumo'}.sqlite3")
if test_name:
    DATABASES["default"]["TEST"] = {"NAME": test_name}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
AUTH_USER_MODEL = "tenants.User"

AUTHENTICATION_BACKENDS = [
    # First, so a locked-out username/address never reaches the password check.
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LOGIN_URL = "portal:login"
LOGIN_REDIRECT_URL = "portal:home"
LOGOUT_REDIRECT_URL = "portal:login"

# Failed-login throttling (django-axes): KUMO_LOGIN_FAILURE_LIMIT failures for one username
# from one address lock that pair out for KUMO_LOGIN_COOLOFF_MINUTES.
AXES_FAILURE_LIMIT = int(os.environ.get("KUMO_LOGIN_FAILURE_LIMIT", "5"))
AXES_COOLOFF_TIME = int(os.environ.get("KUMO_LOGIN_COOLOFF_MINUTES", "15")) / 60
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "controlplane.api.errors.login_locked_out"
AXES_VERBOSE = False
# KUMO_TRUSTED_PROXY_COUNT: how many reverse proxies put addresses in X-Forwarded-For; the
# client address for audit and throttling is taken that many hops from the right. 0 trusts
# none and uses the socket address.
TRUSTED_PROXY_COUNT = int(os.environ.get("KUMO_TRUSTED_PROXY_COUNT", "0"))
AXES_CLIENT_IP_CALLABLE = "controlplane.audit.client_ip"

# The portal speaks English (the default, and the text of its msgids) and Japanese
# (locale/ja/LC_MESSAGES/django.po; the .mo is compiled by `make install` and by the test
# suite). Read by PortalLocaleMiddleware and the portal's language switch (set_language).
LANGUAGE_CODE = "en"
LANGUAGES = [("en", "English"), ("ja", "日本語")]
LOCALE_PATHS = [BASE_DIR / "locale"]
TIME_ZONE = os.environ.get("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATIC_ROOT.mkdir(exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
# Served by whitenoise straight from the apps in development and tests.
WHITENOISE_USE_FINDERS = True

SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SECURE = env_bool("KUMO_SECURE_COOKIES")
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenants.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "controlplane.api.pagination.Pagination",
    "DEFAULT_FILTER_BACKENDS": [
        "controlplane.api.filters.FilterBackend",
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_SCHEMA_CLASS": "controlplane.api.schema.KumoAutoSchema",
    "EXCEPTION_HANDLER": "controlplane.api.errors.exception_handler",
    "DEFAULT_RENDERER_CLASSES": [
        "controlplane.api.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Kumo API",
    "DESCRIPTION": "The control plane of a multi-tenant research cloud.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SCHEMA_PATH_PREFIX": "/api/v1",
    "COMPONENT_SPLIT_REQUEST": True,
    # /api/docs/ loads Swagger UI from Kumo's static files (drf-spectacular-sidecar), never
    # from a CDN: the page works on a network without internet access.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "controlplane.api.schema.postprocess_no_nul",
    ],
    "ENUM_NAME_OVERRIDES": {
        "RoleEnum": "tenants.choices.Role",
        "DeviceKindEnum": "compute.choices.DeviceKind",
        "NetworkKindEnum": "network.choices.NetworkKind",
        "ConnectionKindEnum": "network.choices.ConnectionKind",
        "ProtocolEnum": "network.choices.Protocol",
        "ForwardProtocolEnum": "network.choices.ForwardProtocol",
    },
}

# --- Celery (read by controlplane/celery.py) -----------------------------------------------
# CELERY_BROKER_URL: redis://host:6379/0 or amqp://… in production; unset, kombu's
# filesystem transport under var/broker, which needs no server.
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL") or EMBEDDED_BROKER_URL
CELERY_BROKER_TRANSPORT_OPTIONS = transport_options(CELERY_BROKER_URL, VAR_DIR)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_DEFAULT_QUEUE = CONTROL_QUEUE
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
# CELERY_TASK_ALWAYS_EAGER: "1" runs control tasks in the calling process (some tests).
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER")
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")

# KUMO_HEARTBEAT_TIMEOUT_S: a host whose agent has not been heard from for this long is
# marked down. Read by the controller's periodic host check.
HOST_HEARTBEAT_TIMEOUT_S = int(os.environ.get("KUMO_HEARTBEAT_TIMEOUT_S", "60"))
# KUMO_OPERATION_DEADLINE_S: an operation still pending or running this long after it was
# created is marked failed by the reaper ("stuck"). Read by controlplane.tasks.
OPERATION_DEADLINE_S = int(os.environ.get("KUMO_OPERATION_DEADLINE_S", "900"))
# --- Compute (read by compute.placement, compute.services) ----------------------------------
# KUMO_SCHEDULER_VIEW_TTL_S: how long a process keeps its in-memory view of the hosts before
# reloading it. Staleness costs only retries: every claim re-checks in the database.
SCHEDULER_VIEW_TTL_S = float(os.environ.get("KUMO_SCHEDULER_VIEW_TTL_S", "10"))
# KUMO_SCHEDULE_ON_RELEASE_S: capacity freed (a VM deleted, shelved, or stopped by its
# eviction) asks for a scheduling pass this many seconds after its commit, so a waiting VM
# takes it then, not at beat's next pass (every 15 s); releases within that time share the
# pass. 0 turns it off (beat's pass alone).
SCHEDULE_ON_RELEASE_S = float(os.environ.get("KUMO_SCHEDULE_ON_RELEASE_S", "1"))
# KUMO_SCHEDULER_FRESH_AFTER_S: a decision that finds no room looks again on a fresh view
# only if its view is older than this (seconds; 0, the default: always). The replay, one
# process whose view follows every change it makes, sets it high.
SCHEDULER_FRESH_AFTER_S = float(os.environ.get("KUMO_SCHEDULER_FRESH_AFTER_S", "0"))
# KUMO_GPU_HOST_CPU_RESERVE: the share (0 to 1) of a GPU host's vCPUs and memory per GPU
# that each free GPU keeps from CPU VMs (compute.scheduler.gpu_reserve_filter): 1 (the
# default) means CPU VMs only use what GPU VMs left spare, so no GPU is stranded; 0 lets
# CPU VMs take anything. Held back only while some CPU host is up (a fleet of GPU hosts
# only has nowhere else for CPU VMs).
GPU_HOST_CPU_RESERVE = float(os.environ.get("KUMO_GPU_HOST_CPU_RESERVE", "1"))
# KUMO_SCHEDULER_SAMPLE: how many hosts that pass the filters are weighed per decision.
SCHEDULER_SAMPLE = int(os.environ.get("KUMO_SCHEDULER_SAMPLE", "16"))
# Where a scheduler starts among equally good GPU hosts is random (None): concurrent
# processes then fill different hosts. The replay seeds it, so that one trace replayed twice
# gives the same figures. Not an environment setting: processes seeded alike collide.
SCHEDULER_SEED: int | None = None
# KUMO_VM_STOP_GRACE_S: seconds a guest has to shut down when stopped before it is forced off.
VM_STOP_GRACE_S = float(os.environ.get("KUMO_VM_STOP_GRACE_S", "60"))
# KUMO_VM_OPERATION_DEADLINE_S: a VM provisioning, starting, stopping or rebooting this long
# without an answer from its host is given up (provisioning: state error).
VM_OPERATION_DEADLINE_S = int(os.environ.get("KUMO_VM_OPERATION_DEADLINE_S", "600"))
# KUMO_CONSOLE_LOG_WAIT_S: how long GET .../vms/<id>/console-log waits for the VM's host
# to answer (compute.api.views) before it answers 202 with the operation to poll instead;
# a web worker is held that long at most. Default 3.
CONSOLE_LOG_WAIT_S = float(os.environ.get("KUMO_CONSOLE_LOG_WAIT_S", "3"))
# --- The interactive serial console (compute.services.consoles, compute.consoleproxy) -------
# KUMO_CONSOLE_TOKEN_TTL_S: seconds a console token (POST .../vms/<id>/console/) may be
# used to connect; a token connects once. The session itself lasts as long as it is open.
CONSOLE_TOKEN_TTL_S = int(os.environ.get("KUMO_CONSOLE_TOKEN_TTL_S", "60"))
# KUMO_CONSOLE_PROXY_BIND: host:port the console proxy (manage.py console-proxy) listens on.
CONSOLE_PROXY_BIND = os.environ.get("KUMO_CONSOLE_PROXY_BIND", "127.0.0.1:6083")
# KUMO_CONSOLE_PROXY_URL: the proxy's websocket URL as browsers and the CLI reach it (ws://
# or wss:// behind a TLS-terminating reverse proxy); the API's answer is this ?token=....
CONSOLE_PROXY_URL = os.environ.get(
    "KUMO_CONSOLE_PROXY_URL", f"ws://{CONSOLE_PROXY_BIND.replace('0.0.0.0', '127.0.0.1')}/"
)
# KUMO_CONSOLE_LIBVIRT_URI: how the proxy reaches a host's libvirt, with {host} for the
# Kumo host name (qemu+tls://{host}.mgmt.example.ac.jp/system). Empty (the default): the
# URI the host's agent reports (qemu:///system: proxy and agent on one machine).
CONSOLE_LIBVIRT_URI = os.environ.get("KUMO_CONSOLE_LIBVIRT_URI", "")
# KUMO_CONSOLE_ALLOWED_ORIGINS: comma-separated host names a browser's websocket Origin may
# have, besides ALLOWED_HOSTS (the portal's own names). A client sending no Origin (the
# CLI, scripts) is let through: the token is what authenticates.
CONSOLE_ALLOWED_ORIGINS = env_list("KUMO_CONSOLE_ALLOWED_ORIGINS")
# KUMO_RECONCILE_GRACE_S: a VM changed less than this long ago is not drift yet (its work may
# still be on the way); older ones whose guest is missing or behind get their work again.
RECONCILE_GRACE_S = float(os.environ.get("KUMO_RECONCILE_GRACE_S", "5"))
# KUMO_ORPHAN_GRACE_S: a guest no VM accounts for is destroyed after it was seen this long.
ORPHAN_GRACE_S = int(os.environ.get("KUMO_ORPHAN_GRACE_S", "300"))
# KUMO_VM_APPLY_TTL_S: a host ignores a VM's work (define, start, stop) this many seconds after
# it was sent (a message redelivered late by the broker); the reconcile sends what is still
# wanted afresh. Removals never expire. Hosts' clocks must agree with the controller's (NTP).
VM_APPLY_TTL_S = float(os.environ.get("KUMO_VM_APPLY_TTL_S", "900"))

# KUMO_SHELVE_STORE: the directory where shelved VMs' root disks are kept, at the same path
# on every host (the image store's file system or a shared pool); read by
# compute.services.shelve, which names each kept disk <store>/<vm id>.qcow2.
SHELVE_STORE = os.environ.get("KUMO_SHELVE_STORE", "/var/lib/kumo/shelved")

# --- Spot and reclamation (read by compute.services.spot, compute.services.reclaim) --------
# KUMO_SPOT_STOP_GRACE_S: once a spot VM's eviction notice ends (each template sets its
# notice, 30 s by default), seconds its guest has to shut down before it is forced off.
SPOT_STOP_GRACE_S = float(os.environ.get("KUMO_SPOT_STOP_GRACE_S", "10"))
# KUMO_SPOT_EVICTION_COST_S: what each GPU of an evicted spot VM costs beyond the work it
# loses since its last checkpoint, in seconds of that GPU: the rest of its notice, its stop,
# its boot when started again. Preemption evicts the spot VMs that waste the fewest
# GPU-seconds (compute.preemption): a larger cost frees fewer GPUs beyond the request, at
# the price of more work lost.
SPOT_EVICTION_COST_S = float(os.environ.get("KUMO_SPOT_EVICTION_COST_S", "120"))
# KUMO_SPOT_NOTICE_STRETCH_S: how much longer than its template's a victim's notice may be
# made to wait for the save its guest is expected to make just after the notice would end
# (from the checkpoints it reported): the on-demand request waits up to this much longer,
# and the spot work since that guest's last save is kept. 0 never waits for a save.
SPOT_NOTICE_STRETCH_S = float(os.environ.get("KUMO_SPOT_NOTICE_STRETCH_S", "45"))
# KUMO_SPOT_REAP_S: how often beat stops the spot VMs whose notice has ended (seconds; a
# notice may run over by up to this much).
SPOT_REAP_S = float(os.environ.get("KUMO_SPOT_REAP_S", "5"))
# KUMO_METADATA_URL: the metadata endpoint as guests reach it over their network, written
# into each guest's /etc/kumo/metadata.env with its token (read by compute.services.vms).
METADATA_URL = os.environ.get("KUMO_METADATA_URL", "http://127.0.0.1:8000/api/v1/metadata")
# KUMO_LEASE_LEAD_S: how long before its start a lease takes hold of its GPUs and gives the
# spot VMs on them their notice, and before its end its project is told which VMs will be
# shelved (seconds; longer than any template's eviction notice plus KUMO_SPOT_STOP_GRACE_S,
# so the GPUs are free at the start). KUMO_LEASE_MAX_DAYS: the longest lease.
# KUMO_LEASE_TICK_S: how often beat moves leases on (compute.services.leases).
LEASE_LEAD_S = float(os.environ.get("KUMO_LEASE_LEAD_S", "900"))
LEASE_MAX_DAYS = int(os.environ.get("KUMO_LEASE_MAX_DAYS", "92"))
LEASE_TICK_S = float(os.environ.get("KUMO_LEASE_TICK_S", "30"))
# KUMO_RECLAIM_INTERVAL_S: how often beat runs reclamation (seconds).
RECLAIM_INTERVAL_S = float(os.environ.get("KUMO_RECLAIM_INTERVAL_S", "300"))
# KUMO_RECLAIM_EXPIRED_NOTICE_S: a running VM of a project past its end date is stopped this
# long after reclamation announced it (default one day).
RECLAIM_EXPIRED_NOTICE_S = int(os.environ.get("KUMO_RECLAIM_EXPIRED_NOTICE_S", "86400"))
# KUMO_RECLAIM_EXPIRED_GRACE_S: its stopped VMs are deleted this long after they stopped (or
# after the announcement, for VMs not running then; default 30 days).
RECLAIM_EXPIRED_GRACE_S = int(os.environ.get("KUMO_RECLAIM_EXPIRED_GRACE_S", str(30 * 86400)))
# KUMO_IDLE_AFTER_S: a running VM whose CPU use stayed below KUMO_IDLE_CPU_PERCENT this long
# is warned, then stopped KUMO_IDLE_WARNING_S later unless busy again; 0 turns it off
# (default 7 days, warning 1 day).
IDLE_AFTER_S = int(os.environ.get("KUMO_IDLE_AFTER_S", str(7 * 86400)))
IDLE_WARNING_S = int(os.environ.get("KUMO_IDLE_WARNING_S", "86400"))
# KUMO_IDLE_CPU_PERCENT: CPU use (percent of the VM's vCPUs, between two guests reports) at
# or above which a VM counts as busy. An idle Linux guest uses well under 1 %.
IDLE_CPU_PERCENT = float(os.environ.get("KUMO_IDLE_CPU_PERCENT", "2"))

# --- Images (read by compute.services.images) ---------------------------------------------
# KUMO_IMAGE_STORE: where images' bytes live: "dir" (default) keeps them under
# KUMO_IMAGE_STORE_DIR (default <var>/images); "s3" keeps them in the bucket
# KUMO_IMAGE_STORE_BUCKET (default kumo-images) on the object store named by
# KUMO_OBJECT_STORE_ENDPOINT with its administrator's credentials (below), and hosts fetch
# them by presigned URL. Only the web process writes the store; agents never hold its keys.
IMAGE_STORE = {
    "kind": os.environ.get("KUMO_IMAGE_STORE", "dir"),
    "dir": os.environ.get("KUMO_IMAGE_STORE_DIR") or str(VAR_DIR / "images"),
    "bucket": os.environ.get("KUMO_IMAGE_STORE_BUCKET", "kumo-images"),
}
# KUMO_IMAGE_FETCH_BASE_URL: with the "dir" store, how hosts fetch an image: empty (default)
# means hosts read the store's directory themselves (file:// URLs: one machine, as `make
# run`, or a shared mount); a URL (the web process as hosts reach it, e.g.
# http://10.0.0.1:8000) means hosts GET <url>/api/v1/image-files/<signed token>, streamed
# by the web process from the store.
IMAGE_FETCH_BASE_URL = os.environ.get("KUMO_IMAGE_FETCH_BASE_URL", "").rstrip("/")
# KUMO_IMAGE_URL_TTL_S: how long the URL a host gets to fetch an image stays valid (seconds).
IMAGE_URL_TTL_S = int(os.environ.get("KUMO_IMAGE_URL_TTL_S", "3600"))
# KUMO_IMAGE_MAX_BYTES: the largest image an upload may store (bytes; default 64 GiB);
# larger uploads are refused (413) and leave nothing in the store.
IMAGE_MAX_BYTES = int(os.environ.get("KUMO_IMAGE_MAX_BYTES", str(64 << 30)))

# --- Network (read by network.allocation, network.services, network.desired) ---------------
# KUMO_VNI_RANGE: the VXLAN network identifiers tenant networks get, "first-last" within
# 1..16777215. Exhaustion answers 409. Hosts give each network its own conntrack zone,
# which has 16 bits: a range wider than 65535 VNIs lets two networks share one.
VNI_RANGE = tuple(int(v) for v in os.environ.get("KUMO_VNI_RANGE", "10000-65000").split("-", 1))
# KUMO_UNDERLAY_MTU: the underlay's MTU; tenant networks get it less the VXLAN overhead
# (1450 on 1500, 8950 on a 9000 jumbo underlay).
UNDERLAY_MTU = int(os.environ.get("KUMO_UNDERLAY_MTU", "1500"))
# KUMO_MAC_PREFIX: the first three octets of the MACs Kumo gives ports (locally
# administered unicast: the second hex digit is 2, 6, a or e).
MAC_PREFIX = os.environ.get("KUMO_MAC_PREFIX", "02:4b:55")
# KUMO_DNS_DOMAIN: the parent domain of the projects' names: VM <vm> of project <slug>
# resolves as <vm>.<slug>.<domain> (and as <vm> through the guests' search domain) at its
# network's resolver (network.dns, network.desired). Default "internal" (ICANN keeps
# .internal for private use). KUMO_DNS_UPSTREAM: comma-separated IPv4 servers the
# networks' resolvers forward every other name to; empty (default): the nameservers of the
# gateway host's /etc/resolv.conf, loopback ones left out.
DNS_DOMAIN = os.environ.get("KUMO_DNS_DOMAIN", "internal").strip(".").lower()
DNS_UPSTREAM = tuple(
    s.strip() for s in os.environ.get("KUMO_DNS_UPSTREAM", "").split(",") if s.strip()
)
# KUMO_NETWORK_SYNC_S: how often the controller re-sends desired state to hosts that have
# not reported it applied (a lost message or a restarted agent).
NETWORK_SYNC_S = float(os.environ.get("KUMO_NETWORK_SYNC_S", "30"))

# --- Storage (read by storage.services) -------------------------------------------------------
# KUMO_SHARE_<TIER>: where projects' shares of tier fast (Lustre on NVMe, /fast in guests) or
# large (Lustre on HDD, /large) live, as "backend:host:source": backend lustre or nfs, the
# agent host that serves the tier (its KUMO_SHARES names the same tier), and the mount
# source prefix guests mount from (a Lustre "10.0.0.1@o2ib:/fast" or an NFS
# "nfs.example:/srv/kumo/fast/exports"). A tier left unset offers no shares (409).
SHARE_TIERS = {
    tier: dict(zip(("backend", "host", "source"), value.split(":", 2), strict=True))
    for tier in ("fast", "large")
    if (value := os.environ.get(f"KUMO_SHARE_{tier.upper()}", "")).count(":") >= 2
}
# KUMO_SHARE_PROJECT_ID_BASE: the first Lustre project id (and NFS fsid) given to shares.
SHARE_PROJECT_ID_BASE = int(os.environ.get("KUMO_SHARE_PROJECT_ID_BASE", "100000"))
# KUMO_SHARE_SYNC_S: how often every share is sent to its host again (repairs drift, and
# the answer refreshes its usage).
SHARE_SYNC_S = float(os.environ.get("KUMO_SHARE_SYNC_S", "300"))
# KUMO_OBJECT_STORE: the S3-compatible service buckets live on: s3iam (S3 + IAM, as moto's
# server offers) or rgw (Ceph RGW's admin API); empty, object storage is not offered (409).
# KUMO_OBJECT_STORE_ENDPOINT / _ACCESS_KEY / _SECRET_KEY / _REGION: its URL (also what
# clients use) and an admin's credentials.
OBJECT_STORE = {
    "kind": os.environ.get("KUMO_OBJECT_STORE", ""),
    "endpoint": os.environ.get("KUMO_OBJECT_STORE_ENDPOINT", ""),
    "access_key": os.environ.get("KUMO_OBJECT_STORE_ACCESS_KEY", ""),
    "secret_key": os.environ.get("KUMO_OBJECT_STORE_SECRET_KEY", ""),
    "region": os.environ.get("KUMO_OBJECT_STORE_REGION", "us-east-1"),
}
# KUMO_BUCKET_USAGE_S: how often the controller reads every bucket's usage.
BUCKET_USAGE_S = float(os.environ.get("KUMO_BUCKET_USAGE_S", "3600"))

# KUMO_EMAIL_BACKEND: how event mail leaves (read by Django's send_mail via
# controlplane.events): smtp (with EMAIL_HOST, EMAIL_PORT, EMAIL_HOST_USER,
# EMAIL_HOST_PASSWORD, EMAIL_USE_TLS) or console (default: printed in the controller's log).
EMAIL_BACKEND = {
    "smtp": "django.core.mail.backends.smtp.EmailBackend",
    "console": "django.core.mail.backends.console.EmailBackend",
}[os.environ.get("KUMO_EMAIL_BACKEND", "console")]
EMAIL_HOST = os.environ.get("EMAIL_HOST", "localhost")
EMAIL_PORT = int(os.environ.get("EMAIL_PORT", "25"))
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS")
# KUMO_FROM_EMAIL: the sender of Kumo's mail.
DEFAULT_FROM_EMAIL = os.environ.get("KUMO_FROM_EMAIL", "kumo@localhost")
# KUMO_WEBHOOK_ALLOWED_NETWORKS: comma-separated CIDR ranges webhooks may reach although
# they are not public (read by controlplane.egress when a webhook is saved and at every
# delivery), e.g. "10.20.0.0/16,fd00:20::/48" for receivers on a campus network. Empty
# (default): only public addresses; loopback, link-local, private, unique-local, multicast,
# unspecified and reserved addresses are refused.
WEBHOOK_ALLOWED_NETWORKS = tuple(
    n.strip() for n in os.environ.get("KUMO_WEBHOOK_ALLOWED_NETWORKS", "").split(",") if n.strip()
)

# --- Federated login and second factor (read by tenants.federation, tenants.mfa) -----------
# KUMO_BASE_URL: the public URL of the web process as browsers reach it; the SAML SP's
# entity id, its assertion consumer service and the OIDC redirect URIs derive from it.
KUMO_BASE_URL = os.environ.get("KUMO_BASE_URL", "http://127.0.0.1:8000")
# KUMO_SAML_METADATA_URL: the federation's metadata aggregate (https://… or a file path),
# e.g. GakuNin's https://metadata.gakunin.nii.ac.jp/gakunin-metadata.xml. Empty: no SAML.
SAML_METADATA_URL = os.environ.get("KUMO_SAML_METADATA_URL", "")
# KUMO_SAML_FEDERATION_CERT: PEM file of the certificate the aggregate must be signed with.
SAML_FEDERATION_CERT = os.environ.get("KUMO_SAML_FEDERATION_CERT", "")
# KUMO_SAML_METADATA_REFRESH_S: how often beat fetches the aggregate again.
SAML_METADATA_REFRESH_S = float(os.environ.get("KUMO_SAML_METADATA_REFRESH_S", "3600"))
SAML_METADATA_TIMEOUT_S = float(os.environ.get("KUMO_SAML_METADATA_TIMEOUT_S", "60"))
# KUMO_SAML_ENTITY_ID: the SP's entity id (default <KUMO_BASE_URL>/saml2/metadata/).
SAML_ENTITY_ID = os.environ.get("KUMO_SAML_ENTITY_ID", "")
# KUMO_SAML_SP_KEY / KUMO_SAML_SP_CERT: the SP's key pair (PEM files); unset, one is made
# once under var/saml/ (register its certificate with the federation).
SAML_SP_KEY = os.environ.get("KUMO_SAML_SP_KEY", "")
SAML_SP_CERT = os.environ.get("KUMO_SAML_SP_CERT", "")
SAML_SP_NAME = os.environ.get("KUMO_SAML_SP_NAME", "Kumo research cloud")
SAML_SP_CONTACT = os.environ.get("KUMO_SAML_SP_CONTACT", "kumo-admin@localhost")
# KUMO_SAML_SUBJECT_ATTRIBUTE: the attribute that is the stable subject of a person:
# eduPersonPrincipalName (default), eduPersonTargetedID, subject-id, pairwise-id, or
# name_id (a persistent NameID).
SAML_SUBJECT_ATTRIBUTE = os.environ.get("KUMO_SAML_SUBJECT_ATTRIBUTE", "eduPersonPrincipalName")
# KUMO_SAML_ACCEPTED_TIME_DIFF_S: clock skew allowed with IdPs (seconds).
SAML_ACCEPTED_TIME_DIFF_S = int(os.environ.get("KUMO_SAML_ACCEPTED_TIME_DIFF_S", "60"))
SAML_XMLSEC_BINARY = os.environ.get("KUMO_XMLSEC_BINARY", "/usr/bin/xmlsec1")
# djangosaml2's own settings: the config comes from the stored aggregate.
SAML_CONFIG_LOADER = "tenants.federation.metadata.sp_config"
SAML_SESSION_COOKIE_NAME = "kumo_saml_session"
# The IdP posts its response cross-site: over https the SAML cookie must be SameSite=None.
SAML_SESSION_COOKIE_SAMESITE = "None" if env_bool("KUMO_SECURE_COOKIES") else "Lax"
SAML_IGNORE_AUTHENTICATED_USERS_ON_LOGIN = True
SAML_DEFAULT_BINDING = "urn:oasis:names:tc:SAML:2.0:bindings:HTTP-Redirect"
SAML_CSP_HANDLER = ""  # the portal sets no CSP of its own yet
# KUMO_OIDC_PROVIDERS: JSON list of OpenID Connect providers, each
# {"name": "orthros", "label": "Orthros", "issuer": "https://…", "client_id": "…",
#  "client_secret": "…", "scopes": "openid email profile", "subject_claim": "sub"}.
# The redirect URI to register is <KUMO_BASE_URL>/oidc/<name>/callback/.
OIDC_PROVIDERS = json.loads(os.environ.get("KUMO_OIDC_PROVIDERS", "[]") or "[]")
# KUMO_REQUIRE_TOTP: who must use a second factor with a password login: "" (nobody is
# forced; anyone may enrol), "staff" (operators) or "password" (everyone with a password).
# Federated logins rely on their identity provider; API tokens are unchanged.
REQUIRE_TOTP = os.environ.get("KUMO_REQUIRE_TOTP", "")
OTP_TOTP_ISSUER = os.environ.get("KUMO_TOTP_ISSUER", "Kumo")
# KUMO_TOTP_FAILURE_LIMIT: wrong codes in a row before a second-factor login waits
# (django-otp's throttle doubles the wait with each further failure).
OTP_TOTP_THROTTLE_FACTOR = 1
OTP_STATIC_THROTTLE_FACTOR = 1
# KUMO_INVITATION_DAYS: how long an invitation can be accepted.
INVITATION_DAYS = int(os.environ.get("KUMO_INVITATION_DAYS", "14"))
# KUMO_INVITATION_ANY_ADDRESS: "1" lets a logged-in user accept an invitation sent to an
# address other than their own; unset, the invited address must be the user's.
INVITATION_ANY_ADDRESS = env_bool("KUMO_INVITATION_ANY_ADDRESS")

# KUMO_IDEMPOTENCY_TTL_H: how long a stored Idempotency-Key response is replayed.
IDEMPOTENCY_TTL_H = int(os.environ.get("KUMO_IDEMPOTENCY_TTL_H", "24"))
# KUMO_SELF_SERVICE_PROJECTS: "1" lets any user create a project (they become its owner);
# unset, projects are created by operators, as research clouds approve them.
SELF_SERVICE_PROJECTS = env_bool("KUMO_SELF_SERVICE_PROJECTS")

# KUMO_DEFAULT_QUOTA_*: the quota a new project starts with (operators change it later).
DEFAULT_QUOTA = {
    field: int(os.environ.get(f"KUMO_DEFAULT_QUOTA_{field.upper()}", default))
    for field, default in {
        "vcpus": 64,
        "memory_gib": 256,
        "gpus": 8,
        "vms": 16,
        "networks": 4,
        "global_ips": 2,
        "storage_gib": 1024,
        "buckets": 4,
    }.items()
}

# PROMETHEUS_MULTIPROC_DIR (read by prometheus_client): a folder shared by the web workers
# and Celery workers of one machine so /metrics sums all of them. `manage.py run` sets it.
PROMETHEUS_EXPORT_MIGRATIONS = False

# KUMO_LOG_LEVEL: INFO by default; DEBUG for more.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("KUMO_LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "INFO"}},
}
