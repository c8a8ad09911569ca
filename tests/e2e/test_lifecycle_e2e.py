"""Jobs run for real: a control worker, beat and two node agents on Redis, jobs in bubblewrap."""

import json
import time

import pytest
from django.utils import timezone

from jobs import declaration, services, tasks
from jobs.models import Allocation, GpuHold, Job, JobEvent, LogChunk, Node
from tests.e2e.conftest import wait_for, wait_for_state
from tests.factories import MembershipFactory, TeamFactory, UserFactory

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


@pytest.fixture
def member(live_pool):
    return MembershipFactory(
        team=TeamFactory(name="vision", slug="vision"), user=UserFactory(username="alice")
    ).user


def submit(member, argv, *, gpus=1, hours=1.0, requeue=False, name="e2e", output="out", data=()):
    from django.conf import settings

    team = member.memberships.first().team
    spec = declaration.validate(
        {
            "name": name, "work": {"argv": argv}, "data": list(data),
            "request": {"gpus": gpus, "hours": hours, "requeue": requeue},
            "output": {"uri": f"file://{settings.E31_OUTPUT_ROOTS[0]}/{team.slug}/{output}", "bytes": 1000},
        },
        limits=services.pool_limits(team=team),
    )  # fmt: skip
    with_commit = services.submit_job(team=team, user=member, spec=spec, now=timezone.now())
    return with_commit


def py(code: str) -> list[str]:
    return ["/usr/bin/python3", "-c", code]


def test_a_job_goes_through_every_step_and_its_outputs_are_sealed_and_delivered(live_pool, member, settings):
    code = "import os; open(os.environ['E31_OUTPUT_DIR']+'/result.txt','w').write('42'); print('gpus', os.environ['CUDA_VISIBLE_DEVICES'])"
    job = submit(member, py(code), gpus=2)
    job = wait_for_state(job.id, "released")
    assert (job.end_reason, job.exit_code) == ("succeeded", 0)
    states = list(job.events.values_list("to_state", flat=True))
    assert states == ["submitted", "staging", "queued", "rented", "running", "output", "released"]
    assert list(job.output_files.values("attempt", "path", "bytes", "sha256")) == [
        {
            "attempt": 1,
            "path": "result.txt",
            "bytes": 2,
            "sha256": "73475cb40a568e8da8a045ced110137e159f890ac4da883b6b17dc651b3a8049",
        }
    ]
    assert (job.sealed_files, job.sealed_bytes) == (1, 2)
    assert "gpus " in job.log_tail and len(job.log_tail.split("gpus ")[1].strip().split(",")) == 2
    allocation = job.allocations.get()
    assert allocation.released_at is not None and not GpuHold.objects.filter(active=True).exists()
    delivered = wait_for(lambda: Job.objects.get(id=job.id).delivered_at, what="delivery")
    assert delivered >= allocation.released_at  # delivery ran after RELEASE: off the meter
    assert (
        settings.E31_OUTPUT_ROOTS[0] / "vision" / "out" / f"{job.id}-1" / "result.txt"
    ).read_text() == "42"


def test_a_non_zero_exit_ends_failed_with_its_exit_code_and_releases(live_pool, member):
    job = wait_for_state(submit(member, py("import sys; print('boom'); sys.exit(3)")).id, "released")
    assert (job.end_reason, job.exit_code) == ("failed", 3)
    assert "boom" in job.log_tail
    assert job.allocations.get().released_at is not None


def test_a_command_that_does_not_exist_fails_cleanly(live_pool, member):
    job = wait_for_state(submit(member, ["/no/such/program"]).id, "released")
    assert job.end_reason == "failed" and job.exit_code != 0
    assert "no/such/program" in job.log_tail


def test_the_time_limit_terms_then_kills_a_job_that_ignores_term(live_pool, member):
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ignoring TERM', flush=True); time.sleep(600)"
    job = submit(member, py(code), hours=2 / 3600)  # a two-second limit
    job = wait_for_state(job.id, "released", timeout=30)
    assert job.end_reason == "timed_out"
    allocation = job.allocations.get()
    held = (allocation.released_at - allocation.started_at).total_seconds()
    assert 2 <= held < 12, held  # the limit, the 1 s grace, and the agent's one-second checks


def test_children_that_outlive_the_job_are_killed_with_it(live_pool, member, tmp_path):
    code = "import subprocess; subprocess.Popen(['sleep', '300']); print('parent done', flush=True)"
    job = wait_for_state(submit(member, py(code)).id, "released")
    assert job.end_reason == "succeeded"
    import subprocess

    survivors = subprocess.run(["pgrep", "-f", "sleep 300"], capture_output=True, text=True).stdout.split()
    assert survivors == []


