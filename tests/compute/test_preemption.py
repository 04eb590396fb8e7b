"""compute.preemption: the victim set is on a host that evictions could not empty anyway,
then wastes the fewest GPU-seconds (work since each victim's last checkpoint, plus a cost
per evicted GPU), then has the fewest VMs; on one host that then fits the request, and only
candidates (spot VMs) are ever chosen."""

from dataclasses import replace
from functools import partial

from compute import preemption
from compute.preemption import NOTHING_TO_LOSE, Candidate
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


def spot(vm_id, host_id, gpus, cell=None, started=0.0, saves_at=None, notice_s=30.0):
    return Candidate(
        vm_id=vm_id,
        host_id=host_id,
        gpus=gpus,
        vcpus=16 * gpus,
        memory_mib=57 * 1024 * gpus,
        started=started,
        cell=cell,
        saves_at=saves_at,
        notice_s=notice_s,
    )


# "Now" is 100 s after the candidates' clock starts; each evicted GPU costs 10 s beyond its
# lost work unless a test says otherwise.
choose_victims = partial(preemption.choose_victims, now=100.0, cost_s=10.0)


def gpus(n):
    return Request(vcpus=16 * n, memory_mib=57 * 1024 * n, gpus=n, gpu_model=MODEL)


def test_an_8_gpu_request_takes_the_host_wasting_least_then_with_the_fewest_spot_vms():
    hosts = [host(1), host(2), host(3)]
    cands = {
        1: [spot(f"a{i}", 1, 1, cell=i // 4) for i in range(8)],
        2: [spot("b1", 2, 4, cell=0), spot("b2", 2, 4, cell=1)],
        3: [spot("c1", 3, 4, cell=0), spot("c2", 3, 2, cell=1), spot("c3", 3, 2, cell=1)],
    }
    # Every host loses 8 GPUs' 100 s: the fewest VMs go.
    decision = choose_victims(hosts, cands, gpus(8))
    assert decision.host_id == 2 and sorted(decision.victims) == ["b1", "b2"]
    # Host 1's eight VMs have just saved their work: emptying it wastes least.
    cands[1] = [spot(f"a{i}", 1, 1, cell=i // 4, started=95) for i in range(8)]
    decision = choose_victims(hosts, cands, gpus(8))
    assert decision.host_id == 1 and len(decision.victims) == 8


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
    # The pinned host comes first even where it takes more victims: for 2 GPUs, two of
    # host 2's 1-GPU VMs, not one 2-GPU VM that just saved on host 1.
    cands[1] = [spot(f"a{i}", 1, 2, cell=i // 2, started=100) for i in range(4)]
    decision = choose_victims(hosts, cands, gpus(2))
    assert decision.host_id == 2 and len(decision.victims) == 2


def test_two_victims_that_just_saved_go_before_one_that_would_lose_work():
    hosts = [host(1), host(2)]
    cands = {
        1: [spot("s1", 1, 2, cell=0, started=100), spot("s2", 1, 2, cell=0, started=100)],
        2: [spot("big", 2, 4, cell=1, started=1)],
    }
    assert sorted(choose_victims(hosts, cands, gpus(4)).victims) == ["s1", "s2"]
    # Of equal waste, the fewest VMs.
    cands[2] = [spot("big", 2, 4, cell=1, started=100)]
    assert choose_victims(hosts, cands, gpus(4)).victims == ("big",)


def test_a_guest_expected_to_save_within_its_notice_wastes_only_what_follows_the_save():
    # Now is 100 s. Host 2's VM has worked unsaved since 0 but is expected to save at
    # ``saves_at``; host 1's has just saved (90 s). Within the 30 s notice, less the 5 s
    # margin, the expected save makes host 2's the cheaper eviction: the stop at 130 s loses
    # 130 - saves_at, against host 1's 40 s.
    hosts = [host(1), host(2)]

    def victims(saves_at, notice_s=30.0):
        cands = {
            1: [spot("saved", 1, 2, cell=0, started=90)],
            2: [spot("due", 2, 2, cell=0, started=0, saves_at=saves_at, notice_s=notice_s)],
        }
        return choose_victims(hosts, cands, gpus(2)).victims

    assert victims(saves_at=110) == ("due",)
    assert victims(saves_at=125) == ("due",)  # the margin's edge
    assert victims(saves_at=126) == ("saved",)  # may come after the stop
    assert victims(saves_at=100) == ("saved",)  # due now, not reported: it did not save
    assert victims(saves_at=110, notice_s=0.0) == ("saved",)  # no notice to save in
    assert victims(saves_at=None) == ("saved",)


def test_a_notice_is_made_longer_for_a_save_expected_just_after_it_within_the_stretch():
    # Now is 100 s, the notice 30 s, the stretch 45 s: a guest expected to save at 140 s is
    # stopped at 145 s (the save and its 5 s margin), losing 5 s of work, not its 140 s since
    # 0; host 1's just-saved VM would lose 10 s. Past 175 s the notice is not stretched.
    hosts = [host(1), host(2)]

    def decision(saves_at, stretch_s=45.0):
        cands = {
            1: [spot("saved", 1, 2, cell=0, started=90)],
            2: [spot("due", 2, 2, cell=0, started=0, saves_at=saves_at)],
        }
        return choose_victims(hosts, cands, gpus(2), stretch_s=stretch_s)

    assert (decision(140).victims, decision(140).deadline) == (("due",), 145.0)
    assert (decision(170).victims, decision(170).deadline) == (("due",), 175.0)
    assert (decision(171).victims, decision(171).deadline) == (("saved",), 130.0)
    assert decision(140, stretch_s=0.0).victims == ("saved",)
    # A template without notice gets none, stretched or not.
    cands_0 = {1: [spot("saved", 1, 2, cell=0, started=90)]}
    cands_0[2] = [spot("due", 2, 2, cell=0, started=0, saves_at=110, notice_s=0.0)]
    chosen = choose_victims(hosts, cands_0, gpus(2), stretch_s=45.0)
    assert (chosen.victims, chosen.deadline) == (("saved",), 130.0)
    # A save within the notice needs no stretch: the stop comes at the notice's end.
    assert (decision(110).victims, decision(110).deadline) == (("due",), 130.0)


def test_every_running_victim_stops_at_the_last_deadline_and_the_wait_is_weighed():
    # 4 GPUs wanted, each evicted GPU costing 10 s. Host 1: a VM due to save at 160 s
    # (stopped at 165 s, wasting nothing beyond the cost, less than the notice) beside one
    # that saved at 90 s, whose 2 GPUs then wait 35 s for it: 2 x 0 + 2 x (20 + 35) = 110.
    # Host 2: two VMs unsaved since 85 s waste 4 x 25 = 100 and go; unsaved since 60 s they
    # would waste 200, and host 1's go, every one stopped at 165 s.
    hosts = [host(1), host(2)]

    def decision(started_2):
        cands = {
            1: [
                spot("due", 1, 2, cell=0, started=0, saves_at=160),
                spot("fresh", 1, 2, cell=0, started=90),
            ],
            2: [
                spot("b1", 2, 2, cell=0, started=started_2),
                spot("b2", 2, 2, cell=0, started=started_2),
            ],
        }
        return choose_victims(hosts, cands, gpus(4), stretch_s=45.0)

    assert decision(started_2=85).host_id == 2
    chosen = decision(started_2=60)
    assert (chosen.host_id, sorted(chosen.victims), chosen.deadline) == (1, ["due", "fresh"], 165.0)


def test_free_gpus_the_request_takes_wait_idle_while_a_notice_is_made_longer():
    # 4 GPUs wanted, each evicted GPU costing 100 s; both hosts have 2 GPUs free in cell 0
    # and a 2-GPU spot VM there. Host 1's is due to save at 160 s (stopped at 165 s: 2 x 75)
    # but its 2 free GPUs then wait 35 s past the notice's end (2 x 35): 220. Host 2's just
    # saved and stops at 130 s: 2 x 100 = 200, and goes. Unsaved since 70 s it would cost 260.
    def decision(started_2):
        free = {"vcpus_free": 32, "memory_free": 2 * 57 * 1024}
        hosts = [host(1, (2, 0), **free), host(2, (2, 0), **free)]
        cands = {
            1: [spot("due", 1, 2, cell=0, started=0, saves_at=160)],
            2: [spot("fresh", 2, 2, cell=0, started=started_2)],
        }
        return choose_victims(hosts, cands, gpus(4), cost_s=100.0, stretch_s=45.0)

    assert (decision(100).victims, decision(100).deadline) == (("fresh",), 130.0)
    assert (decision(70).victims, decision(70).deadline) == (("due",), 165.0)


def test_the_cost_per_evicted_gpu_weighs_gpus_freed_beyond_the_request_against_work_lost():
    # 2 GPUs wanted: host 1's 2-GPU VM, unsaved for 90 s, or its 4-GPU VM, unsaved for 10 s
    # (2 GPUs beyond the request freed). At 10 s a GPU the 4-GPU VM wastes less (80
    # against 200 GPU-seconds); at 120 s the 2-GPU VM does (420 against 520).
    hosts = [host(1)]
    cands = {1: [spot("two", 1, 2, cell=0, started=10), spot("four", 1, 4, cell=1, started=90)]}
    assert choose_victims(hosts, cands, gpus(2)).victims == ("four",)
    assert choose_victims(hosts, cands, gpus(2), cost_s=120.0).victims == ("two",)


def test_a_stopped_spot_vm_wastes_nothing_and_goes_first():
    hosts = [host(1), host(2)]
    cands = {
        1: [spot("running", 1, 1, cell=0, started=100)],
        2: [spot("stopped", 2, 4, cell=0, started=NOTHING_TO_LOSE)],
    }
    assert choose_victims(hosts, cands, gpus(1)).victims == ("stopped",)


def test_a_whole_node_victim_wastes_all_its_gpus_for_a_cell_request():
    # 2 GPUs wanted: an 8-GPU VM that saved 50 s ago wastes 8 x 60; a 2-GPU VM unsaved for
    # 90 s wastes 2 x 100: the 2-GPU VM goes.
    hosts = [host(1), host(2)]
    cands = {1: [spot("node", 1, 8, started=50)], 2: [spot("two", 2, 2, cell=0, started=10)]}
    assert choose_victims(hosts, cands, gpus(2)).victims == ("two",)


def test_of_equal_waste_the_fewest_vms_go_then_those_freeing_fewest_gpus():
    # 2 GPUs wanted, every candidate unsaved since the same moment, no cost per GPU: a
    # 2-GPU VM, or two 1-GPU VMs of the same waste: the single VM.
    hosts = [host(1), host(2)]
    cands = {
        1: [spot("two", 1, 2, cell=0, started=50), spot("four", 1, 4, cell=1, started=50)],
        2: [spot("one-a", 2, 1, cell=0, started=50), spot("one-b", 2, 1, cell=0, started=50)],
    }
    assert choose_victims(hosts, cands, gpus(2), cost_s=0.0).victims == ("two",)
    # Stopped VMs waste nothing: of a stopped 2-GPU and a stopped 4-GPU VM, the 2-GPU one.
    cands = {1: [spot("two", 1, 2, cell=0, started=NOTHING_TO_LOSE)]}
    cands[2] = [spot("four", 2, 4, cell=0, started=NOTHING_TO_LOSE)]
    assert choose_victims(hosts, cands, gpus(2)).victims == ("two",)


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


def test_the_victims_free_the_rdma_virtual_functions_the_request_needs():
    # Two 4-GPU spot VMs on one host without a free VF: the one that just saved wastes less,
    # but only the other frees the two VFs the request's ports need.
    h = host(1, (0, 0), vcpus_free=0, memory_free=0)
    needs_vfs = Request(vcpus=64, memory_mib=57 * 1024 * 4, gpus=4, gpu_model=MODEL, rdma_vfs=2)
    cands = {1: [spot("saved", 1, 4, cell=0, started=99), spot("busy", 1, 4, cell=1)]}
    assert choose_victims([h], cands, gpus(4)).victims == ("saved",)
    cands[1][1] = replace(cands[1][1], rdma_vfs=2)
    assert choose_victims([h], cands, needs_vfs).victims == ("busy",)
    # Nothing evicted frees them: no decision.
    cands[1][1] = replace(cands[1][1], rdma_vfs=1)
    assert choose_victims([h], cands, needs_vfs) is None
    # The host's free VFs count too.
    h.vfs_free = 1
    assert choose_victims([h], cands, needs_vfs).victims == ("busy",)
