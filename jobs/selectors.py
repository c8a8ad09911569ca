"""Reads shared by pages and the API: job lists filtered and paged in the database, transfers in
flight and their progress, the staging cache, the queue's size classes, the datasets the scheduler
plans with, delivered outputs read back. Nothing here writes.
"""

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import unquote, urlsplit

from django.conf import settings
from django.db.models import Count, F, Max, OuterRef, Prefetch, Q, QuerySet, Subquery, Sum
from django.db.models.functions import Coalesce

from accounts import scoping
from accounts.models import Team
from jobs import beneath, declaration, sharing, signals, transfers
from jobs.lifecycle import AFTER_ANY, AFTER_OK, ALIVE, BEFORE_RENT, TERMINAL, EndReason, State
from jobs.models import (
    Allocation,
    DataInput,
    DatasetCacheEntry,
    Dependency,
    GpuMinute,
    GpuUseSummary,
    ImageCacheEntry,
    ImagePull,
    Job,
    JobEvent,
    NodeGpu,
    OutputFile,
    OutputTransfer,
)
from jobs.scheduling import prediction
from jobs.transfers import sources

ALIVE_STATES = [s.value for s in ALIVE]
# The scheduler's ranking (unranked jobs last, oldest first); id breaks ties, as an array's tasks share
# submitted_at, so a job is listed on exactly one page.
QUEUE_ORDER = (F("priority").desc(nulls_last=True), "submitted_at", "id")
# The queue's size classes by GPU count; the members' queue and the operators' queue filter alike.
SIZE_CLASSES = {"1": (1, 1), "2-4": (2, 4), "5-8": (5, 8), ">8": (9, 10**6)}


def of_size(jobs: QuerySet, size: str) -> QuerySet:
    """The jobs whose GPU count falls in the size class; an unknown class filters nothing."""
    if size not in SIZE_CLASSES:
        return jobs
    low, high = SIZE_CLASSES[size]
    return jobs.filter(gpus__gte=low, gpus__lte=high)


# --------------------------------------------------------------------------- transfers


def eta_s(item: DataInput | ImagePull | OutputTransfer) -> float | None:
    """Seconds left for an input being staged or outputs being delivered, from the rate so far."""
    total = getattr(item, "bytes_total", None) or getattr(item, "bytes", 0)
    if getattr(item, "stage_state", "staging") != "staging" or not item.rate_bytes_s:
        return None
    return max(0.0, (total - item.bytes_done) / item.rate_bytes_s)


def current_deliveries(job: Job) -> list[OutputTransfer]:
    """The current attempt's delivery rows (one per node part), oldest part first."""
    return list(job.output_transfers.filter(allocation__attempt=job.attempt))


def staging_in_flight() -> QuerySet:
    """Every input of a staging job that is being copied or waiting for a slot or a shared fill."""
    return (
        DataInput.objects.filter(job__state=State.STAGING, stage_state__in=("staging", "waiting"))
        .select_related("job", "job__team")
        .order_by("job_id", "position")
    )


def images_in_flight() -> QuerySet:
    """Every image a staging job is pulling or waiting for (another job's pull of the same image)."""
    return (
        ImagePull.objects.filter(job__state=State.STAGING, stage_state__in=("staging", "waiting"))
        .select_related("job", "job__team")
        .order_by("job_id")
    )


def deliveries_in_flight() -> QuerySet:
    """Deliveries waiting for a slot or copying now, for the operators' transfers page."""
    return (
        OutputTransfer.objects.filter(state__in=(OutputTransfer.WAITING, OutputTransfer.DELIVERING))
        .select_related("job", "job__team", "allocation__node")
        .order_by("updated_at")
    )


# --------------------------------------------------------------------------- the staging cache


def total_bytes(*entries: QuerySet) -> int:
    """The bytes of every row of ``entries`` (cache entries, datasets or images), summed in the database."""
    return sum(rows.aggregate(total=Sum("bytes"))["total"] or 0 for rows in entries)