def test_a_flood_of_output_is_capped_with_a_note(live_pool, member, settings):
    code = "import sys\nfor _ in range(3000): sys.stdout.write('x' * 1000 + '\\n')"
    # 3 MB: the cap's 1 MB through the log shipper and the attempt's disk, then 2 MB read at the agent's pace past
    # the cap (agent.POST_CAP_BYTES_PER_S: a quarter of a second)
    job = wait_for_state(submit(member, py(code)).id, "released", timeout=120)
    assert job.end_reason == "succeeded"
    assert job.log_tail.startswith("[log capped at 1000000 bytes")
    assert len(job.log_tail) <= 9 * 1024


def test_cancel_while_queued_ends_unmetered(live_pool, member):
    blocker = submit(member, py("import time; time.sleep(60)"), gpus=8, name="blocker")
    wait_for_state(blocker.id, "running")
    waiting = submit(member, py("print(1)"), gpus=8, name="waiting")
    wait_for_state(waiting.id, "queued")
    assert services.cancel_job(job_id=waiting.id, user=member, now=timezone.now())
    waiting.refresh_from_db()
    assert (waiting.state, waiting.end_reason) == ("ended", "cancelled")
    assert not waiting.allocations.exists()
    services.cancel_job(job_id=blocker.id, user=member, now=timezone.now())
    wait_for_state(blocker.id, "released")


def test_cancel_while_running_kills_the_process_group_and_releases(live_pool, member):
    job = submit(member, py("import time; print('started', flush=True); time.sleep(300)"))
    wait_for_state(job.id, "running")
    assert services.cancel_job(job_id=job.id, user=member, now=timezone.now())
    job = wait_for_state(job.id, "released", timeout=15)
    assert job.end_reason == "cancelled"
    assert job.allocations.get().released_at is not None


@pytest.mark.parametrize("requeue", [True, False])
def test_an_agent_killed_during_run_loses_its_node_and_requeues_or_ends_as_declared(
    live_pool, member, requeue
):
    job = submit(member, py("import time; time.sleep(20)"), gpus=4, requeue=requeue)
    job = wait_for_state(job.id, "running")
    node = job.allocations.get().node.name
    live_pool.kill(node)
    wait_for(lambda: Node.objects.get(name=node).state == "down", timeout=15, what="node down")
    first = Allocation.objects.get(job=job, attempt=1)
    assert first.released_at is not None and first.end_reason == "node_lost"
    assert first.last_heartbeat_at_release is not None
    if requeue:
        job = wait_for_state(job.id, "released", timeout=60)
        assert job.end_reason == "succeeded" and job.attempt == 2
        second = Allocation.objects.get(job=job, attempt=2)
        assert (
            second.node.name != node and second.rented_at >= first.released_at
        )  # never two attempts at once
    else:
        job = wait_for_state(job.id, "released")
        assert job.end_reason == "node_lost"


def test_a_duplicated_run_message_does_nothing_the_second_time(live_pool, member):
    job = submit(member, py("import time; time.sleep(1); print('once', flush=True)"))
    job = wait_for_state(job.id, "running")
    allocation = job.allocations.get()
    tasks.run_part.apply_async((allocation.id,), queue=f"node.{allocation.node.name}")
    job = wait_for_state(job.id, "released")
    time.sleep(1)
    assert job.end_reason == "succeeded"
    assert JobEvent.objects.filter(job=job, to_state="running").count() == 1
    assert Allocation.objects.filter(job=job).count() == 1


def test_the_sandbox_hides_secrets_other_jobs_and_the_platform_and_is_read_only(live_pool, member, settings):
    probe = f"""
import json, os, glob
out = {{}}
out['env'] = sorted(os.environ)
out['secret_in_proc'] = any('e2e-secret' in open(p, errors='ignore').read() for p in glob.glob('/proc/*/environ') if os.access(p, os.R_OK))
try:
    open('/etc/e31-escape', 'w'); out['wrote_etc'] = True
except OSError:
    out['wrote_etc'] = False
agents = os.path.dirname(os.path.dirname(os.environ['E31_OUTPUT_DIR']))
out['other_jobs'] = [d for d in os.listdir(agents) if d != os.path.basename(os.path.dirname(os.environ['E31_OUTPUT_DIR']))]
out['state_dir'] = os.listdir({str(settings.E31_STAGING_ROOT.parent)!r}) if os.path.isdir({str(settings.E31_STAGING_ROOT.parent)!r}) else 'missing'
print(json.dumps(out))
"""
    other = submit(member, py("import time; time.sleep(15)"), name="neighbour")
    wait_for_state(other.id, "running")
    job = wait_for_state(submit(member, py(probe)).id, "released")
    assert job.end_reason == "succeeded", job.log_tail
    seen = json.loads(job.log_tail.strip().splitlines()[-1])
    assert (
        "SECRET_KEY" not in seen["env"]
        and "DATABASE_URL" not in seen["env"]
        and "CELERY_BROKER_URL" not in seen["env"]
    )
    assert {"CUDA_VISIBLE_DEVICES", "E31_JOB_ID", "E31_DATA_DIR", "E31_OUTPUT_DIR"} <= set(seen["env"])
    assert seen["secret_in_proc"] is False
    assert seen["wrote_etc"] is False
    assert seen["other_jobs"] == []
    assert "e31.sqlite3" not in seen["state_dir"] and "broker" not in seen["state_dir"]
    services.cancel_job(job_id=other.id, user=member, now=timezone.now())


