"""The operator's writers: node actions, job cancel and requeue, team shares, health probes.

Each action runs in one transaction with its audit entry (``operations.audit.record``), so the
log holds exactly the actions that took effect. The state changes themselves go through the
jobs services (``jobs.nodes.set_node_state``, ``jobs.services.cancel_job`` and ``submit_job``):
this module adds the operator's view of them, never a second path to a job's state.
"""

import math
from datetime import datetime

from django.db import IntegrityError, transaction
from django.db.models import Count

from accounts.models import Team
from jobs import declaration, dependencies, dispatch, nodes, snapshot
from jobs import selectors as jobs_selectors
from jobs import services as jobs_services
from jobs.lifecycle import ALIVE, BEFORE_RENT, HOLDS_COMPUTE
from jobs.models import Allocation, GpuHold, Job, Node
from jobs.scheduling import policy
from metering import services as metering
from operations import audit, health, selectors, utilisation
from operations.models import HealthProbe, TeamBusySample, UtilisationSample

# What each node action asks of jobs.nodes.set_node_state; the states it is offered from are
# operations.selectors.ACTIONS_BY_STATE (the table set_node_state enforces; a stale page gets False).
NODE_ACTIONS: dict[str, str] = {
    "drain": Node.NodeState.DRAINING,
    "resume": Node.NodeState.UP,
    "mark-down": Node.NodeState.DOWN,
}
# A down node holding nothing leaves the pool for good (jobs.nodes.retire_node): no state of its own, it stays down.
RETIRE = "retire"
ACTIONS = (*NODE_ACTIONS, RETIRE)
MAX_SHARE = 1000.0
LEDGER_DETAIL_LINES = 20


class RequeueRefused(Exception):
    """The requeue did nothing: the job holds GPUs, an earlier copy of it is still alive, or today's
    intake rules (an enforced budget, a failed prerequisite) refuse its declaration."""


def _username(actor) -> str:
    return getattr(actor, "get_username", lambda: str(actor))() or "system"


# --------------------------------------------------------------------------- nodes


@transaction.atomic
def change_node_state(*, name: str, action: str, actor, now: datetime) -> bool:
    """Drains, resumes, marks down or retires a node; False (and no audit entry) if its state did not allow it.

    Marking down is a node loss at ``now``: its allocations are released (meter closed) and each
    job is requeued or ended as its declaration allows. A retired node takes no action: its agent
    registering again is what brings it back.
    """
    node = Node.objects.select_for_update().filter(name=name, retired_at__isnull=True).first()
    if node is None:
        return False
    before = {"state": node.state, "jobs_holding_gpus": _jobs_on(node)}
    if action not in selectors.actions_for(
        node.state, node.held_down_by, holding=bool(before["jobs_holding_gpus"])
    ):
        return False
    if action == RETIRE:
        return _retire(node, actor=actor, now=now)
    moved = nodes.set_node_state(name=name, target=NODE_ACTIONS[action], now=now, actor=_username(actor))
    if not moved:
        return False
    node.refresh_from_db(fields=["state"])
    after = {"state": node.state, "jobs_holding_gpus": _jobs_on(node)}
    if before["jobs_holding_gpus"] and action == "mark-down":
        after["jobs_after_loss"] = dict(
            Job.objects.filter(id__in=before["jobs_holding_gpus"]).values_list("id", "state")
        )
    audit.record(
        actor=actor, action=f"node.{action}", target=f"node:{name}", before=before, after=after, now=now
    )
    return True


def _retire(node: Node, *, actor, now: datetime) -> bool:
    # False only for a GPU hold still active with its allocation released: retired, it would be hidden.
    if not nodes.retire_node(name=node.name, now=now, actor=_username(actor)):
        return False
    before = {"state": node.state, "held_down_by": node.held_down_by, "network_slot": node.network_slot}
    after = {"retired_at": now.isoformat(), "retired_by": _username(actor)[:150], "network_slot": None}
    audit.record(
        actor=actor, action="node.retire", target=f"node:{node.name}", before=before, after=after, now=now
    )
    return True


def _jobs_on(node: Node) -> list[int]:
    held = Allocation.objects.filter(node=node, released_at__isnull=True)
    return sorted(set(held.values_list("job_id", flat=True)))


# --------------------------------------------------------------------------- jobs