def cache_bytes() -> int:
    """Datasets and images in the staging cache: one capacity holds both."""
    return total_bytes(DatasetCacheEntry.objects.all(), ImageCacheEntry.objects.all())


def cache_summary() -> dict:
    """The configured policy and what the cache holds now, for the transfers and job pages."""
    pinned_ids = DatasetCacheEntry.objects.filter(inputs__job__state__in=ALIVE_STATES).values("id")
    pinned = total_bytes(DatasetCacheEntry.objects.filter(id__in=pinned_ids))
    return {
        "capacity_bytes": settings.E31_STAGE_CACHE_BYTES,
        "retention_s": settings.E31_STAGE_RETENTION_S,
        "used_bytes": cache_bytes(),
        "pinned_bytes": pinned,
        "entries": DatasetCacheEntry.objects.filter(state=DatasetCacheEntry.READY).count(),
        "concurrency": settings.E31_STAGE_CONCURRENCY,
    }


def job_datasets(job_ids: list[int]) -> dict[int, frozenset[str]]:
    """Cache keys of each job's staged datasets (the scheduler's ``PendingJob.datasets``)."""
    keys: dict[int, set[str]] = {}
    rows = DatasetCacheEntry.objects.filter(state=DatasetCacheEntry.READY, inputs__job_id__in=job_ids)
    for job_id, key in rows.values_list("inputs__job_id", "key"):
        keys.setdefault(job_id, set()).add(key)
    return {job_id: frozenset(k) for job_id, k in keys.items()}


# --------------------------------------------------------------------------- job lists


# Groups of states, so a script can ask for what still waits or runs without naming each state.
STATE_GROUPS = {"alive": ALIVE, "waiting": BEFORE_RENT, "finished": TERMINAL}
STATE_CHOICES = (*STATE_GROUPS, *(s.value for s in State))
ENDED_CHOICES = tuple(reason.value for reason in EndReason)  # how a job ended: what its badge says
NAME_SEARCH_MAX = 120


@dataclass(frozen=True)
class JobFilters:
    """What a list of jobs is narrowed to; every field is optional."""

    state: str = ""
    ended: str = ""  # an end reason: only the jobs that ended that way
    name: str = ""
    team: str = ""
    since: datetime | None = None
    until: datetime | None = None
    array: int | None = None  # one array's tasks only
    arrays_folded: bool = False  # an array shows as one row: its first task's
    before: int | None = None  # only jobs listed after this one (a cursor: the last of the page before)


class UnknownCursor(ValueError):
    """``before`` names no job the caller can see."""


def visible_jobs(user) -> QuerySet[Job]:
    """The jobs ``user`` may see, newest first (the (team, submitted_at, id) index serves this order)."""
    return scoping.visible_to(user, Job.objects.select_related("team")).order_by("-submitted_at", "-id")


def filtered(jobs: QuerySet[Job], filters: JobFilters) -> QuerySet[Job]:
    if filters.before is not None:  # first: the cursor's job may have left the other filters since
        jobs = after_cursor(jobs, filters.before)
    if filters.state in STATE_GROUPS:
        jobs = jobs.filter(state__in=STATE_GROUPS[filters.state])
    elif filters.state:
        jobs = jobs.filter(state=filters.state)
    if filters.ended:
        jobs = jobs.filter(state__in=TERMINAL, end_reason=filters.ended)
    if filters.name:
        jobs = jobs.filter(name__icontains=filters.name[:NAME_SEARCH_MAX])
    if filters.team:
        jobs = jobs.filter(team__slug=filters.team)
    if filters.since:
        jobs = jobs.filter(submitted_at__gte=filters.since)
    if filters.until:
        jobs = jobs.filter(submitted_at__lt=filters.until)
    if filters.array is not None:  # its tasks run again on their own too
        jobs = jobs.filter(Q(array_id=filters.array) | Q(array__limit_of_id=filters.array))
    elif filters.arrays_folded:
        jobs = jobs.filter(Q(array__isnull=True) | Q(array_index=F("array__first_index")))
    return jobs


