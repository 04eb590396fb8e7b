"""The host agent: a Celery worker on queue ``host.<name>``, with no Django and no database.

It runs the host tasks that compute, network and storage define (``<app>/host_tasks.py``),
and reports what it observes to the controller (``controlplane.agent.reports``). Simulated
and real hosts run this same code; only the libvirt URI in the configuration differs.
"""

VERSION = "0.1.0"
