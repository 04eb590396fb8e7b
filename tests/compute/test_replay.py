"""A short replay (a quarter of a day on two hosts, a few dozen jobs: the services run
at a few hundred ms a job on the shared machine) through the real services in virtual time:
its figures are consistent (GPU-hours add up to the capacity, every eviction had its full
notice, the guarantee and the lease were honoured) and the trace format is checked line by line."""

import json
import os

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from compute.replay import trace as traces
from compute.replay.sim import Replay

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_day_replays_with_figures_that_add_up(tmp_path):
    path = tmp_path / "day.csv"
    # Short jobs (a median of 40 minutes), so that a quarter of a day on two hosts holds dozens.
    n = traces.generate(path, days=0.25, gpu_hosts=2, on_demand_load=0.5, spot_load=0.9,
                        cpu_jobs_per_day=8, projects=4, seed=3, median_s=2400)  # fmt: skip
    jobs = traces.read_trace(path)
    assert len(jobs) == n and 10 <= n <= 120
    lease = {"project": "p02", "gpus": 4, "start_s": 3600.0, "end_s": 3 * 3600.0}
    replay = Replay(jobs, gpu_hosts=2, cpu_hosts=1, guarantees={"p01": 4}, leases=[lease])
    figures = replay.run()
    assert figures["jobs"] == n and figures["simulated_days"] >= 0.2
    parts = (
        figures["on_demand_gpu_h"]
        + figures["spot_gpu_h"]
        + figures["held_idle_gpu_h"]
        + figures["free_while_waiting_gpu_h"]
        + figures["free_gpu_h"]
    )
    assert abs(parts - figures["capacity_gpu_h"]) <= 0.5  # rounding of five figures
    assert figures["capacity_gpu_h"] == pytest.approx(16 * 24 * figures["simulated_days"], rel=0.01)
    assert figures["spot_gpu_h"] > 0 and figures["on_demand_gpu_h"] > 0
    assert figures["evictions_full_notice"] == 1.0  # of those there were (the next test has one)
    assert figures["guarantees_honoured"] == 1.0
    assert figures["leases_honoured"] == 1.0  # sampled while it was active
    from compute.models import Lease

    assert Lease.objects.get().state == "ended"
    # The simulated agents answer as real ones do: the operation a host's work was sent for
    # is finished by the host's report. Each VM's create succeeded when it first ran (not
    # left open and superseded by its delete); each delete succeeded when its guest was gone.
    from compute.models import VirtualMachine
    from controlplane.models import Operation

    ran = {
        str(pk)
        for pk in VirtualMachine.objects.filter(state="deleted").values_list("pk", flat=True)
    }
    assert ran
    ops = Operation.objects.filter(target_id__in=ran, kind__in=["vm.create", "vm.delete"])
    assert {(o.kind, o.state, o.error_code) for o in ops} == {
        ("vm.create", "succeeded", ""),
        ("vm.delete", "succeeded", ""),
    }
    assert ops.count() == 2 * len(ran)
    assert 0 < figures["goodput"] <= 1
    plot = tmp_path / "alloc.png"
    replay.plot(str(plot))
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_bad_trace_line_names_the_line_and_field(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("submit_s,duration_s,gpus,gpu_model,priority,project\n0,10,3,A100,spot,p\n")
    with pytest.raises(traces.TraceError, match="line 2: gpus must be"):
        traces.read_trace(path)
    path.write_text("submit_s,gpus\n0,1\n")
    with pytest.raises(traces.TraceError, match="lacks duration_s"):
        traces.read_trace(path)


def _replay(tmp_path, capsys, *jobs: str, more=()) -> dict:
    """``manage.py replay`` of ``jobs`` (CSV lines) on one 8-GPU host; its figures."""
    path = tmp_path / "trace.csv"
    path.write_text("submit_s,duration_s,gpus,gpu_model,priority,project\n" + "\n".join(jobs))
    call_command("replay", str(path), "--gpu-hosts", "1", "--cpu-hosts", "0", *more)
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_the_command_replays_on_a_throwaway_database(tmp_path, capsys):
    from compute.models import Host

    figures = _replay(
        tmp_path,
        capsys,
        "0,3600,8,A100-SXM4-40GB,spot,lab-a",
        "600,1800,8,A100-SXM4-40GB,on_demand,lab-b",
    )
    assert figures["jobs"] == 2 and figures["evictions"] == 1
    assert figures["evictions_full_notice"] == 1.0
    assert figures["lease_idle_gpu_h"] == 0.0  # no lease
    assert figures["on_demand_wait_p99_s"] <= 30 + 10 + 1  # the notice, then the stop
    assert not Host.objects.exists()  # it ran elsewhere


def test_the_drain_after_the_last_submission_is_not_time_spot_waits(tmp_path, capsys):
    # A long 1-GPU job keeps the 8-GPU spot job waiting for ten hours after the last
    # submission: the fleet is not wanted whole then, only left to drain.
    figures = _replay(
        tmp_path,
        capsys,
        "0,36000,1,A100-SXM4-40GB,on_demand,lab-a",
        "60,3600,8,A100-SXM4-40GB,spot,lab-b",
    )
    assert figures["simulated_days"] > 11 / 24  # the spot job ran after the long one
    assert figures["spot_waits_days"] == 0.0
    assert figures["goodput_while_spot_waits"] is None


def test_a_spot_vm_evicted_twice_is_stopped_at_each_notices_end(tmp_path, capsys):
    # The same spot VM is noticed, evicted, started again and noticed anew: the second
    # on-demand request waits the notice and the stop too, not until the spot job ends.
    figures = _replay(
        tmp_path,
        capsys,
        "0,20000,8,A100-SXM4-40GB,spot,lab-a",
        "600,600,8,A100-SXM4-40GB,on_demand,lab-b",
        "3000,600,8,A100-SXM4-40GB,on_demand,lab-b",
    )
    assert figures["evictions"] == 2 and figures["evictions_full_notice"] == 1.0
    assert figures["on_demand_wait_p99_s"] <= 30 + 10 + 1


@pytest.mark.parametrize("reports", [True, False])
def test_spot_guests_that_report_checkpoints_lose_less_to_an_eviction(tmp_path, capsys, reports):
    # Two 4-GPU spot jobs share the host, A running from 60 s and B from 1,060 s; both save
    # every 1,800 s. At 1,900 s a 4-GPU on-demand request evicts one. A reported its
    # checkpoint at 1,860 s: it goes and loses 70 s of work (to the stop at 1,930 s), 4 x 70
    # GPU-seconds. Without reports Kumo knows only their starts: B, started last, goes and
    # loses 870 s on 4 GPUs.
    jobs = (
        "0,7200,4,A100-SXM4-40GB,spot,lab-a",
        "1000,7200,4,A100-SXM4-40GB,spot,lab-a",
        "1900,600,4,A100-SXM4-40GB,on_demand,lab-b",
    )
    more = () if reports else ("--no-checkpoint-reports",)
    figures = _replay(tmp_path, capsys, *jobs, more=more)
    assert figures["evictions"] == 1 and figures["evictions_full_notice"] == 1.0
    assert figures["spot_lost_gpu_h"] == (
        round(4 * 70 / 3600, 1) if reports else round(4 * 870 / 3600, 1)
    )


def test_a_lease_in_the_replay_evicts_spot_with_full_notice_and_is_honoured(tmp_path, capsys):
    figures = _replay(
        tmp_path,
        capsys,
        "0,20000,8,A100-SXM4-40GB,spot,lab-a",
        "7300,600,8,A100-SXM4-40GB,on_demand,lab-c",
        more=("--lease", "lab-c=8@7200-10800,keep-idle"),
    )
    assert figures["evictions"] == 1 and figures["evictions_full_notice"] == 1.0
    assert figures["leases_honoured"] == 1.0
    assert figures["on_demand_wait_p99_s"] == 0.0  # its lease's GPUs were free at its submit
    # Sampled every 600 s while jobs arrive: at 6,600 and 7,200 s the lease held all 8 GPUs
    # (the spot VM gone at 6,340 s, its notice given at the lease's lead of 900 s) and its
    # project ran nothing yet.
    assert figures["lease_idle_gpu_h"] == round(2 * 8 * 600 / 3600, 1)
    # The evicted spot VM waited for 8 GPUs then, no more than were free (for the lease).
    assert figures["spot_waits_lease_idle_gpu_h"] == 0.0
    with pytest.raises(CommandError, match="PROJECT=GPUS@START_S-END_S"):
        call_command("replay", str(tmp_path / "trace.csv"), "--lease", "lab-c=eight")
    with pytest.raises(CommandError, match="is not ',keep-idle'"):
        call_command("replay", str(tmp_path / "trace.csv"), "--lease", "lab-c=8@0-9,idle")


def test_a_lease_in_the_replay_lends_its_idle_gpus_to_spot(tmp_path, capsys):
    jobs = ("0,20000,8,A100-SXM4-40GB,spot,lab-a", "7300,600,8,A100-SXM4-40GB,on_demand,lab-c")
    kept = _replay(tmp_path, capsys, *jobs, more=("--lease", "lab-c=8@7200-10800,keep-idle"))
    lent = _replay(tmp_path, capsys, *jobs, more=("--lease", "lab-c=8@7200-10800"))
    # The spot job, evicted for the lease's start, runs on its idle GPUs from the start
    # until the lease's job needs them, and once more after that job's end.
    assert lent["spot_gpu_h"] > kept["spot_gpu_h"]
    assert lent["lease_idle_gpu_h"] < kept["lease_idle_gpu_h"]
    # The price: a second eviction, with its full notice, and the lease's job waits for it
    # (the notice of 30 s, then the stop of 10 s) instead of starting at once.
    assert (lent["evictions"], lent["evictions_full_notice"]) == (2, 1.0)
    assert lent["on_demand_wait_p99_s"] == 30 + 10
    assert lent["leases_honoured"] == 1.0  # the lent GPUs stayed the lease's throughout


@pytest.mark.postgres
def test_the_replay_vacuums_what_autovacuum_would_take():
    """A replay runs days in minutes: it vacuums (and analyzes) the tables autovacuum would
    take, and only those, counting every change made until then (not only those the
    backend happened to publish, a second of wall time apart: the replay's decisions must
    not follow the machine's speed)."""
    from django.db import connection

    from compute.models import Host
    from compute.replay.database import vacuum_as_autovacuum_would
    from tests.factories import make_host

    host = make_host("gpu-a")
    vacuum_as_autovacuum_would()  # whatever the rows made so far left due
    for n in range(300):  # 300 dead versions of one live row: past any threshold
        Host.objects.filter(pk=host.pk).update(vcpus_used=n % 2)
    # At once, well within the second after the last publication: only the replay's own
    # flush publishes the updates.
    assert vacuum_as_autovacuum_would() == [Host._meta.db_table]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n_dead_tup, last_vacuum IS NOT NULL, last_analyze IS NOT NULL"
            " FROM pg_stat_user_tables WHERE relname = %s",
            [Host._meta.db_table],
        )
        assert cursor.fetchone() == (0, True, True)
    assert vacuum_as_autovacuum_would() == []