def after_cursor(jobs: QuerySet[Job], job_id: int) -> QuerySet[Job]:
    """The jobs after ``job_id`` in the list's order (newest first): read page after page this way, a job that
    leaves a filter, or a new one, shifts nothing, where an offset skipped or repeated rows."""
    anchor = jobs.filter(id=job_id).values_list("submitted_at", flat=True).first()
    if anchor is None:
        raise UnknownCursor(f"before: no job {job_id} among yours")
    return jobs.filter(Q(submitted_at__lt=anchor) | Q(submitted_at=anchor, id__lt=job_id))


def array_states(array_ids) -> dict[int, dict[str, int]]:
    """Per array, how many of its tasks are in each state (one query for a page of arrays)."""
    out: dict[int, dict[str, int]] = {}
    rows = (
        Job.objects.filter(array_id__in=list(array_ids))
        .values_list("array_id", "state")
        .annotate(n=Count("id"))
    )
    for array_id, state, n in rows.order_by():
        out.setdefault(array_id, {})[state] = n
    return out


def array_outcomes(array_ids) -> dict[int, dict[str, int]]:
    """Per array, how many of its tasks are in each live state, and how many ended each way ("succeeded",
    "cancelled", "timed out"...), live states first (one query for a page of arrays): what its pages say."""
    out: dict[int, dict[str, int]] = {}
    rows = (
        Job.objects.filter(array_id__in=list(array_ids))
        .values_list("array_id", "state", "end_reason")
        .annotate(n=Count("id"))
    )
    for array_id, state, end_reason, n in sorted(rows.order_by(), key=_live_first):
        key = state if state in ALIVE_STATES else (end_reason or state).replace("_", " ")
        tasks = out.setdefault(array_id, {})
        tasks[key] = tasks.get(key, 0) + n
    return out


def _live_first(row: tuple) -> tuple:
    _, state, end_reason, _ = row
    if state in ALIVE_STATES:
        return (0, ALIVE_STATES.index(state), "")
    return (1, end_reason != "succeeded", end_reason)


def array_stopping(array_id: int) -> bool:
    """Whether a task of the array (its tasks run again on their own included) is live with a cancel asked for."""
    tasks = Job.objects.filter(Q(array_id=array_id) | Q(array__limit_of_id=array_id))
    return tasks.filter(state__in=ALIVE, cancel_requested_at__isnull=False).exists()


def job_list(user, filters: JobFilters) -> QuerySet[Job]:
    """The team's job list, filtered in SQL; callers slice it, so only one page is ever read."""
    return with_canceller(filtered(visible_jobs(user), filters))


def with_canceller(jobs: QuerySet[Job]) -> QuerySet[Job]:
    """Adds ``cancelled_by``: who asked to cancel each job (the actor of its first cancel event), for its badge."""
    cancels = JobEvent.objects.filter(job_id=OuterRef("pk"), reason__startswith="cancel").order_by("at", "id")
    return jobs.annotate(cancelled_by=Subquery(cancels.values("actor")[:1]))


# The dependents the API lists per job: the first, by id (``dependents_total`` counts them all).
DEPENDENTS_LISTED = 100
_dependents_count = (
    Dependency.objects.filter(prerequisite=OuterRef("pk"))
    .order_by()
    .values("prerequisite")
    .annotate(n=Count("*"))
).values("n")


def with_details(jobs: QuerySet[Job]) -> QuerySet[Job]:
    """Everything the API's job JSON reads, fetched per page in a fixed number of queries, as plain
    lists on each job (``detail_*``): a related manager and a queryset clone per job and relation
    cost more than the queries themselves on a page of 100 jobs."""
    return jobs.prefetch_related(
        Prefetch("inputs", to_attr="detail_inputs"), Prefetch("events", to_attr="detail_events"), "image_pull",
        Prefetch("allocations", queryset=Allocation.objects.select_related("node"), to_attr="detail_allocations"),
        Prefetch("prerequisites", to_attr="detail_prerequisites"),
        # A page of each job's dependents (any number may wait for one), and how many there are in all.
        Prefetch("dependents", Dependency.objects.order_by("job_id")[:DEPENDENTS_LISTED], to_attr="detail_dependents"),
    ).annotate(dependents_total=Coalesce(Subquery(_dependents_count), 0))  # fmt: skip


