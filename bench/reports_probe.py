"""Loaded into the controllers of ``bench/reports.py`` (``celery worker --include``): for every
agent message handled, the time from the agent's ``sent_at`` to the end of its handling and
how many reports it carried (a bundle's, else one), pushed to the bench's Redis. Nothing
else of the controller changes."""

import json
import os
import time
from datetime import datetime

import redis
from celery.signals import task_postrun

from controlplane.broker import AGENT_REPORT_TASK, BUNDLE_REPORT

_redis = redis.Redis.from_url(os.environ["KUMO_BENCH_REPORTS_REDIS"])
KEY = "kumo-bench-reports:done"


@task_postrun.connect
def _handled(sender=None, kwargs=None, **_):
    if getattr(sender, "name", "") != AGENT_REPORT_TASK or not kwargs:
        return
    done = time.time()
    sent = datetime.fromisoformat(kwargs["sent_at"]).timestamp()
    n = len(kwargs["payload"].get("reports", [])) if kwargs["kind"] == BUNDLE_REPORT else 1
    _redis.rpush(KEY, json.dumps({"done": done, "latency_s": done - sent, "n": n}))
