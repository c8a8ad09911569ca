"""Dry runs of the scheduling policy for a draft job: when would it start, and what would be sooner.

The submit form shows these before anything is stored, so a team sees what declaring fewer hours,
fewer GPUs or an elastic range would change.
"""

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from django.template.defaultfilters import pluralize

from jobs import declaration, dependencies, selectors, services, snapshot
from jobs.scheduling import policy, prediction, types

DRAFT_ID = -1


@dataclass(frozen=True)
class Option:
    label: str
    gpus: int
    hours: float
    min_gpus: int | None
    start_at: datetime | None
    reason: str

    def wait(self, now: datetime) -> timedelta | None:
        return None if self.start_at is None else max(timedelta(0), self.start_at - now)


# What the estimate does not read, checked when the job is submitted: stood in for while the form is filled in.
STOOD_IN = {"name": "draft", "work": {"argv": ["true"]}}


def draft_declaration(raw: dict, *, team, limits: declaration.Limits) -> declaration.Declaration:
    """The draft as submitting validates it, its name, work and destination stood in for, and an expected output
    size not given yet counted as none. Raises DeclarationInvalid with what submitting would refuse in the rest,
    in its words: the request, the data, the prerequisites (one that is not the team's job too) and the array."""
    output = raw.get("output") or {}
    destination = _stood_in_destination(output.get("uri"), limits)
    spec = declaration.validate(
        {**raw, **STOOD_IN, "output": {"uri": destination, "bytes": output.get("bytes") or 0}}, limits=limits
    )
    dependencies.check_prerequisites(team=team, after_ok=spec.after_ok, after_any=spec.after_any)
    return spec


def _stood_in_destination(typed: object, limits: declaration.Limits) -> object:
    """A destination the estimate (which does not read it) can validate: the team's default folder (empty: taken
    as it), else an object under its first S3 prefix; the one typed only where the pool delivers nowhere, so the
    preview says what submitting would say of any destination."""
    if declaration.default_destination(limits.output_roots, limits.team):
        return ""
    if limits.s3_roots and limits.team is not None:
        return declaration.s3_team_prefixes(limits.s3_roots, limits.team)[0] + "draft"
    return typed


def draft_job(spec: declaration.Declaration, *, team, now: datetime) -> types.PendingJob:
    """The waiting job that submitting ``spec`` now would put before the scheduler: the columns submitting stores,
    read as the pass reads them, with its inputs still to stage and the prerequisites it would wait for."""
    waits = dependencies.waits_of(team=team, after_ok=spec.after_ok, after_any=spec.after_any)
    staged = snapshot.staged_at((d.bytes for d in spec.data), now=now)
    return snapshot.pending_job(
        services.declared_fields(spec), job_id=DRAFT_ID, team=team.name, submitted_at=now.timestamp(),
        ready_at=staged, waits_for=waits, stage_s=staged - now.timestamp() if staged and waits else 0.0,
    )  # fmt: skip


def draft_options(*, draft: types.PendingJob, team, now: datetime) -> list[Option]:
    """The draft as declared, then the variations that could start it sooner."""
    view = snapshot.take(now=now)
    learned = selectors.learned_run_times([draft.team])[draft.team]
    gpus, hours = draft.gpus, draft.hours
    variants = [("as declared", draft)]
    if hours > 0.5:
        variants.append((f"with a {hours / 2:g} h limit", replace(draft, hours=hours / 2, max_gpus=None)))
    if gpus > 1:
        half = gpus // 2
        variants.append(
            (f"with {half} GPU{pluralize(half)}", replace(draft, gpus=half, min_gpus=None, max_gpus=None))
        )
        if not draft.min_gpus:
            variants.append((f"elastic, {half}-{gpus} GPUs", replace(draft, min_gpus=half, max_gpus=None)))
    return [_estimate(view, label, job, team, now, learned) for label, job in variants]


def _estimate(view, label: str, job: types.PendingJob, team, now: datetime, learned) -> Option:
    planned = prediction.planned(job, learned)  # as the pass plans it: ranked by its declared hours
    plan = policy.plan(
        now=now.timestamp(), nodes=view.nodes, running=view.running, pending=[*view.pending, planned],
        usage=view.usage, shares=view.shares, config=view.config,
    )  # fmt: skip
    estimate = plan.estimates.get(DRAFT_ID)
    started = [s for s in plan.starts if s.job_id == DRAFT_ID]
    declared = (label, job.gpus, job.hours, job.min_gpus)
    if started:
        wider = _wider(job, types.gpus_held(started[0].gpus_by_node), team=team, now=now)
        return Option(*declared, now, f"GPUs are free: it would start{wider} as soon as its data is staged")
    if estimate is None:
        return Option(*declared, None, "no estimate")
    start = None if estimate.start_at is None else datetime.fromtimestamp(estimate.start_at, now.tzinfo)
    return Option(*declared, start, estimate.reason)


def _wider(job: types.PendingJob, held: int, *, team, now: datetime) -> str:
    """How much wider than requested an elastic draft would start, as far as an enforced budget lets it."""
    if held <= job.gpus:
        return ""
    extra = held - job.gpus
    more = selectors.budget_room_for_more_gpus(
        team=team, gpus=job.gpus, extra=extra, hours=job.hours, now=now, queued=False
    )
    if more == extra:
        return f" with {held} GPUs (elastic, up to {job.max_gpus})"
    return f" with {job.gpus + more} GPUs (elastic, up to {job.max_gpus}; the team's enforced budget has room for no more)"


def what_checkpointing_buys(*, declared: bool) -> str:
    """The draft's line on pausing: what its checkpoint buys, or what declaring one would."""
    if declared:
        return (
            "preemptible, so it may run on GPUs a reservation will need; when one does, it is stopped before "
            "jobs that do not checkpoint, loses at most the work since its last checkpoint, and resumes from it"
        )
    return (
        "declare a checkpoint signal and this job may also run on GPUs a reservation will need; stopped for "
        "one, it would resume from its last checkpoint instead of starting over"
    )
