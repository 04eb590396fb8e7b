"""Loaded into the controllers of ``bench/reports.py`` (``celery worker --include``): for every
agent report handled, the time from the agent's ``sent_at`` to the end of its handling,
pushed to the bench's Redis. Nothing else of the controller changes."""

import json
import os
import time
from datetime import datetime

import redis
from celery.signals import task_postrun

from controlplane.broker import AGENT_REPORT_TASK

_redis = redis.Redis.from_url(os.environ["KUMO_BENCH_REPORTS_REDIS"])
KEY = "kumo-bench-reports:done"


@task_postrun.connect
def _handled(sender=None, kwargs=None, **_):
    if getattr(sender, "name", "") != AGENT_REPORT_TASK or not kwargs:
        return
    done = time.time()
    sent = datetime.fromisoformat(kwargs["sent_at"]).timestamp()
    _redis.rpush(KEY, json.dumps({"done": done, "latency_s": done - sent}))