def test_a_trace_replayed_twice_places_every_job_alike(tmp_path):
    """The scheduler starts at a random host among equally good ones (concurrent processes
    fill different hosts); the replay seeds it and ages its views in simulated time, so an
    operator who replays a trace twice gets the same placements and the same figures."""
    from compute.replay.database import throwaway_database

    path = tmp_path / "day.csv"
    traces.generate(path, days=0.1, gpu_hosts=4, on_demand_load=0.5, spot_load=0.9,
                    cpu_jobs_per_day=8, projects=3, seed=5, median_s=2400)  # fmt: skip
    jobs = traces.read_trace(path)
    runs = []

    def replayed():
        replay = Replay(jobs, gpu_hosts=4, cpu_hosts=1)
        figures = replay.run()
        hosts = {vm.job.index: vm.host for vm in replay.vms.values()}
        del figures["wall_s"], figures["simulated_days_per_wall_minute"]
        runs.append((hosts, figures))

    replayed()  # on the test's database
    with throwaway_database(reuse_migrations=True):  # and on a new one
        replayed()
    assert runs[0] == runs[1]
    assert len(set(runs[0][0].values())) >= 2  # hosts were chosen among, at random but seeded


def test_throwaway_databases_copied_from_one_migration_are_each_migrated_and_empty():
    """A process that replays more than once migrates once: each throwaway database after
    the first is a copy of a migrated template, never of the database before it."""
    from django.db import connection
    from django.db.migrations.recorder import MigrationRecorder

    from compute.replay import database
    from tenants.models import Project
    from tests.factories import make_project

    names = []
    for n in range(2):
        with database.throwaway_database(reuse_migrations=True) as name:
            names.append(name)
            applied = set(MigrationRecorder(connection).applied_migrations())
            assert not Project.objects.exists()
            make_project(slug=f"left-by-replay-{n}")
    assert names[0] != names[1] and len(database._TEMPLATES) == 1
    [template] = database._TEMPLATES.values()
    assert template not in names
    assert applied == set(MigrationRecorder(connection).applied_migrations())  # all of them