class OutputUnavailable(Exception):
    """The file is not among the job's sealed outputs (status 404), not at its destination yet (409), or the list
    of the job's files was removed with its log (410)."""

    def __init__(self, message: str, *, status: int = 404) -> None:
        super().__init__(message)
        self.status = status


def open_delivered_output(job: Job, path: str):
    """A file the job's current attempt sealed, read back from that attempt's delivery folder.

    Only a path of the attempt's manifest is read, and a file:// folder only under the team's own
    prefix of an output root, and below that prefix no link is followed, not even one swapped in while the
    path is opened: a link planted at the destination leads nowhere else.
    """
    if job.log_removed_at is not None and job.sealed_files:
        raise OutputUnavailable(
            f"the list of job {job.id}'s output files was removed with its log on {job.log_removed_at:%Y-%m-%d}; "
            f"the files stay at {job.delivery_uri}", status=410,
        )  # fmt: skip
    if not OutputFile.objects.filter(job_id=job.id, attempt=job.attempt, path=path).exists():
        raise OutputUnavailable(f"{path[:200]!r} is not one of job {job.id}'s outputs")
    if not job.delivered_at:
        raise OutputUnavailable(
            f"job {job.id}'s outputs are not delivered yet ({job.delivery_state or 'not sealed'})", status=409
        )
    folder = job.delivery_uri
    if urlsplit(folder).scheme == "s3":
        # Read with the console's own credentials: only a plain key under the team's prefix of a root.
        prefixes = sharing.s3_prefixes(job.team.slug)
        try:
            key = declaration.s3_object(folder, path, prefixes)
        except declaration.OutsideTeamPrefix as exc:
            raise OutputUnavailable(str(exc)) from exc
        try:
            return sources.filesystem_for(folder).open(key, "rb")
        except transfers.TransferFailed as exc:  # this console cannot read s3:// (its nodes can)
            raise OutputUnavailable(f"the console cannot read this output: {exc}", status=503) from exc
        except OSError as exc:  # removed from the bucket since, or the console's credentials refused
            raise OutputUnavailable(f"{path[:200]!r} is no longer at the destination ({exc})") from exc
    try:
        fd = _open_delivered_file(folder, path, team=job.team.slug)
    except OSError as exc:
        # Gone, a link or a FIFO swapped in, a folder renamed mid-walk: not there (404), never a 500.
        raise OutputUnavailable(f"{path[:200]!r} is no longer at the destination") from exc
    return os.fdopen(fd, "rb")


def _open_delivered_file(folder: str, path: str, *, team: str) -> int:
    """The file opened beneath the attempt's folder, itself opened from the team's prefix, one name at a time
    without following a link: a folder swapped for a link after a check by name would be read through."""
    if declaration.file_uri_suffix_problem(
        folder
    ):  # delivered before intake refused it: another job's folder
        raise FileNotFoundError(folder)
    prefixes = declaration.team_prefixes(settings.E31_OUTPUT_ROOTS, team)
    root = declaration.resolve_under_roots(unquote(urlsplit(folder).path), prefixes)
    if root is None:
        raise FileNotFoundError(folder)
    with beneath.closing(beneath.open_under(root, prefixes)) as root_fd:
        return beneath.open_regular(root_fd, path)


def attempt_gpus(allocation: Allocation) -> int:
    """The GPUs the allocation's attempt holds on all its nodes (an elastic job may hold fewer than declared)."""
    rows = Allocation.objects.filter(job_id=allocation.job_id, attempt=allocation.attempt)
    return sum(len(indices) for indices in rows.values_list("gpu_indices", flat=True))


