"""The WSGI entry point loads every view as a worker starts (``controlplane.wsgi``)."""

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