@transaction.atomic
def cancel_job(*, job_id: int, actor, now: datetime) -> bool:
    """Cancels a live job through jobs.services.cancel_job; audited only when it took effect."""
    before = Job.objects.filter(id=job_id).values("state", "cancel_requested_at").first()
    if before is None or not jobs_services.cancel_job(job_id=job_id, user=actor, now=now):
        return False
    after = Job.objects.values("state", "cancel_requested_at").get(id=job_id)
    audit.record(
        actor=actor, action="job.cancel", target=f"job:{job_id}", before=before, after=after, now=now
    )
    return True


@transaction.atomic
def requeue_job(*, job_id: int, actor, now: datetime) -> Job:
    """Submits the job's declaration again as a new job of the same team; returns the new job.

    Requeue means: a job that has ended or been released is copied as it is; a job still waiting
    (submitted, staging, queued) is cancelled first, so exactly one copy waits, staged afresh;
    a job holding GPUs is refused with RequeueRefused (cancel it, and requeue once released), as is
    a job whose earlier copy (``rerun_of``) is still alive, and a declaration today's intake refuses:
    then nothing changed. The new job waits from ``now``: it does not inherit the old job's age.
    The copy of a waiting job replaces it: the jobs that waited for it wait for the copy (each is told).
    """
    job = Job.objects.select_for_update().select_related("team").get(id=job_id)
    if job.state in HOLDS_COMPUTE:
        raise RequeueRefused(f"job {job_id} holds GPUs ({job.state}); cancel it first")
    _refuse_while_a_copy_lives(job)
    before = {"state": job.state, "end_reason": job.end_reason}
    replaces = job.state in BEFORE_RENT
    if replaces:
        jobs_services.cancel_job(job_id=job_id, user=actor, now=now)
    copy = _submit_copy(job, actor=actor, now=now)
    after = {**Job.objects.values("state", "end_reason").get(id=job_id), "requeued_as": copy.id}
    if replaces:  # jobs.dependencies reads the copy in its place
        Job.objects.filter(id=job_id).update(replaced_by=copy)
        waiting = dependencies.note_replacement(copy_id=copy.id, actor=_username(actor), now=now)
        after |= {"dependents_wait_for_copy": waiting} if waiting else {}
    audit.record(
        actor=actor, action="job.requeue", target=f"job:{job_id}", before=before, after=after, now=now
    )
    return copy


def _refuse_while_a_copy_lives(job: Job) -> None:
    """A second requeue (a double click, two operators) finds the first copy under the job's row lock."""
    alive = Job.objects.filter(rerun_of=job, state__in=ALIVE).order_by("id").values("id", "state").first()
    if alive is not None:
        raise RequeueRefused(
            f"job {job.id} was already requeued as job #{alive['id']}, which is still {alive['state']}; "
            "cancel that one first to requeue again"
        )


def _submit_copy(job: Job, *, actor, now: datetime) -> Job:
    try:
        return jobs_services.submit_job(
            team=job.team, user=actor, spec=jobs_selectors.declaration_of(job), now=now, rerun_of=job
        )
    except declaration.DeclarationInvalid as exc:
        # Raising out of requeue_job's transaction also undoes the cancel of a waiting job.
        # In the operator's words: the messages, without the declaration's field paths ("request.hours: …").
        raise RequeueRefused(
            f"job {job.id} cannot be requeued: {'; '.join(message for _, message in exc.errors)}"
        ) from exc


# --------------------------------------------------------------------------- teams


@transaction.atomic
def set_team_share(*, team_id: int, share: float, actor, now: datetime) -> bool:
    """Sets a team's fair-share weight (finite, above 0, at most MAX_SHARE); the next pass ranks by it.
    False when the team already had it: no action, so no audit entry (a double submit, a stale page)."""
    if not (math.isfinite(share) and 0 < share <= MAX_SHARE):
        raise ValueError(f"a share is a number above 0 and at most {MAX_SHARE:g}")
    team = Team.objects.select_for_update().get(id=team_id)
    if team.share == share:
        return False
    before = {"share": team.share}
    Team.objects.filter(id=team_id).update(share=share)
    audit.record(
        actor=actor, action="team.share", target=f"team:{team.slug}", before=before, after={"share": share}, now=now
    )  # fmt: skip
    dispatch.request_scheduler_pass()
    return True


