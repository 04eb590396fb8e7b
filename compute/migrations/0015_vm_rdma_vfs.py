"""A VM's RDMA virtual functions, as the scheduler counts them: one per port it has on an
RDMA network. VMs made before it are counted from their ports."""

from django.conf import settings
from django.db import migrations, models
from django.db.models import Count, OuterRef, Q, Subquery


def count_ports(apps, schema_editor):
    VirtualMachine = apps.get_model("compute", "VirtualMachine")
    Port = apps.get_model("network", "Port")
    vfs = (
        Port.objects.filter(vm=OuterRef("pk"), binding="vf")
        .order_by()
        .values("vm")
        .annotate(n=Count("pk"))
        .values("n")
    )
    VirtualMachine.objects.filter(Q(ports__binding="vf")).update(rdma_vfs=Subquery(vfs))


class Migration(migrations.Migration):
    dependencies = [
        ("compute", "0014_vm_reserved_host_index"),
        ("tenants", "0007_usage_project_index_once"),
        ("network", "0002_host_network_desired_at"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="virtualmachine",
            name="vm_queue_spot",
        ),
        migrations.RemoveIndex(
            model_name="virtualmachine",
            name="vm_queue_spot_untold",
        ),
        migrations.AddField(
            model_name="virtualmachine",
            name="rdma_vfs",
            field=models.PositiveSmallIntegerField(
                default=0,
                help_text="RDMA NIC virtual functions its ports take on its host: one per port on an RDMA network, fixed when it is created (a VM's ports are its for life)",
            ),
        ),
        migrations.RunPython(count_ports, migrations.RunPython.noop, elidable=True),
        migrations.AddIndex(
            model_name="virtualmachine",
            index=models.Index(
                condition=models.Q(
                    ("reserved_host__isnull", True),
                    ("state", "pending"),
                    ("lease__isnull", True),
                    ("placement_group__isnull", True),
                    ("priority", "spot"),
                ),
                fields=["gpus", "vcpus", "memory_mib", "gpu_model", "rdma_vfs", "created_at"],
                name="vm_queue_spot",
            ),
        ),
        migrations.AddIndex(
            model_name="virtualmachine",
            index=models.Index(
                condition=models.Q(
                    ("reserved_host__isnull", True),
                    ("state", "pending"),
                    ("lease__isnull", True),
                    ("placement_group__isnull", True),
                    ("priority", "spot"),
                    models.Q(
                        ("state_reason__gte", "no host has"),
                        ("state_reason__lt", "no host hat"),
                        _negated=True,
                    ),
                ),
                fields=["gpus", "vcpus", "memory_mib", "gpu_model", "rdma_vfs"],
                name="vm_queue_spot_untold",
            ),
        ),
    ]
