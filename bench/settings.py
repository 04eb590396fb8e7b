"""Kumo's settings with ``bench.urls`` as the URLconf: what ``bench/api.py`` serves."""

from controlplane.settings import *  # noqa: F403

ROOT_URLCONF = "bench.urls"
