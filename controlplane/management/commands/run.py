"""``manage.py run`` (what ``make run`` calls): the whole Kumo topology on one machine.

Migrates, bootstraps the demo data, then starts and supervises: the web process (gunicorn),
the controller (Celery on queue ``control``), beat, and one host agent per simulated host
(Celery on ``host.<name>``). Ctrl-C stops every process. On the embedded defaults it needs no
server at all; set DATABASE_URL and CELERY_BROKER_URL to run it on PostgreSQL and Redis.
"""

import os
import shutil
import sys

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand
from honcho.manager import Manager
from honcho.printer import Printer

DEFAULT_HOSTS = "gpu-01,gpu-02,cpu-01"


def topology(
    python: str,
    *,
    bind: str,
    hosts: list[str],
    uris: dict[str, str] | None = None,
    agent_args: dict[str, list[str]] | None = None,
) -> dict[str, list[str]]:
    """The processes of one Kumo machine: name -> argv. ``uris`` gives each simulated host
    its libvirt test-driver node (``manage.py simfleet`` writes them); ``agent_args`` more
    options per host agent (its simulated network, ``network.simfabric``)."""
    celery = [python, "-m", "celery", "-A", "controlplane.celery"]
    processes = {
        "web": [
            python, "-m", "gunicorn", "controlplane.wsgi:application",
            "--bind", bind, "--workers", "2", "--access-logfile", "-",
        ],
        "controller": [
            *celery, "worker", "--queues", "control", "--hostname", "controller@%h",
            "--pool", "threads", "--concurrency", "4", "--without-gossip", "--without-mingle",
            "--loglevel", "INFO",
        ],
        "beat": [
            *celery, "beat", "--schedule", str(settings.VAR_DIR / "celerybeat-schedule"),
            "--loglevel", "INFO",
        ],
    }  # fmt: skip
    for host in hosts:
        # Simulated hosts: libvirt's own test driver, no daemon, on a node description with
        # the host's CPUs, NUMA cells and GPUs.
        uri = (uris or {}).get(host) or os.environ.get("KUMO_SIM_LIBVIRT_URI", "test:///default")
        processes[f"agent-{host}"] = [
            python, "-m", "controlplane.agent", "--host", host, "--libvirt-uri", uri,
            *(agent_args or {}).get(host, []),
        ]  # fmt: skip
    return processes


class Command(BaseCommand):
    help = __doc__.splitlines()[0]

    def add_arguments(self, parser):
        parser.add_argument("--bind", default=os.environ.get("KUMO_BIND", "127.0.0.1:8000"))
        parser.add_argument(
            "--hosts",
            default=os.environ.get("KUMO_SIM_HOSTS", DEFAULT_HOSTS),
            help="simulated hosts, comma-separated (default: %(default)s)",
        )

    def handle(self, *args, bind, hosts, **options):
        call_command("migrate", interactive=False, verbosity=0)
        self.stdout.write("database migrated")
        bootstrap = _Capture()
        call_command("bootstrap", stdout=bootstrap)

        env = dict(os.environ)
        env["KUMO_VAR_DIR"] = str(settings.VAR_DIR)
        metrics_dir = settings.VAR_DIR / "metrics"
        shutil.rmtree(metrics_dir, ignore_errors=True)
        metrics_dir.mkdir(parents=True)
        env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)

        host_list = [h.strip() for h in hosts.split(",") if h.strip()]
        from compute.management.commands.simfleet import write_and_register

        uris = write_and_register(settings.VAR_DIR / "fleet", host_list)
        agent_args, networking = _simulated_network(host_list)
        base = f"http://{bind}"
        self.stdout.write(
            "\n".join(
                [
                    "",
                    f"  Portal        {base}/",
                    f"  API           {base}/api/v1/   (docs {base}/api/docs/)",
                    f"  Admin console {base}/admin/",
                    f"  Metrics       {base}/metrics   health {base}/healthz {base}/readyz",
                    f"  Database      {settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]}"
                    f"   broker {settings.CELERY_BROKER_URL.split('@')[-1]}",
                    f"  Hosts         {', '.join(host_list) or 'none'} (simulated)",
                    f"  Networks      {networking}",
                    "",
                    *("  " + line for line in bootstrap.lines),
                    "",
                    "  Ctrl-C stops everything.",
                    "",
                ]
            )
        )
        self.stdout.flush()

        manager = Manager(Printer(sys.stdout))
        processes = topology(
            sys.executable, bind=bind, hosts=host_list, uris=uris, agent_args=agent_args
        )
        for name, argv in processes.items():
            manager.add_process(name, " ".join(_quote(a) for a in argv), env=env)
        manager.loop()
        sys.exit(manager.returncode)


def _simulated_network(hosts: list[str]) -> tuple[dict[str, list[str]], str]:
    """Give the simulated hosts a data-centre network of namespaces (``network.simfabric``)
    when this process may (root; ``KUMO_SIM_NETWORK=0`` turns it off), and the external
    network a global IP pool. Returns each agent's network options and a line to print."""
    from network import simfabric
    from network.models import GlobalIpPool
    from network.services import global_ip_pool_create

    if os.environ.get("KUMO_SIM_NETWORK") == "0" or not simfabric.available():
        return {}, "none: tenant networking on simulated hosts needs root (KUMO_SIM_NETWORK)"
    sims = simfabric.ensure(hosts)
    if not GlobalIpPool.objects.exists():
        global_ip_pool_create(
            name="sim-external",
            cidr=simfabric.EXTERNAL_CIDR,
            gateway_ip=simfabric.EXTERNAL_GATEWAY,
        )
    gateway = next((h.name for h in sims if h.gateway), "none")
    return (
        {h.name: h.agent_args() for h in sims},
        f"namespaces kumo-sim-<host>, gateway {gateway}, outside world in kumo-sim-ext",
    )


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


class _Capture:
    def __init__(self):
        self.lines: list[str] = []

    def write(self, text):
        self.lines.extend(line for line in text.splitlines() if line)

    def flush(self):
        pass
