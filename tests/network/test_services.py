"""Network services: allocation, validation, what deleting takes with it, and the desired
state each host is sent."""

import pytest

from compute import services as compute
from compute.models import Device
from controlplane.errors import Conflict, InvalidInput
from network import desired, dns, services
from network.models import FixedIp, GlobalIp, HostNetwork, Port, PortForward
from tests.factories import (
    enroll_network,
    make_host,
    make_network,
    make_pool,
    make_project,
    make_template,
    make_vm,
)

pytestmark = pytest.mark.django_db


def test_networks_get_distinct_vnis_and_the_overlay_mtu(project, settings):
    a = make_network(project, "a")
    b = make_network(make_project(), "b")
    assert a.vni != b.vni
    assert settings.VNI_RANGE[0] <= a.vni <= settings.VNI_RANGE[1]
    assert a.mtu == 1450


def test_the_vni_range_running_out_answers_409(project, settings):
    settings.VNI_RANGE = (500, 501)
    make_network(project, "a")
    make_network(make_project(), "b")
    with pytest.raises(Conflict) as e:
        make_network(make_project(), "c")
    assert e.value.code == "exhausted" and "VNI" in e.value.message


def test_overlapping_subnets_in_one_network_are_400(project):
    net = make_network(project, "a", cidr="10.0.0.0/16")
    with pytest.raises(InvalidInput) as e:
        services.subnet_create(network=net, cidr="10.0.128.0/24")
    assert "cidr" in e.value.details and "overlaps" in e.value.message
    # The same range in another network (or project) is fine: overlays are isolated.
    make_network(project, "b", cidr="10.0.0.0/16")


@pytest.mark.parametrize(
    "fields, field",
    [
        ({"cidr": "10.0.0.1/24"}, "cidr"),  # host bits set
        ({"cidr": "10.0.0.0/30"}, "cidr"),
        ({"cidr": "10.0.0.0/24", "gateway_ip": "10.0.1.1"}, "gateway_ip"),
        ({"cidr": "10.0.0.0/24", "pool_start": "10.0.0.200", "pool_end": "10.0.0.100"}, "pool_end"),
        ({"cidr": "10.0.0.0/24", "dns_servers": ["resolver"]}, "dns_servers"),
    ],
)
def test_bad_subnets_name_the_field(project, fields, field):
    net = make_network(project, "a", cidr="")
    with pytest.raises(InvalidInput) as e:
        services.subnet_create(network=net, **fields)
    assert field in e.value.details


def test_addresses_come_from_the_pool_past_the_gateway_until_it_runs_out(project):
    net = make_network(project, "a", cidr="10.1.0.0/29")  # hosts .1-.6; .1 the gateway
    ports = [services.port_create(network=net) for _ in range(5)]
    assert [p.fixed_ips.get().address for p in ports] == [f"10.1.0.{i}" for i in range(2, 7)]
    with pytest.raises(Conflict) as e:
        services.port_create(network=net)
    assert e.value.code == "exhausted"
    services.port_delete(port=ports[1])
    assert services.port_create(network=net).fixed_ips.get().address == "10.1.0.3"


def test_a_fixed_ip_in_use_or_outside_answers_clearly(project):
    net = make_network(project, "a", cidr="10.1.0.0/24")
    services.port_create(network=net, fixed_ip="10.1.0.50")
    with pytest.raises(Conflict) as e:
        services.port_create(network=net, fixed_ip="10.1.0.50")
    assert e.value.code == "address_in_use"
    with pytest.raises(InvalidInput) as e:
        services.port_create(network=net, fixed_ip="10.2.0.5")
    assert "fixed_ip" in e.value.details
    with pytest.raises(InvalidInput):
        services.port_create(network=net, fixed_ip="10.1.0.1")  # the gateway


def test_macs_are_unique_and_locally_administered(project):
    net = make_network(project, "a", cidr="10.1.0.0/22")
    macs = [services.port_create(network=net).mac for _ in range(50)]
    assert len(set(macs)) == 50
    assert all(m.startswith("02:4b:55:") for m in macs)


def test_a_network_with_ports_cannot_be_deleted(project):
    net = make_network(project, "a")
    port = services.port_create(network=net)
    with pytest.raises(Conflict):
        services.network_delete(network=net)
    services.port_delete(port=port)
    services.network_delete(network=net)


def test_rdma_networks_are_refused_while_no_host_reports_sriov(project):
    with pytest.raises(Conflict) as e:
        make_network(project, "roce", kind="rdma")
    assert e.value.code == "rdma_unavailable"
    enroll_network(make_host("gpu-rdma"), "10.0.0.9", sriov_pfs={"ens1f0": 8})
    net = make_network(project, "roce", kind="rdma", rdma_dscp=24)
    assert (net.kind, net.rdma_dscp, net.rdma_pfc_priority) == ("rdma", 24, 3)


