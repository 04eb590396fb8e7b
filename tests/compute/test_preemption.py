"""compute.preemption: the victim set is the smallest, then on a host that evictions could
not empty anyway, then the youngest, on one host that then fits the request, and only
candidates (spot VMs) are ever chosen."""

from compute.preemption import Candidate, choose_victims
from compute.scheduler import HostView, Request

MODEL = "A100-SXM4-40GB"


def host(hid, free_per_cell=(0, 0), *, vcpus_free=0, memory_free=0, rack=""):
    cells, next_id = {}, hid * 100
    for cell, free in enumerate(free_per_cell):
        cells[cell] = list(range(next_id, next_id + free))
        next_id += free
    return HostView(
        id=hid,
        name=f"h{hid}",
        rack=rack,
        vcpus_free=vcpus_free,
        memory_mib_free=memory_free,
        gpu_model=MODEL,
        cells=cells,
        cell_sizes={0: 4, 1: 4},
    )


def spot(vm_id, host_id, gpus, cell=None, started=0.0):
    return Candidate(
        vm_id=vm_id,
        host_id=host_id,
        gpus=gpus,
        vcpus=16 * gpus,
        memory_mib=57 * 1024 * gpus,
        started=started,
        cell=cell,
    )


def gpus(n):
    return Request(vcpus=16 * n, memory_mib=57 * 1024 * n, gpus=n, gpu_model=MODEL)


