"""Placement rules of the in-memory scheduler (no database)."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compute.scheduler import HostView, NoValidHost, Request, Scheduler, _Ids

MODEL = "A100-SXM4-40GB"


def gpu_host(host_id, free=(4, 4), rack="r1", vcpus=128):
    """An 8-GPU host with ``free`` GPUs free on cells 0 and 1."""
    cells, ids = {}, iter(range(host_id * 100, host_id * 100 + 8))
    for cell, count in enumerate(free):
        own = [next(ids) for _ in range(4)]
        cells[cell] = own[:count]
    return HostView(id=host_id, name=f"gpu-{host_id}", rack=rack, vcpus_free=vcpus,
                    memory_mib_free=460 * 1024, gpu_model=MODEL, cells=cells,
                    cell_sizes={0: 4, 1: 4})  # fmt: skip


def cpu_host(host_id, vcpus=152, rack="r1"):
    return HostView(id=host_id, name=f"cpu-{host_id}", rack=rack, vcpus_free=vcpus,
                    memory_mib_free=256 * 1024)  # fmt: skip


def gpus(n):
    return Request(vcpus=16 * n, memory_mib=57 * 1024 * n, gpus=n, gpu_model=MODEL)


def test_up_to_four_gpus_come_from_one_numa_cell():
    scheduler = Scheduler([gpu_host(1, free=(3, 2))])
    placement = scheduler.select(gpus(2))
    host = scheduler.hosts[1]
    assert placement.numa_cell == 1  # the tighter cell: 2 free, not 3
    assert set(placement.device_ids) <= set(host.cells[1])
    with pytest.raises(NoValidHost, match="on one NUMA cell"):
        scheduler.select(gpus(4))  # 5 free on the host, but no cell has 4


def test_eight_gpus_take_a_whole_node():
    scheduler = Scheduler([gpu_host(1, free=(4, 3)), gpu_host(2)])
    placement = scheduler.select(gpus(8))
    assert placement.host_id == 2 and placement.numa_cell is None
    assert len(set(placement.device_ids)) == 8


def test_gpu_vms_pack_to_keep_whole_nodes_free():
    scheduler = Scheduler([gpu_host(1), gpu_host(2, free=(1, 4)), gpu_host(3, free=(4, 2))])
    first = scheduler.select(gpus(1))
    assert (first.host_id, first.numa_cell) == (2, 0)  # the last free GPU of a cell
    scheduler.reserve(first, gpus(1))
    second = scheduler.select(gpus(2))
    assert (second.host_id, second.numa_cell) == (3, 1)
    scheduler.reserve(second, gpus(2))
    assert scheduler.select(gpus(8)).host_id == 1  # the whole node stayed whole


def test_small_on_demand_vms_gather_on_hosts_on_demand_work_already_pins():
    # Host 1 holds spot VMs only (the tightest cell: 1 free); host 2 holds an on-demand VM.
    pinned = gpu_host(2, free=(4, 2))
    pinned.gpus_on_demand = 2
    scheduler = Scheduler([gpu_host(1, free=(1, 0)), pinned])
    spot = gpus(1)
    on_demand = Request(**{**vars(spot), "on_demand": True})
    assert scheduler.select(spot).host_id == 1  # spot packs tightest, as before
    first = scheduler.select(on_demand)
    assert (first.host_id, first.numa_cell) == (2, 1)  # the pinned host's tightest cell
    # A host an on-demand VM is claimed on is pinned from then on, and given back, not.
    clean = Scheduler([gpu_host(1, free=(1, 0)), gpu_host(3, free=(4, 4))])
    taken = clean.select(gpus(2))
    assert taken.host_id == 3
    clean.reserve(taken, Request(**{**vars(gpus(2)), "on_demand": True}))
    assert clean.hosts[3].pinned and clean.select(on_demand).host_id == 3
    clean.unreserve(taken, Request(**{**vars(gpus(2)), "on_demand": True}))
    assert not clean.hosts[3].pinned and clean.select(on_demand).host_id == 1


def test_reserve_then_unreserve_restores_the_view():
    scheduler = Scheduler([gpu_host(1)])
    before = {cell: sorted(ids) for cell, ids in scheduler.hosts[1].cells.items()}
    for n in (1, 2, 4, 8):
        placement = scheduler.select(gpus(n))
        scheduler.reserve(placement, gpus(n))
        assert scheduler.hosts[1].gpus_free == 8 - n
        scheduler.unreserve(placement, gpus(n))
        assert {c: sorted(i) for c, i in scheduler.hosts[1].cells.items()} == before
        assert scheduler.hosts[1].vcpus_free == 128


def test_cpu_vms_spread_and_keep_off_gpu_hosts():
    scheduler = Scheduler([gpu_host(1, vcpus=128), cpu_host(2, vcpus=40), cpu_host(3, vcpus=100)])
    req = Request(vcpus=8, memory_mib=8192)
    assert scheduler.select(req).host_id == 3  # most free vCPUs among CPU hosts
    full = Scheduler([gpu_host(1), cpu_host(2, vcpus=4)])
    assert full.select(req).host_id == 1  # a GPU host only when no CPU host has room


def test_capacity_and_model_are_filters():
    scheduler = Scheduler([gpu_host(1, vcpus=8)])
    with pytest.raises(NoValidHost) as e:
        scheduler.select(gpus(1))
    assert e.value.rejected["capacity"] == 1
    assert "without enough free vCPUs or memory" in e.value.reason
    other = Request(vcpus=1, memory_mib=1, gpus=1, gpu_model="H100-SXM5-80GB")
    with pytest.raises(NoValidHost, match="without enough free GPUs of that model"):
        Scheduler([gpu_host(1)]).select(other)


def test_placement_groups():
    hosts = [cpu_host(1, rack="r1"), cpu_host(2, rack="r2"), cpu_host(3, rack="r2", vcpus=10)]
    scheduler = Scheduler(hosts)
    base = {"vcpus": 4, "memory_mib": 1024}
    affinity = Request(**base, group_policy="affinity", group_hosts=frozenset({3}))
    assert scheduler.select(affinity).host_id == 3
    anti = Request(**base, group_policy="anti_affinity", group_hosts=frozenset({1, 2}))
    assert scheduler.select(anti).host_id == 3
    compact = Request(**base, group_policy="compact", group_racks=frozenset({"r2"}))
    assert scheduler.select(compact).host_id in (2, 3)
    first_member = Request(**base, group_policy="affinity")
    assert scheduler.select(first_member).host_id == 1  # no members yet: anywhere
    with pytest.raises(NoValidHost, match="anti-affinity"):
        scheduler.select(
            Request(**base, group_policy="anti_affinity", group_hosts=frozenset({1, 2, 3}))
        )


def test_no_valid_host_says_why_and_counts_hosts_out_of_service():
    scheduler = Scheduler([cpu_host(1)], excluded=2)
    with pytest.raises(NoValidHost) as e:
        scheduler.select(gpus(4))
    assert e.value.reason.startswith("no host has 64 vCPUs, 228 GiB, 4 A100-SXM4-40GB GPUs")
    assert "1 without enough free GPUs of that model" in e.value.reason
    assert "2 not in service" in e.value.reason


def test_a_decision_visits_few_hosts_in_a_large_fleet():
    hosts = [gpu_host(i, free=(4, 4) if i % 3 else (1, 0)) for i in range(1, 3001)]
    scheduler = Scheduler(hosts)
    visited = []
    original = scheduler._candidates

    def counting(req):
        for host in original(req):
            visited.append(host.id)
            yield host

    scheduler._candidates = counting
    placement = scheduler.select(gpus(1))
    assert scheduler.hosts[placement.host_id].gpus_free == 1  # the tightest fit
    assert len(visited) <= scheduler.sample


# --- no GPU stranded by CPU work ----------------------------------------------------------------


def _reserving(host):
    host.vcpus_per_gpu, host.memory_mib_per_gpu = 16, 57 * 1024
    return host


def test_a_cpu_vm_never_takes_what_a_gpu_hosts_free_gpus_need():
    # The probe of the issue: CPU hosts full, a GPU host with 8 free GPUs. CPU VMs spread
    # onto it would take 124 of its 128 vCPUs and strand GPUs; the reserve refuses them.
    full_cpu = cpu_host(2, vcpus=0)
    gpu = _reserving(gpu_host(1, vcpus=128))
    scheduler = Scheduler([gpu, full_cpu])
    with pytest.raises(NoValidHost) as refused:
        scheduler.select(Request(vcpus=4, memory_mib=8192))
    assert refused.value.rejected["gpu_reserve"] == 1
    assert "free GPUs need" in refused.value.reason
    # 6 GPUs taken by VMs of 8 vCPUs each: 80 vCPUs free, 32 of them the 2 free GPUs' need.
    busy = _reserving(gpu_host(3, free=(2, 0), vcpus=128 - 6 * 8))
    scheduler = Scheduler([busy, full_cpu])
    assert scheduler.select(Request(vcpus=48, memory_mib=8192)).host_id == 3
    with pytest.raises(NoValidHost):
        scheduler.select(Request(vcpus=49, memory_mib=8192))
    # GPU requests are never held back by it.
    assert scheduler.select(Request(vcpus=16, memory_mib=8192, gpus=2)).host_id == 3


def test_a_fleet_of_gpu_hosts_only_places_cpu_vms_on_them():
    gpu = _reserving(gpu_host(1, vcpus=128))
    assert Scheduler([gpu]).select(Request(vcpus=4, memory_mib=8192)).host_id == 1


# --- the first host the GPU index offers is the best ----------------------------------------


class _WeighingAll(Scheduler):
    """The scheduler as it was: it weighs every feasible host it visits, up to its sample."""

    @staticmethod
    def _best_first(req):
        return False


fleets = st.lists(
    st.tuples(
        st.tuples(st.integers(0, 4), st.integers(0, 4)),  # free GPUs per cell
        st.integers(0, 128),  # free vCPUs
        st.sampled_from([MODEL, "H100-SXM5-80GB"]),
        st.integers(0, 2),  # GPUs held by on-demand VMs (pinned when some)
    ),
    min_size=1,
    max_size=40,
)


@given(
    fleet=fleets,
    cpu_hosts=st.integers(0, 3),
    n=st.sampled_from([1, 2, 3, 4, 8]),
    model=st.sampled_from(["", MODEL]),
    on_demand=st.booleans(),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=300, deadline=None)
def test_stopping_at_the_first_feasible_gpu_host_decides_as_weighing_them_all(
    fleet, cpu_hosts, n, model, on_demand, seed
):
    def views():
        hosts = []
        for i, (free, vcpus, host_model, held_on_demand) in enumerate(fleet, start=1):
            host = gpu_host(i, free=free, vcpus=vcpus)
            host.gpu_model = host_model
            host.gpus_on_demand = min(held_on_demand, 8 - host.gpus_free)
            hosts.append(host)
        return hosts + [cpu_host(1000 + i) for i in range(cpu_hosts)]

    req = Request(
        vcpus=16 * n, memory_mib=57 * 1024 * n, gpus=n, gpu_model=model, on_demand=on_demand
    )
    decided, weighed = [], []
    for kind, out in ((Scheduler, decided), (_WeighingAll, weighed)):
        scheduler = kind(views(), rng=random.Random(seed))
        try:
            out.append(scheduler.select(req))
        except NoValidHost as e:
            out.append(e.reason)
    assert decided == weighed


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 20)), max_size=200))
def test_the_indexes_host_ids_are_a_set_read_by_position(operations):
    ids, expected = _Ids(), set()
    for add, host_id in operations:
        if add:
            ids.add(host_id)
            expected.add(host_id)
        else:
            ids.discard(host_id)
            expected.discard(host_id)
        assert len(ids) == len(expected)
        assert sorted(ids.items) == sorted(expected)
