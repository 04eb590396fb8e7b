"""Test data. Projects and memberships are made through the services, as the API makes them."""

import itertools

import factory

from tenants import services
from tenants.choices import Role
from tenants.models import User

_seq = itertools.count(1)


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = User
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.ac.jp")
    password = factory.PostGenerationMethodCall("set_password", "correct-horse-battery-staple")

    @classmethod
    def _after_postgeneration(cls, instance, create, results=None):
        if create:
            instance.save()


def make_project(owner=None, **fields):
    n = next(_seq)
    owner = owner or UserFactory()
    return services.project_create(
        slug=fields.pop("slug", f"proj-{n:04d}"),
        name=fields.pop("name", f"Project {n}"),
        owner=owner,
        **fields,
    )


def add_member(project, user=None, role=Role.MEMBER):
    user = user or UserFactory()
    services.membership_add(project=project, user=user, role=role)
    return user


def token_for(user, project=None) -> str:
    return services.token_create(user=user, name="test", project=project)[1]


# --- compute ---------------------------------------------------------------------------------

_host_seq = itertools.count(1)


def make_host(name=None, kind="gpu", *, rack="", up=True):
    """A host enrolled the way its agent does it: a heartbeat, then an inventory report of a
    simulated mdx node (8x A100 on 2 NUMA cells for ``gpu``; 152 vCPUs for ``cpu``)."""
    from django.utils import timezone

    from compute import services as compute
    from compute.drivers import simnode
    from compute.protocol import inventory_payload

    name = name or f"{kind}-{next(_host_seq):03d}"
    now = timezone.now()
    if up:
        compute.host_heartbeat(host=name, payload={}, sent_at=now)
    host = compute.inventory_reported(
        host=name, payload=inventory_payload(simnode.host_inventory(kind)), sent_at=now
    )
    if rack:
        host = compute.host_update(host=host, rack=rack)
    return host


def make_template(gpus=0, **fields):
    from compute import services as compute

    defaults = {
        "name": f"{'g' if gpus else 'c'}{gpus}-{next(_seq)}",
        "vcpus": 16 * gpus if gpus else 4,
        "memory_gib": 57 * gpus if gpus else 16,
        "gpus": gpus,
        "gpu_model": "A100-SXM4-40GB" if gpus else "",
        "disk_gib": 100,
    }
    return compute.template_create(**{**defaults, **fields})


def make_image(project=None, **fields):
    from compute import services as compute

    defaults = {
        "name": f"ubuntu-{next(_seq)}",
        "os_distro": "ubuntu",
        "os_version": "24.04",
        "format": "qcow2",
        "location": "/var/lib/kumo/images/ubuntu-24.04.qcow2",
        "checksum": "sha256:" + "ab" * 32,
    }
    return compute.image_create(project=project, **{**defaults, **fields})


def make_vm(project, template=None, image=None, **fields):
    """A VM created through the service, as the API creates it."""
    from compute import services as compute

    fields.setdefault("name", f"vm-{next(_seq)}")
    vm, _operation = compute.vm_create(
        project=project,
        template=template or make_template(),
        image=image or make_image(),
        **fields,
    )
    return vm


# --- network ---------------------------------------------------------------------------------


def enroll_network(host, vtep, *, gateway=False, sent_at=None, **fields):
    """A host's network agent reporting itself, as ``network.host_tasks`` does."""
    from django.utils import timezone

    from network import services as network

    payload = {"vtep": vtep, "gateway": gateway, "applied_generation": 0, **fields}
    network.host_network_reported(
        host=host.name, payload=payload, sent_at=sent_at or timezone.now()
    )
    return host.network


def make_network(project, name=None, cidr="192.168.10.0/24", **fields):
    from network import services as network

    return network.network_create(
        project=project, name=name or f"net-{next(_seq)}", cidr=cidr, **fields
    )


def make_pool(name="campus", cidr="198.51.100.0/24", gateway_ip="198.51.100.1"):
    from network import services as network

    return network.global_ip_pool_create(name=name, cidr=cidr, gateway_ip=gateway_ip)
