"""``manage.py simfleet --gpu 40 --cpu 8``: an mdx-like simulated fleet for libvirt's test driver.

Writes one node description per host into ``--dir`` (GPU nodes: 8x A100 40GB on 2 NUMA
cells, 128 vCPUs, 460 GiB; CPU nodes: 152 vCPUs) and registers each host with its inventory
and a rack label, as its agent would report it. Start an agent per host with
``python -m controlplane.agent --host gpu-01 --libvirt-uri test:///<dir>/gpu-01.xml``;
``manage.py run`` does this for its own hosts. Running it again changes nothing.
"""

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand
from django.utils import timezone

from compute import services
from compute.drivers import simnode
from compute.protocol import inventory_payload
from controlplane import audit
from controlplane.choices import AuditSource


def fleet_names(gpu: int, cpu: int) -> list[str]:
    return [f"gpu-{n:02d}" for n in range(1, gpu + 1)] + [f"cpu-{n:02d}" for n in range(1, cpu + 1)]


def write_and_register(directory: Path, names: list[str], *, per_rack: int = 8) -> dict:
    """Write a node file per host (a GPU node for names starting ``gpu``, else a CPU node)
    and register the hosts; returns host name -> libvirt URI."""
    uris = {}
    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    for index, name in enumerate(names):
        kind = "gpu" if name.startswith("gpu") else "cpu"
        path = directory / f"{name}.xml"
        path.write_text(simnode.node_xml(kind, name), encoding="utf-8")
        host = services.inventory_reported(
            host=name,
            payload=inventory_payload(simnode.host_inventory(kind)),
            sent_at=timezone.now(),
        )
        if not host.rack:
            services.host_update(host=host, rack=f"{kind}-rack-{index // per_rack + 1:02d}")
        uris[name] = f"test://{path}"
    return uris


class Command(BaseCommand):
    help = __doc__.splitlines()[0]

    def add_arguments(self, parser):
        parser.add_argument("--gpu", type=int, default=2, help="GPU nodes (default 2)")
        parser.add_argument("--cpu", type=int, default=1, help="CPU nodes (default 1)")
        parser.add_argument("--dir", default=None, help="where to write (default var/fleet)")
        parser.add_argument("--per-rack", type=int, default=8)

    def handle(self, *args, gpu, cpu, dir, per_rack, **options):
        directory = Path(dir) if dir else settings.VAR_DIR / "fleet"
        with audit.audit_context(source=AuditSource.SYSTEM):
            uris = write_and_register(directory, fleet_names(gpu, cpu), per_rack=per_rack)
        for name, uri in uris.items():
            self.stdout.write(f"{name}  {uri}")