@transaction.atomic
def set_team_egress(*, team_id: int, allowed: bool, actor, now: datetime) -> bool:
    """Lets a team's jobs reach the internet (never the platform or private ranges), or takes it back;
    attempts that start afterwards are wired accordingly. False when the team already had it (no audit entry)."""
    team = Team.objects.select_for_update().get(id=team_id)
    if team.egress_allowed == allowed:
        return False
    before = {"egress_allowed": team.egress_allowed}
    Team.objects.filter(id=team_id).update(egress_allowed=allowed)
    audit.record(
        actor=actor, action="team.egress", target=f"team:{team.slug}", before=before,
        after={"egress_allowed": allowed}, now=now,
    )  # fmt: skip
    return True


# --------------------------------------------------------------------------- health probes


def record_probe(*, name: str, ok: bool, detail: str, now: datetime) -> HealthProbe:
    """Stores the latest result of a periodic check (one row per check, overwritten)."""
    probe, _ = HealthProbe.objects.update_or_create(
        name=name, defaults={"ok": ok, "detail": detail, "at": now}
    )
    return probe


def beat_heartbeat(*, now: datetime) -> HealthProbe:
    """Beat's sign of life: written by a periodic task, so a fresh row means beat is running. The row
    keeps when this run of beat started, so checks that beat runs less often are not overdue on a fresh start."""
    previous = HealthProbe.objects.filter(name="beat").first()
    running = previous is not None and now - previous.at <= health.beat_silence_limit()
    since = (health.beat_up_since(previous) if running else None) or now
    return record_probe(name="beat", ok=True, detail=f"{health.UP_SINCE}{since.isoformat()}", now=now)


def check_ledger(*, now: datetime, actor=None) -> HealthProbe:
    """Runs metering's invariant check and stores its verdict; audited when an operator asked for it."""
    violations = metering.find_violations(now=now)
    detail = "\n".join(violations[:LEDGER_DETAIL_LINES])
    if len(violations) > LEDGER_DETAIL_LINES:
        detail += (
            f"\n… and {len(violations) - LEDGER_DETAIL_LINES} more (manage.py check_ledger lists them all)"
        )
    with transaction.atomic():
        previous = HealthProbe.objects.filter(name="ledger").values("ok", "at").first()
        probe = record_probe(name="ledger", ok=not violations, detail=detail, now=now)
        if actor is not None:
            audit.record(
                actor=actor, action="health.ledger-check", target="ledger", before=previous or {},
                after={"ok": probe.ok, "violations": len(violations)}, now=now,
            )  # fmt: skip
    return probe


# --------------------------------------------------------------------------- utilisation samples


def sample_utilisation(*, now: datetime) -> UtilisationSample | None:
    """Writes the pool as of ``now``'s minute; None if that minute already has its sample."""
    minute = utilisation.minute_of(now)
    if UtilisationSample.objects.filter(minute=minute).exists():
        return None
    view = snapshot.take(now=now)
    plan = policy.plan(
        now=now.timestamp(), nodes=view.nodes, running=view.running, pending=view.pending,
        usage=view.usage, shares=view.shares, config=view.config,
    )  # fmt: skip
    figures = utilisation.measure(nodes=view.nodes, pending=view.pending, plan=plan)
    try:
        with transaction.atomic():
            sample = _store_sample(minute=minute, figures=figures, team_busy=_team_busy())
    except IntegrityError:
        return None  # a duplicate beat delivery wrote this minute meanwhile
    UtilisationSample.objects.filter(minute__lt=utilisation.minute_of(now - utilisation.RETENTION)).delete()
    return sample


def _team_busy() -> dict[int, int]:
    held = GpuHold.objects.filter(active=True).exclude(node__state=Node.NodeState.DOWN)
    rows = held.values("allocation__job__team_id").annotate(gpus=Count("id"))
    return {r["allocation__job__team_id"]: r["gpus"] for r in rows}


def _store_sample(
    *, minute: int, figures: utilisation.Figures, team_busy: dict[int, int]
) -> UtilisationSample:
    sample = UtilisationSample.objects.create(
        minute=minute, at=utilisation.at_minute(minute), total_gpus=figures.total, busy_gpus=figures.busy,
        reserved_gpus=figures.reserved, idle_while_waiting_gpus=figures.idle_while_waiting,
        queued_jobs=figures.queued, reservations=figures.reservations,
    )  # fmt: skip
    TeamBusySample.objects.bulk_create(
        TeamBusySample(sample=sample, minute=minute, team_id=team_id, busy_gpus=gpus)
        for team_id, gpus in team_busy.items()
        if gpus
    )
    return sample