def learned_run_times(team_names) -> dict[str, prediction.Learned]:
    """Each team's learned run-time ratio from its own last finished jobs (one query per team)."""
    ids = dict(Team.objects.filter(name__in=set(team_names)).values_list("name", "id"))
    return {name: _learned(ids.get(name)) for name in set(team_names)}


def _learned(team_id: int | None) -> prediction.Learned:
    history = [
        prediction.Finished(
            run_s=(finished - started).total_seconds(), declared_hours=hours, end_reason=reason
        )
        for started, finished, hours, reason in reversed(finished_runs(team_id))
    ]
    return prediction.learn(history, min_jobs=settings.E31_PREDICTION_MIN_JOBS)


def finished_runs(team_id: int | None) -> QuerySet:
    """(started, finished, declared hours, end reason) of the team's last jobs released after a run that tells a
    run time (``prediction.TEACHES``: succeeded, or stopped at its limit; never one that failed, was cancelled or
    lost its node, which a team could end within seconds at will), newest release first: read from the index of
    the jobs that ran to their end, which holds them (by the team's id, not its name, or the planner walks every
    team's releases)."""
    return (
        Allocation.objects.filter(
            job__team_id=team_id, job__state=State.RELEASED, job__end_reason__in=prediction.TEACHES,
            attempt=F("job__attempt"), rank=0, started_at__isnull=False, finished_at__isnull=False,
        )
        .order_by("-job__state_changed_at", "-job_id")
        .values_list("started_at", "finished_at", "job__hours", "job__end_reason")[: prediction.WINDOW]
    )  # fmt: skip


@dataclass(frozen=True)
class PlannedRun:
    """The run time the scheduler plans a job with, its declared limit, and why."""

    hours: float
    limit_hours: float
    reason: str


def planned_run(*, team_id: int, hours: float, started_at: datetime | None, now: datetime) -> PlannedRun:
    """What the scheduler plans a job (or a draft) of team ``team_id`` with: its team's learned run
    time, extended once a running job outran it, never past the declared ``hours``."""
    learned = _learned(team_id)
    if started_at is None:
        return PlannedRun(learned.predict_hours(hours), hours, learned.reason())
    start = started_at.timestamp()
    end = prediction.planned_end(learned, started_at=start, limit_s=hours * 3600, now=now.timestamp())
    planned = (end - start) / 3600
    reason = learned.reason()
    if planned > learned.predict_hours(hours) + 1e-9:
        reason += "; extended, as the job ran past its prediction"
    return PlannedRun(planned, hours, reason)


@dataclass(frozen=True)
class TeamFolders:
    """Where a team's file:// and s3:// URIs may point, as the form shows them."""

    team: str
    data: list[str]
    output: list[str]
    default_destination: str
    s3: list[str]  # its prefix of each S3 root, inputs and destinations alike (none: s3:// is refused)

    @property
    def example_destination(self) -> str:
        return self.default_destination or next(iter(self.s3), "")


def team_folders(team_slug: str) -> TeamFolders:
    """The team's folder of each data and output root, and where a job naming no destination delivers."""
    return TeamFolders(
        team=team_slug,
        data=[f"{root / team_slug}/" for root in settings.E31_DATA_ROOTS],
        output=[f"{root / team_slug}/" for root in settings.E31_OUTPUT_ROOTS],
        default_destination=declaration.default_destination(settings.E31_OUTPUT_ROOTS, team_slug),
        s3=sharing.s3_prefixes(team_slug),
    )


def present_gpus(gpus_by_node: Mapping[int, int]) -> dict[int, tuple[int, ...]]:
    """The GPU indices each node (id -> its GPU count) offers; one registered without a GPU list: 0..count-1."""
    listed: dict[int, list[int]] = {}
    rows = NodeGpu.objects.filter(node_id__in=list(gpus_by_node)).values_list("node_id", "index", "present")
    for node_id, index, present in rows.order_by("node_id", "index"):
        listed.setdefault(node_id, [])
        if present:
            listed[node_id].append(index)
    return {node_id: tuple(listed.get(node_id, range(count))) for node_id, count in gpus_by_node.items()}