def test_a_replay_program_runs_with_the_fixed_string_hash_seed():
    """``fixed_hash_seed`` runs the program again with ``PYTHONHASHSEED`` fixed: whatever seed
    it was started with, strings hash alike (the replay's figures depend on it)."""
    import subprocess
    import sys

    code = (
        "from compute.replay import fixed_hash_seed; fixed_hash_seed(); "
        "import os; print(os.environ['PYTHONHASHSEED'], hash('kumo'))"
    )
    printed = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
            cwd=settings.BASE_DIR,
        ).stdout
        for seed in ("1", "2", "random")
    }
    assert len(printed) == 1 and printed.pop().startswith("0 ")


def test_a_replay_stopped_by_sigterm_leaves_no_database_behind(tmp_path):
    """``kill`` (SIGTERM) ends ``manage.py replay`` as Ctrl-C does: its throwaway database
    (here the embedded SQLite file, made under ``TMPDIR``) goes with it."""
    import signal
    import subprocess
    import sys
    import time

    trace = tmp_path / "days.csv"
    traces.generate(trace, days=3, gpu_hosts=4)  # seconds of replay after the migration
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env |= {"TMPDIR": str(tmp_path), "KUMO_VAR_DIR": str(tmp_path / "var")}
    env |= {"PYTHONHASHSEED": "0", "KUMO_LOG_LEVEL": "WARNING"}
    command = [sys.executable, "manage.py", "replay", str(trace), "--gpu-hosts", "4"]
    process = subprocess.Popen(
        command, cwd=settings.BASE_DIR, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob("kumo-replay-*.sqlite3")):
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "no throwaway database was made"
            time.sleep(0.05)
        time.sleep(1)  # migrating, or replaying: either way inside the block
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 128 + signal.SIGTERM, err.decode()[-2000:]
    assert out == b""  # stopped before its figures
    assert not list(tmp_path.glob("kumo-replay-*")), list(tmp_path.iterdir())


def test_the_generated_month_holds_the_benchs_jobs_at_the_loads_asked_for(tmp_path):
    """The bench's month (``bench/goodput.py``: 30 days for 40 hosts of 8 GPUs) holds at
    least the 20,000 jobs it is judged on, and its GPU work is the loads asked for: on-demand
    at 55 % of the fleet's GPU-hours and spot at 75 %, within the sampling's spread."""
    path = tmp_path / "month.csv"
    n = traces.generate(path, days=30, gpu_hosts=40)
    jobs = traces.read_trace(path)
    assert len(jobs) == n >= 20_000
    capacity = 40 * 8 * 30 * 86400
    work = {"on_demand": 0.0, "spot": 0.0}
    for job in jobs:
        if job.gpus:
            work[job.priority] += job.gpus * job.duration_s
    assert work["on_demand"] / capacity == pytest.approx(0.55, rel=0.1)
    assert work["spot"] / capacity == pytest.approx(0.75, rel=0.1)
    assert sorted(j.duration_s for j in jobs)[n // 2] == pytest.approx(7200, rel=0.1)