def test_rdma_ports_take_their_hosts_free_virtual_functions_in_pci_order(project):
    """A VM's RDMA port takes the first free VF of the VM's host, given to the VM as well
    (compute's claim); a port without a VM holds its VF alone; none left answers 409."""
    host = make_host("gpu-vf")
    enroll_network(host, "10.0.0.9", sriov_pfs={"ens1f0": 16})
    net = make_network(project, "roce", kind="rdma", cidr="10.5.0.0/24")
    vfs = list(Device.objects.filter(host=host, kind="rdma_vf").order_by("pci_address"))
    assert len(vfs) > 2
    vm = make_vm(project, template=make_template(gpus=1), nics=[{"network": net}])
    port = Port.objects.get(vm=vm)
    assert vm.host_id == host.pk and port.vf_id == vfs[0].pk
    assert Device.objects.get(pk=vfs[0].pk).vm_id == vm.pk
    bare = services.port_create(network=net, host=host)
    assert bare.vf_id == vfs[1].pk and Device.objects.get(pk=vfs[1].pk).vm_id is None
    assert [services.port_create(network=net, host=host).vf_id for _ in vfs[2:]] == [
        vf.pk for vf in vfs[2:]
    ]
    with pytest.raises(Conflict) as e:
        services.port_create(network=net, host=host)
    assert e.value.code == "no_capacity"


def test_rule_validation(project):
    group = services.security_group_create(project=project, name="web")
    with pytest.raises(InvalidInput) as e:
        services.rule_create(group=group, direction="ingress", protocol="icmp", port_min=22)
    assert "port_min" in e.value.details
    with pytest.raises(InvalidInput):
        services.rule_create(
            group=group, direction="ingress", protocol="tcp", port_min=90, port_max=80
        )
    with pytest.raises(InvalidInput):
        theirs = services.security_group_create(project=make_project(), name="x")
        services.rule_create(group=group, direction="ingress", remote_group=theirs)
    rule = services.rule_create(
        group=group, direction="ingress", protocol="tcp", port_min=443, remote_cidr="10.0.0.7/8"
    )
    assert (rule.port_max, rule.remote_cidr) == (443, "10.0.0.0/8")


# --- VMs, NAT, and what deleting takes with it -------------------------------------------------


@pytest.fixture
def fleet(db):
    h1, h2, gw = make_host("net-h1"), make_host("net-h2"), make_host("net-gw", kind="cpu")
    enroll_network(h1, "10.99.0.1", underlay_device="ul0")
    enroll_network(h2, "10.99.0.2", underlay_device="ul0")
    enroll_network(gw, "10.99.0.3", gateway=True, external_bridge="brx", underlay_device="ul0")
    make_pool()
    return h1, h2, gw


def test_a_vm_gets_a_port_bound_to_its_host_and_the_guest_its_nic(project, fleet):
    net = make_network(project, "a", cidr="10.1.0.0/24")
    vm = make_vm(project, template=make_template(gpus=1), nics=[{"network": net}])
    port = Port.objects.get(vm=vm)
    assert port.host_id == vm.host_id and port.bound_generation > 0
    from compute.services.lifecycle import apply_message

    nic = apply_message(vm).interfaces[0]
    assert nic.mac == port.mac and nic.mtu == 1450 and nic.device == f"tp-{port.pk.hex[:12]}"
    assert nic.addresses == ("10.1.0.2/24",) and nic.gateway == "10.1.0.1"


def test_deleting_a_vm_releases_its_port_address_and_nat(project, fleet):
    net = make_network(project, "a", cidr="10.1.0.0/24", external_access=True)
    vm = make_vm(project, nics=[{"network": net}])
    port = Port.objects.get(vm=vm)
    gip = services.global_ip_allocate(project=project)
    forward = services.port_forward_create(
        address=gip, protocol="tcp", external_port=2222, port=port, internal_port=22
    )
    compute.vm_delete(vm=vm)
    assert not Port.objects.filter(pk=port.pk).exists()
    assert not FixedIp.objects.filter(address="10.1.0.2").exists()
    assert not PortForward.objects.filter(pk=forward.pk).exists()
    assert GlobalIp.objects.filter(pk=gip.pk).exists()  # the address stays the project's
    gw = fleet[2]
    router = desired.host_networks(gw.pk).routers[0]
    assert router.forwards == () and router.floating == ()