def declaration_of(job: Job) -> declaration.Declaration:
    """The whole declaration a stored job was submitted with: what an operator's requeue submits as it is,
    and (``declaration.as_mapping``) what a re-run checks and submits again, or fills the form with."""
    return declaration.Declaration(
        name=job.name, argv=list(job.argv), env=dict(job.env), image=job.image, workdir=job.workdir,
        secrets=list(job.secrets),
        data=[
            declaration.DataInput(name=d.name, uri=d.uri, bytes=d.bytes, sha256=d.sha256)
            for d in job.inputs.order_by("position")
        ],
        gpus=job.gpus, gpu_model=job.gpu_model, hours=job.hours, min_gpus=job.min_gpus, max_gpus=job.max_gpus,
        preemptible=job.preemptible, requeue=job.requeue, checkpoint=_checkpoint_of(job),
        memory_bytes=job.memory_bytes, cpus=job.cpus, output_uri=job.output_uri, output_bytes=job.output_bytes,
        array=_task_of(job), **_prerequisites_of(job),
    )  # fmt: skip


def _prerequisites_of(job: Job) -> dict[str, tuple[int, ...]]:
    """A pipeline step waits for the same jobs again: a copy that did not would read their outputs
    before they were written, or not at all (intake refuses one that can no longer be met, naming it)."""
    rows = job.prerequisites.order_by("prerequisite_id").values_list("prerequisite_id", "kind")
    return {kind: tuple(p for p, k in rows if k == kind) for kind in (AFTER_OK, AFTER_ANY)}


def _task_of(job: Job) -> declaration.Array | None:
    """A task of an array comes back as a one-task array of its own index: its program reads
    $E31_ARRAY_INDEX to pick its share of the work, so a re-run without it would do other work."""
    if job.array_id is None:
        return None
    return declaration.Array(indices=(job.array_index,), text=str(job.array_index))


def _checkpoint_of(job: Job) -> declaration.Checkpoint | None:
    if not job.checkpoint_signal:
        return None
    return declaration.Checkpoint(
        signal=job.checkpoint_signal,
        grace_s=job.checkpoint_grace_s or declaration.DEFAULT_GRACE_S,
        bytes=job.checkpoint_bytes or declaration.DEFAULT_CHECKPOINT_BYTES,
    )


def running_allocations(*, node_name: str) -> dict[int, list[int]]:
    """The allocations whose process runs on the node now, with their GPU indices (what its agent samples)."""
    rows = Allocation.objects.filter(
        node__name=node_name, started_at__isnull=False, finished_at__isnull=True, released_at__isnull=True
    ).values_list("id", "gpu_indices")
    return dict(rows)


@dataclass(frozen=True)
class GpuUse:
    """How busy the GPUs a job (or one allocation) held were, from its agents' minute summaries."""

    virtual: bool  # every GPU it held was virtual: there is nothing to measure
    samples: int
    utilisation: float | None  # percent, averaged over every sample of every GPU it held
    utilisation_max: float | None = None
    memory_used_max_bytes: int | None = None
    power_avg_w: float | None = None
    temperature_max_c: float | None = None

    def __str__(self) -> str:
        if self.virtual:
            return "no metrics (virtual)"
        return f"{self.utilisation:.0f} %" if self.samples else "no GPU samples"


def gpu_use_by_job(job_ids: Sequence[int]) -> dict[int, GpuUse]:
    """Each job's GPU use over all its attempts (two queries, whatever the number of jobs)."""
    held = Allocation.objects.filter(job_id__in=job_ids).values("job_id")
    virtual = {
        row["job_id"]: row["real"] == 0
        for row in held.annotate(real=Count("id", filter=~Q(node__gpu_source=VIRTUAL_GPUS)))
    }
    minutes = GpuMinute.objects.filter(allocation__job_id__in=job_ids).values("allocation__job_id")
    folded = GpuUseSummary.objects.filter(allocation__job_id__in=job_ids).values("allocation__job_id")
    summed = _merged(minutes.annotate(**_USE).order_by(), folded.annotate(**_FOLDED).order_by())
    return {job_id: _gpu_use(virtual.get(job_id, False), summed.get(job_id)) for job_id in job_ids}


