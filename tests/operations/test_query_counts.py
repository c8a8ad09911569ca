"""Each operator page runs a bounded number of queries, whatever the size of the pool and the queue."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from accounts.models import Team
from jobs.lifecycle import EndReason, State
from jobs.models import Allocation, GpuHold, Job, Node, NodeGpu
from operations import services
from tests.operations.conftest import HTMX, store_samples

pytestmark = pytest.mark.django_db

NODES, JOBS, GPUS = 100, 10_000, 8
# Session, user and the header's teams are 3 of these; the rest is each page's own, independent of size. The
# pool's 10th: its retired nodes, read by the whole page only (its polling fragment runs 9).
LIMITS = {"pool": 10, "queue": 8, "utilisation": 7, "jobs": 7, "teams": 8, "health": 11, "audit": 4}


def build(now, *, nodes: int, jobs: int, prefix: str = "") -> None:
    """``nodes`` 8-GPU nodes, every one half busy; ``jobs`` jobs: a fifth waiting, the rest ended; a day of samples."""
    teams = Team.objects.bulk_create(
        Team(name=f"{prefix}team-{i}", slug=f"{prefix}team-{i}") for i in range(5)
    )
    pool = Node.objects.bulk_create(
        Node(name=f"{prefix}n{i:04d}", gpus=GPUS, gpu_model="h100", sandbox="none" if i % 10 == 0 else "bubblewrap",
             registered_at=now, state_changed_at=now, last_heartbeat=now, agent_version="1.0")
        for i in range(nodes)
    )  # fmt: skip
    NodeGpu.objects.bulk_create(  # every GPU listed, with a live sample; the last one of each node missing
        NodeGpu(node=node, index=i, uuid=f"GPU-{node.id}-{i}", model="h100", present=i < GPUS - 1, changed_at=now,
                utilisation=50, memory_used_bytes=2**30, power_w=300, temperature_c=50, sampled_at=now)
        for node in pool for i in range(GPUS)
    )  # fmt: skip
    running = Job.objects.bulk_create(_job(i, teams, now, State.RUNNING) for i in range(nodes))
    allocations = Allocation.objects.bulk_create(
        Allocation(job=job, attempt=1, node=node, gpu_indices=[0, 1, 2, 3], rented_at=now, started_at=now)
        for job, node in zip(running, pool, strict=True)
    )
    GpuHold.objects.bulk_create(
        GpuHold(allocation=a, node=a.node, gpu_index=i) for a in allocations for i in range(4)
    )
    rest = [State.QUEUED if i % 5 == 0 else State.RELEASED for i in range(jobs - nodes)]
    Job.objects.bulk_create((_job(i, teams, now, s) for i, s in enumerate(rest)), batch_size=2000)
    if prefix:
        return  # one day of samples is enough
    store_samples(start=now - timedelta(days=1), minutes=1440, total=nodes * GPUS, busy=nodes * 4,
                  team_busy={t.id: nodes * 4 // 5 for t in teams})  # fmt: skip
    services.beat_heartbeat(now=now)
    services.check_ledger(now=now)


def _job(i: int, teams, now, state: str) -> Job:
    return Job(
        team=teams[i % len(teams)], name=f"job-{i}", state=state, gpus=1 + i % 8, hours=1.0,
        submitted_at=now - timedelta(minutes=i), state_changed_at=now, argv=["true"], output_uri="file:///tmp/o",
        output_bytes=0, attempt=1 if state != State.QUEUED else 0,
        end_reason=EndReason.SUCCEEDED if state == State.RELEASED else "",
        priority=1.0 + (i % 97) / 97 if state == State.QUEUED else None,
        priority_detail={"fairshare": 0.5, "age": 0.1, "size": 0.2, "total": 0.8} if state == State.QUEUED else {},
    )  # fmt: skip


def urls() -> dict[str, str]:
    return {name: reverse(f"operations:{name}") for name in LIMITS}


def count(client, url: str, **extra) -> int:
    with CaptureQueriesContext(connection) as queries:
        assert client.get(url, **extra).status_code == 200
    return len(queries)


def test_every_page_runs_a_bounded_number_of_queries_with_100_nodes_and_10000_jobs(
    operator_client, django_assert_max_num_queries, now
):
    build(now, nodes=NODES, jobs=JOBS)
    assert Job.objects.count() == JOBS and GpuHold.objects.count() == NODES * 4
    for name, url in urls().items():
        with django_assert_max_num_queries(LIMITS[name]):
            assert operator_client.get(url).status_code == 200
        with django_assert_max_num_queries(LIMITS[name]):
            assert operator_client.get(url, **HTMX).status_code == 200
    team = Team.objects.first()
    with django_assert_max_num_queries(15):  # the 15th: the logs the team holds against its budget
        operator_client.get(reverse("operations:team", args=[team.slug]))


def test_the_query_count_does_not_grow_with_the_pool(operator_client, now):
    build(now, nodes=3, jobs=30)
    small = {name: count(operator_client, url) for name, url in urls().items()}
    build(now, nodes=60, jobs=600, prefix="more-")
    large = {name: count(operator_client, url) for name, url in urls().items()}
    assert large == small