def test_desired_state_spans_hosts_and_isolates_projects(fleet):
    h1, h2, gw = fleet
    alpha, beta = make_project(), make_project()
    net_a = make_network(alpha, "a", cidr="192.168.10.0/24", external_access=True)
    net_b = make_network(beta, "b", cidr="192.168.10.0/24")
    a1 = services.port_create(network=net_a, host=h1, binding="veth", binding_netns="a1")
    a2 = services.port_create(network=net_a, host=h2, binding="veth", binding_netns="a2")
    b1 = services.port_create(network=net_b, host=h1, binding="veth", binding_netns="b1")

    on_h1 = desired.host_networks(h1.pk)
    assert {n.vni for n in on_h1.networks} == {net_a.vni, net_b.vni}
    by_vni = {n.vni: n for n in on_h1.networks}
    # Project A spans h1 and h2, and its router leg lives on the gateway.
    assert by_vni[net_a.vni].remote_vteps == ("10.99.0.2", "10.99.0.3")
    assert (a2.mac, "10.99.0.2") in by_vni[net_a.vni].remote_macs
    # B is on h1 alone and has no router: only its resolver's namespace is on the gateway.
    assert by_vni[net_b.vni].remote_vteps == ("10.99.0.3",)
    assert by_vni[net_b.vni].remote_macs == ((dns.dns_mac(net_b.pk.hex), "10.99.0.3"),)
    assert {p.mac for p in on_h1.ports} == {a1.mac, b1.mac}
    # Both have .2: overlapping addresses, different VNIs.
    assert {p.ips for p in on_h1.ports} == {("192.168.10.2",)}

    on_gw = desired.host_networks(gw.pk)
    assert [n.vni for n in on_gw.networks] == [net_a.vni, net_b.vni]
    resolvers = {d.vni: d for d in on_gw.dns}
    assert resolvers[net_a.vni].router_id and not resolvers[net_b.vni].router_id
    assert resolvers[net_b.vni].addresses == ("192.168.10.1/24",)
    (router,) = on_gw.routers
    assert router.interfaces[0].address == "192.168.10.1/24"
    assert router.snat_cidrs == ("192.168.10.0/24",)
    assert router.external_address.startswith("198.51.100.") and on_gw.external_bridge == "brx"


def test_security_groups_become_port_rules(project, fleet):
    h1 = fleet[0]
    net = make_network(project, "a", cidr="10.1.0.0/24")
    web = services.security_group_create(project=project, name="web")
    services.rule_create(
        group=web, direction="ingress", protocol="tcp", port_min=8080, remote_cidr="0.0.0.0/0"
    )
    a = services.port_create(network=net, host=h1, binding="veth", binding_netns="x")
    b = services.port_create(
        network=net, host=h1, binding="veth", binding_netns="y", security_groups=["default", "web"]
    )
    ports = {p.mac: p for p in desired.host_networks(h1.pk).ports}
    rules_b = ports[b.mac].firewall
    assert ("ingress", "tcp", 8080, 8080, "0.0.0.0/0") in {
        (r.direction, r.protocol, r.port_min, r.port_max, r.remote_cidr) for r in rules_b
    }
    # default: ingress from the group's members, by address; egress anywhere.
    members = {r.remote_cidr for r in ports[a.mac].firewall if r.direction == "ingress"}
    assert members == {"10.1.0.2/32", "10.1.0.3/32"}
    assert any(r.direction == "egress" and r.remote_cidr == "0.0.0.0/0" for r in rules_b)
    services.port_update(port=a, port_security=False)
    assert {p.mac: p for p in desired.host_networks(h1.pk).ports}[a.mac].firewall is None


def test_changes_bump_the_generation_of_the_hosts_they_touch(project, fleet):
    h1, h2, gw = fleet
    before = dict(HostNetwork.objects.values_list("host_id", "desired_generation"))
    net = make_network(project, "a", cidr="10.1.0.0/24")
    services.port_create(network=net, host=h1, binding="veth", binding_netns="x")
    after = dict(HostNetwork.objects.values_list("host_id", "desired_generation"))
    assert after[h1.pk] > before[h1.pk] and after[gw.pk] > before[gw.pk]
    assert after[h2.pk] == before[h2.pk]


def test_a_forward_on_a_1to1_address_and_duplicates_are_409(project, fleet):
    net = make_network(project, "a", cidr="10.1.0.0/24", external_access=True)
    port = services.port_create(network=net)
    gip = services.global_ip_allocate(project=project)
    services.port_forward_create(
        address=gip, protocol="tcp", external_port=80, port=port, internal_port=8080
    )
    with pytest.raises(Conflict):
        services.port_forward_create(
            address=gip, protocol="tcp", external_port=80, port=port, internal_port=8081
        )
    with pytest.raises(Conflict):
        services.global_ip_associate(address=gip, port=port)


def test_global_ips_count_against_the_quota(project, fleet):
    from tenants.models import Quota

    Quota.objects.filter(project=project).update(global_ips=1)
    services.global_ip_allocate(project=project)  # the router's own address is free
    with pytest.raises(Conflict) as e:
        services.global_ip_allocate(project=project)
    assert e.value.code == "quota_exceeded"


def test_an_agent_that_restarted_is_sent_everything_again(project, fleet):
    h1 = fleet[0]
    row = HostNetwork.objects.get(host=h1)
    enroll_network(h1, "10.99.0.1", applied_generation=row.desired_generation)
    assert HostNetwork.objects.get(host=h1).converged
    enroll_network(h1, "10.99.0.1", applied_generation=0)  # restarted
    assert not HostNetwork.objects.get(host=h1).converged