def gpu_use_by_allocation(allocations: Sequence[Allocation]) -> dict[int, GpuUse]:
    """Each allocation's GPU use (its node is read from the allocation: select_related it)."""
    ids = [a.id for a in allocations]
    minutes = GpuMinute.objects.filter(allocation_id__in=ids).values("allocation_id")
    folded = GpuUseSummary.objects.filter(allocation_id__in=ids).values("allocation_id")
    summed = _merged(minutes.annotate(**_USE).order_by(), folded.annotate(**_FOLDED).order_by())
    return {a.id: _gpu_use(a.node.gpu_source == VIRTUAL_GPUS, summed.get(a.id)) for a in allocations}


VIRTUAL_GPUS = "virtual"  # a node's gpu_source when its agent serves made-up GPUs
# Named apart from the fields they sum: an annotation named as a field would shadow it in F().
_USE = {
    "sampled": Sum("samples"), "weighted": Sum(F("utilisation_avg") * F("samples")),
    "peak": Max("utilisation_max"), "memory_peak": Max("memory_used_max_bytes"),
    "power": Sum("power_avg_w"), "powered": Count("power_avg_w"), "hottest": Max("temperature_max_c"),
}  # fmt: skip
# The same figures from the minutes already pruned (gpu_usage.prune_gpu_minutes), in the same order.
_FOLDED = {
    "sampled": Sum("samples"), "weighted": Sum("utilisation_weighted"), "peak": Max("utilisation_max"),
    "memory_peak": Max("memory_used_max_bytes"), "power": Sum("power_sum_w"), "powered": Sum("power_minutes"),
    "hottest": Max("temperature_max_c"),
}  # fmt: skip
_ADDED = ("sampled", "weighted", "power", "powered")


def _merged(minutes: QuerySet, folded: QuerySet) -> dict[int, dict]:
    """Kept minutes and pruned ones, by the first column, in one query: sums add up, peaks keep the higher."""
    merged: dict[int, dict] = {}
    for row in minutes.union(folded, all=True):
        key = row.pop(next(iter(row)))
        have = merged.setdefault(key, dict.fromkeys(row))
        for name, value in row.items():
            if name in _ADDED:
                have[name] = (have[name] or 0) + (value or 0)
            elif value is not None and (have[name] is None or value > have[name]):
                have[name] = value
    return merged


def _gpu_use(virtual: bool, row: dict | None) -> GpuUse:
    if virtual or not row or not row["sampled"]:
        return GpuUse(virtual=virtual, samples=0, utilisation=None)
    power = row["power"] / row["powered"] if row["powered"] else None
    return GpuUse(
        virtual=False, samples=int(row["sampled"]), utilisation=row["weighted"] / row["sampled"],
        utilisation_max=row["peak"], memory_used_max_bytes=row["memory_peak"], power_avg_w=power,
        temperature_max_c=row["hottest"],
    )  # fmt: skip


def budget_room_for_more_gpus(
    *, team: Team, gpus: int, extra: int, hours: float, now: datetime, queued: bool
) -> int:
    """How many of ``extra`` GPUs past the ``gpus`` a job requested its team's enforced monthly budget leaves room
    for over its ``hours``: the submission weighed only the request. ``queued``: the job is counted already (at
    RENT, under the team's ledger lock); else it is a draft, counted with them."""
    asked = (extra if queued else gpus + extra) * hours
    check = signals.check_budget(team=team, gpu_hours=asked, now=now)
    if check is None or not check.refused or check.left_gpu_hours is None:
        return extra
    room = check.left_gpu_hours + extra * hours  # what was left before the extra GPUs
    return max(0, min(extra - 1, int(room / hours + 1e-9)))  # refused at ``extra``: fewer fit
