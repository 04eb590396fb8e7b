"""``manage.py run`` (what ``make run`` calls): the whole Kumo topology on one machine.

Migrates, bootstraps the demo data, then starts and supervises: the web process (gunicorn),
the controller (Celery on queue ``control``), beat, the console proxy (``console-proxy``),
and one host agent per simulated host (Celery on ``host.<name>``). A process that exits is
started again after a backoff (``controlplane.supervise``, as systemd's ``Restart=always``
does for ``deploy/systemd``).
Ctrl-C (or SIGTERM) stops every process and removes what the run made on this machine: the
project routers' namespaces and the simulated fabric. On the embedded defaults it needs no
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
    console_bind: str | None = None,
) -> dict[str, list[str]]:
    """The processes of one Kumo machine: name -> argv. ``uris`` gives each simulated host
    its libvirt test-driver node (``manage.py simfleet`` writes them); ``agent_args`` more
    options per host agent (its simulated network, ``network.simfabric``);
    ``console_bind``: the console proxy listens there (none without it)."""
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
    if console_bind:
        manage = str(settings.BASE_DIR / "manage.py")
        processes["console-proxy"] = [python, manage, "console-proxy", "--bind", console_bind]
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

        base = f"http://{bind}"
        demo_idp = demo_federation(env, base)
        host_list = [h.strip() for h in hosts.split(",") if h.strip()]
        from compute.management.commands.simfleet import write_and_register

        uris = write_and_register(settings.VAR_DIR / "fleet", host_list)
        agent_args, networking = _simulated_network(host_list)
        self.stdout.write(
            "\n".join(
                [
                    "",
                    f"  Portal        {base}/",
                    f"  API           {base}/api/v1/   (docs {base}/api/docs/)",
                    f"  Admin console {base}/admin/",
                    f"  Metrics       {base}/metrics   health {base}/healthz {base}/readyz",
                    f"  Consoles      {settings.CONSOLE_PROXY_URL} (serial console proxy; "
                    "simulated hosts have no consoles)",
                    f"  Database      {settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]}"
                    f"   broker {settings.CELERY_BROKER_URL.split('@')[-1]}",
                    f"  Hosts         {', '.join(host_list) or 'none'} (simulated)",
                    f"  Networks      {networking}",
                    f"  Login         {demo_idp['line']}",
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
            sys.executable,
            bind=bind,
            hosts=host_list,
            uris=uris,
            agent_args=agent_args,
            console_bind=settings.CONSOLE_PROXY_BIND,
        )
        if demo_idp["argv"]:
            processes["demo-idp"] = demo_idp["argv"]
        for name, argv in processes.items():
            manager.add_process(name, " ".join(_quote(a) for a in supervised(name, argv)), env=env)
        try:
            manager.loop()
        finally:
            cleanup(host_list, simulated_network=bool(agent_args))
        sys.exit(manager.returncode)


def demo_federation(env: dict, base: str) -> dict:
    """Unless an operator configured a federation (KUMO_SAML_METADATA_URL) or said
    KUMO_DEMO_IDP=0: a demo SAML IdP (``tenants.federation.demo_idp``) as one more process,
    its federation's signed aggregate loaded now, and ``env`` pointing the web process at
    it, so "Log in with your institution" works from the first start."""
    if settings.SAML_METADATA_URL:
        return {"argv": None, "line": f"SAML federation {settings.SAML_METADATA_URL}"}
    if os.environ.get("KUMO_DEMO_IDP") == "0":
        return {"argv": None, "line": "password only (KUMO_DEMO_IDP=0)"}
    from tenants.federation import metadata
    from tenants.federation.demo_idp import DemoIdP

    port = int(os.environ.get("KUMO_DEMO_IDP_PORT", "8700"))
    host = base.split("//", 1)[1].rsplit(":", 1)[0]  # same site as the portal: cookies follow
    workdir = settings.VAR_DIR / "demo-idp"
    idp = DemoIdP(
        base_url=f"http://{host}:{port}", workdir=workdir, sp_metadata_url=f"{base}/saml2/metadata/"
    )
    aggregate, cert = idp.write_federation()
    env.update(
        KUMO_BASE_URL=env.get("KUMO_BASE_URL") or base,
        KUMO_SAML_METADATA_URL=str(aggregate),
        KUMO_SAML_FEDERATION_CERT=str(cert),
    )
    settings.KUMO_BASE_URL = env["KUMO_BASE_URL"]
    settings.SAML_METADATA_URL, settings.SAML_FEDERATION_CERT = str(aggregate), str(cert)
    row = metadata.metadata_refresh()
    argv = [
        sys.executable, "-m", "tenants.federation.demo_idp", "--host", host, "--port", str(port),
        "--workdir", str(workdir), "--sp-metadata-url", f"{base}/saml2/metadata/",
    ]  # fmt: skip
    line = (
        f"demo IdP {idp.base_url}/ ({row.idp_count} institutions; "
        '"Log in with your institution", Demo University, alice or bob)'
    )
    return {"argv": argv, "line": line}


def supervised(name: str, argv: list[str]) -> list[str]:
    """``argv`` under ``controlplane.supervise``: restarted with a backoff when it exits."""
    return [sys.executable, "-m", "controlplane.supervise", name, "--", *argv]


def cleanup(hosts: list[str], *, simulated_network: bool, prefix: str = "kumo-sim") -> list[str]:
    """Remove what this run made on the machine once its processes are gone: every project
    router's namespace (``kumo-r-<id>``, made by the gateway agent; only those of routers in
    this run's database, so another run's are left alone) and the simulated fabric. Returns
    the namespaces removed."""
    import subprocess

    from network.drivers.base import router_netns
    from network.models import Router

    if not simulated_network:
        return []
    from network import simfabric

    removed = []
    for router_id in Router.objects.values_list("pk", flat=True):
        namespace = router_netns(router_id.hex)
        if os.path.exists(f"/run/netns/{namespace}"):
            subprocess.run(["ip", "netns", "del", namespace], check=False, capture_output=True)
            removed.append(namespace)
    simfabric.remove(hosts, prefix=prefix)
    return removed


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
