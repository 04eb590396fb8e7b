"""The WSGI entry point loads every view and the broker's transport as a worker starts
(``controlplane.wsgi``)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_worker_has_its_views_loaded_before_its_first_request():
    probe = (
        "import sys; import controlplane.wsgi; "
        "print(all(m in sys.modules for m in "
        "('controlplane.urls', 'compute.api.views', 'tenants.api.views')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "True", out.stdout + out.stderr


def test_a_worker_has_its_brokers_transport_loaded_before_its_first_publish():
    """The transport's code, not a connection: the broker named here does not answer."""
    probe = (
        "import sys; import controlplane.wsgi; "
        "print('controlplane.redis_transport' in sys.modules, 'redis.client' in sys.modules)"
    )
    env = {**os.environ, "CELERY_BROKER_URL": "redis://127.0.0.1:9/0"}
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "True True", out.stdout + out.stderr