def test_a_job_larger_than_a_node_runs_one_process_per_node_with_ranks(live_pool, member):
    code = (
        "import os, json; d = {k: os.environ[k] for k in ('E31_NODE_RANK', 'E31_NUM_NODES', 'E31_COORDINATOR', 'CUDA_VISIBLE_DEVICES')};"
        "open(os.environ['E31_OUTPUT_DIR'] + '/rank.json', 'w').write(json.dumps(d))"
    )
    job = wait_for_state(submit(member, py(code), gpus=8).id, "released")
    assert job.end_reason == "succeeded"
    parts = list(job.allocations.order_by("rank"))
    assert [p.rank for p in parts] == [0, 1] and len({p.node_id for p in parts}) == 2
    assert sorted(job.output_files.values_list("path", flat=True)) == ["rank0/rank.json", "rank1/rank.json"]


def test_when_one_node_of_a_job_fails_the_others_are_stopped(live_pool, member):
    """Rank 1 fails 2 s after its start; rank 0 would sleep two minutes. On a loaded machine rank 0's agent may
    start its process after rank 1 has already failed: it is then never started, which stops it as surely (the
    landing run once saw that, and the test read a start time that was never set)."""
    code = "import os, sys, time\nif os.environ['E31_NODE_RANK'] == '1':\n    time.sleep(2); sys.exit(7)\ntime.sleep(120)"
    job = wait_for_state(submit(member, py(code), gpus=8).id, "released", timeout=30)
    assert (job.end_reason, job.exit_code) == ("failed", 7)
    rank0 = job.allocations.get(rank=0)
    assert rank0.finished_at is not None
    if rank0.started_at is not None:
        assert (rank0.finished_at - rank0.started_at).total_seconds() < 15


def _rank_log(job, rank: int) -> str:
    chunks = LogChunk.objects.filter(job=job, rank=rank).order_by("offset").values_list("data", flat=True)
    return b"".join(bytes(c) for c in chunks).decode(errors="replace")


def test_a_cancelled_spanning_job_frees_each_nodes_gpus_only_once_that_nodes_process_stopped(
    live_pool, member
):
    """Rank 0 dies at TERM; rank 1 notes when it got TERM, ignores it and is killed after the grace (1 s here).
    Rank 1's GPUs are released only once its process is gone, and the job ends only then: no GPU is given away
    under a running rank (each node's agent sees the cancel at its own next check, so only rank 1's own
    timeline is compared)."""
    code = (
        "import os, signal, time\n"
        "if os.environ['E31_NODE_RANK'] == '1':\n"
        "    signal.signal(signal.SIGTERM, lambda *a: print(f'term at {time.time()}', flush=True))\n"
        "print('ready', flush=True)\n"
        "time.sleep(120)"
    )
    job = submit(member, py(code), gpus=8)
    wait_for(
        lambda: all("ready" in _rank_log(job, rank) for rank in (0, 1)), timeout=60, what="both ranks ready"
    )
    assert services.cancel_job(job_id=job.id, user=member, now=timezone.now())
    job = wait_for_state(job.id, "released", timeout=30)
    rank0, rank1 = job.allocations.order_by("rank")
    assert job.end_reason == "cancelled"
    rank1_log = _rank_log(job, 1)
    assert "term at " in rank1_log, f"rank 1 was never sent TERM while it ran: {rank1_log!r}"
    term_at = float(rank1_log.split("term at ")[1].split()[0])
    assert rank1.released_at.timestamp() >= term_at + 0.9  # it ran through its grace, then was killed
    assert rank0.released_at <= rank1.released_at
    assert job.events.get(to_state="released").at >= rank1.released_at
    assert not GpuHold.objects.filter(allocation__job=job, active=True).exists()


def test_a_job_writing_outside_its_directories_fails_with_the_reason_in_its_log(live_pool, member):
    job = wait_for_state(submit(member, py("open('/usr/e31-escape', 'w')")).id, "released")
    assert (job.end_reason, job.exit_code) == ("failed", 1)
    assert "Read-only file system" in job.log_tail