def test_an_8_gpu_request_takes_the_host_with_the_fewest_spot_vms():
    hosts = [host(1), host(2), host(3)]
    cands = {
        1: [spot(f"a{i}", 1, 1, cell=i // 4) for i in range(8)],
        2: [spot("b1", 2, 4, cell=0), spot("b2", 2, 4, cell=1)],
        3: [spot("c1", 3, 4, cell=0), spot("c2", 3, 2, cell=1), spot("c3", 3, 2, cell=1)],
    }
    decision = choose_victims(hosts, cands, gpus(8))
    assert decision.host_id == 2 and sorted(decision.victims) == ["b1", "b2"]


def test_a_host_with_a_gpu_held_by_a_non_candidate_is_never_chosen():
    # Host 1 holds an on-demand 4-GPU VM (not a candidate): only host 2 can be emptied,
    # even though it needs more evictions.
    hosts = [host(1), host(2)]
    cands = {
        1: [spot("a1", 1, 4, cell=1)],
        2: [spot(f"b{i}", 2, 2, cell=i // 2) for i in range(4)],
    }
    decision = choose_victims(hosts, cands, gpus(8))
    assert decision.host_id == 2 and len(decision.victims) == 4
    assert "a1" not in decision.victims


def test_a_cell_request_evicts_the_fewest_then_the_youngest():
    # 2 GPUs wanted: cell 0 of host 1 has one free GPU and three 1-GPU spot VMs (one
    # eviction needed); host 2 has a 2-GPU spot VM (one eviction) but older; the youngest
    # single victim wins.
    hosts = [host(1, (1, 0), vcpus_free=16, memory_free=57 * 1024), host(2, (0, 0))]
    cands = {
        1: [spot("old", 1, 1, cell=0, started=10), spot("young", 1, 1, cell=0, started=50)],
        2: [spot("two", 2, 2, cell=0, started=30), spot("x", 2, 2, cell=1, started=1)],
    }
    decision = choose_victims(hosts, cands, gpus(2))
    assert decision.victims == ("young",)


def test_of_equally_few_victims_a_host_on_demand_work_already_pins_is_taken_first():
    # Host 1 holds spot VMs only: evictions could empty it for a whole-node request. Host 2
    # has an on-demand VM in cell 1 (no candidate) and old 1-GPU spot VMs in cell 0. A
    # 1-GPU request evicts on host 2, though host 1's victim would be younger, and a
    # whole-node request still finds host 1.
    pinned = host(2)
    pinned.gpus_on_demand = 4
    hosts = [host(1), pinned]
    cands = {
        1: [spot(f"a{i}", 1, 1, cell=i // 4, started=100) for i in range(8)],
        2: [spot(f"b{i}", 2, 1, cell=0, started=1) for i in range(4)],
    }
    decision = choose_victims(hosts, cands, gpus(1))
    assert decision.host_id == 2 and len(decision.victims) == 1
    assert choose_victims(hosts, cands, gpus(8)).host_id == 1
    # Fewer victims still come first: for 2 GPUs, one 2-GPU VM on host 1 beats two of
    # host 2's 1-GPU VMs.
    cands[1] = [spot(f"a{i}", 1, 2, cell=i // 2, started=100) for i in range(4)]
    decision = choose_victims(hosts, cands, gpus(2))
    assert decision.host_id == 1 and len(decision.victims) == 1


def test_one_big_victim_beats_two_small_young_ones():
    hosts = [host(1), host(2)]
    cands = {
        1: [spot("s1", 1, 2, cell=0, started=100), spot("s2", 1, 2, cell=0, started=100)],
        2: [spot("big", 2, 4, cell=1, started=1)],
    }
    assert choose_victims(hosts, cands, gpus(4)).victims == ("big",)


def test_of_equally_few_victims_the_set_freeing_fewest_gpus_goes_then_the_least_work_lost():
    # 2 GPUs wanted, one victim anywhere: host 1's 2-GPU VM, saved long ago, or host 2's
    # 4-GPU VMs, saved since. Freeing 4 would leave 2 free that the request does not take
    # (a waiting 4- or 8-GPU request cannot use them): the 2-GPU VM goes. Of two such VMs,
    # the one whose work is unsaved for the shortest time.
    hosts = [host(1), host(2)]
    cands = {
        1: [spot("two", 1, 2, cell=0, started=10), spot("four-a", 1, 4, cell=1, started=90)],
        2: [spot("four-b", 2, 4, cell=0, started=50), spot("four-c", 2, 4, cell=1, started=60)],
    }
    assert choose_victims(hosts, cands, gpus(2)).victims == ("two",)
    # Host 2's cell 0 now holds two 2-GPU VMs, saved at 40 and 50: the one saved at 50 goes.
    cands[2][0] = spot("two-b", 2, 2, cell=0, started=50)
    cands[2].append(spot("two-c", 2, 2, cell=0, started=40))
    assert choose_victims(hosts, cands, gpus(2)).victims == ("two-b",)


def test_victims_never_span_cells_for_a_cell_request():
    # Two GPUs free and one 2-GPU spot VM in each cell: 4 GPUs come from one cell.
    hosts = [host(1, (2, 2), vcpus_free=64, memory_free=4 * 57 * 1024)]
    cands = {1: [spot("c0", 1, 2, cell=0), spot("c1", 1, 2, cell=1)]}
    decision = choose_victims(hosts, cands, gpus(4))
    assert decision is not None and len(decision.victims) == 1


def test_nothing_helps_answers_none():
    hosts = [host(1)]
    assert choose_victims(hosts, {1: [spot("a", 1, 1, cell=0)]}, gpus(8)) is None
    assert choose_victims(hosts, {}, gpus(1)) is None


def test_a_whole_node_spot_vm_frees_a_cell():
    hosts = [host(1)]
    cands = {1: [spot("node", 1, 8, cell=None)]}
    assert choose_victims(hosts, cands, gpus(2)).victims == ("node",)


def test_short_vcpus_are_covered_by_cpu_only_spot_vms():
    # The GPUs are free but a CPU-only spot VM holds the vCPUs the request needs.
    h = host(1, (4, 4), vcpus_free=0, memory_free=10**9)
    cands = {1: [Candidate("cpu", 1, 0, 64, 1024, 0.0), Candidate("cpu2", 1, 0, 8, 1024, 9.0)]}
    decision = choose_victims([h], cands, gpus(4))
    assert decision.victims == ("cpu",)


def test_placement_group_rules_hold_for_the_chosen_host():
    hosts = [host(1, rack="r1"), host(2, rack="r2")]
    cands = {1: [spot("a", 1, 8)], 2: [spot("b", 2, 8)]}
    req = Request(
        vcpus=128,
        memory_mib=456 * 1024,
        gpus=8,
        gpu_model=MODEL,
        group_policy="compact",
        group_racks=frozenset({"r2"}),
    )
    assert choose_victims(hosts, cands, req).host_id == 2
