"""Dry runs of the scheduling policy for a draft job: when would it start, and what would be sooner.

The submit form shows these before anything is stored, so a team sees what declaring fewer hours,
fewer GPUs or an elastic range would change.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.template.defaultfilters import pluralize

from jobs import selectors, snapshot
from jobs.scheduling import policy, types

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


def draft_options(
    *,
    team: str,
    gpus: int,
    hours: float,
    min_gpus: int | None,
    preemptible: bool,
    now: datetime,
    max_gpus: int | None = None,
) -> list[Option]:
    """The draft as declared, then the variations that could start it sooner."""
    view = snapshot.take(now=now)
    learned = selectors.learned_run_times([team])[team]
    variants = [("as declared", gpus, hours, min_gpus)]
    if hours > 0.5:
        variants.append((f"with a {hours / 2:g} h limit", gpus, hours / 2, min_gpus))
    if gpus > 1:
        half = gpus // 2
        variants.append((f"with {half} GPU{pluralize(half)}", half, hours, None))
        if not min_gpus:
            variants.append((f"elastic, {half}-{gpus} GPUs", gpus, hours, half))
    return [
        _estimate(view, team, label, g, h, m, preemptible, now, learned, max_gpus if i == 0 else None)
        for i, (label, g, h, m) in enumerate(variants)
    ]


def _estimate(view, team, label, gpus, hours, min_gpus, preemptible, now, learned, max_gpus=None) -> Option:
    draft = types.PendingJob(
        job_id=DRAFT_ID, team=team, gpus=gpus, hours=learned.predict_hours(hours), submitted_at=now.timestamp(),
        min_gpus=min_gpus, preemptible=preemptible, max_gpus=max_gpus,
    )  # fmt: skip
    plan = policy.plan(
        now=now.timestamp(), nodes=view.nodes, running=view.running, pending=[*view.pending, draft],
        usage=view.usage, shares=view.shares, config=view.config,
    )  # fmt: skip
    estimate = plan.estimates.get(DRAFT_ID)
    started = [s for s in plan.starts if s.job_id == DRAFT_ID]
    if started:
        held = types.gpus_held(started[0].gpus_by_node)
        wider = f" with {held} GPUs (elastic, up to {max_gpus})" if held > gpus else ""
        return Option(
            label,
            gpus,
            hours,
            min_gpus,
            now,
            f"GPUs are free: it would start{wider} as soon as its data is staged",
        )
    if estimate is None:
        return Option(label, gpus, hours, min_gpus, None, "no estimate")
    start = None if estimate.start_at is None else datetime.fromtimestamp(estimate.start_at, now.tzinfo)
    return Option(label, gpus, hours, min_gpus, start, estimate.reason)


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
