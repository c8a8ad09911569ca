"""Jobs that run after others: prerequisites checked at intake, dependents ended when one fails.

A prerequisite is an older job of the submitting team (the database refuses any other order, so no
cycle can form). While one is left the scheduler holds the dependent back (``snapshot`` states the
facts, the policy's ``gates`` decide); this module is the writer that ends a dependent whose
``after_ok`` prerequisite ended without success, before any pass could place it.

An operator's requeue of a waiting job replaces it: ``operations.services.requeue_job`` cancels it, submits
its copy and names the copy in its ``replaced_by``, in one transaction. Its dependents' rows cannot move to the
copy (the copy is younger than they are, and the database keeps every prerequisite older than its job), so
every reader here takes a replaced prerequisite as the copy that stands for it (``_standing``).
"""

from collections.abc import Iterable
from datetime import datetime
from operator import itemgetter

from django.db.models import QuerySet

from jobs import declaration, lifecycle
from jobs.lifecycle import BEFORE_RENT, EndReason, State
from jobs.models import Dependency, Job, JobEvent
from jobs.transitions import transition

# What a dependent reads of a prerequisite (``lifecycle.prerequisite_outcome``'s facts, and when it ended).
_FACTS = ("state", "end_reason", "delivery_state", "state_changed_at")


def check_prerequisites(*, team, after_ok: Iterable[int], after_any: Iterable[int]) -> None:
    """Refuses ids that are not the team's jobs (worded as for a job that does not exist, so another
    team's ids reveal nothing), and an ``after_ok`` on a job that already ended without success."""
    named = [
        *(("after_ok", i, p) for i, p in enumerate(after_ok)),
        *(("after_any", i, p) for i, p in enumerate(after_any)),
    ]
    if not named:
        return
    found = _standing(
        {
            row.pop("id"): row
            for row in Job.objects.filter(team=team, id__in=[p for _, _, p in named]).values("id", *_FACTS)
        }
    )
    errors = []
    for key, i, prerequisite in named:
        if prerequisite not in found:
            errors.append((f"{key}[{i}]", f"no job {prerequisite} in your team"))
            continue
        standing, row = found[prerequisite]
        if _outcome(key, row) == lifecycle.FAILED:
            errors.append(
                (
                    f"{key}[{i}]",
                    f"job {standing} already ended {_ending(row)}: this job could never start",
                )
            )
    if errors:
        raise declaration.DeclarationInvalid(errors)


def waits_of(*, team, after_ok: Iterable[int], after_any: Iterable[int]) -> tuple[tuple[int, str], ...]:
    """What a job declaring these prerequisites would wait for if submitted now, as ``unmet`` says of a stored one
    (the submit form's preview); ids that are not the team's jobs are ``check_prerequisites``' to refuse."""
    named = _pairs(after_ok, after_any)
    if not named:
        return ()
    rows = Job.objects.filter(team=team, id__in=[p for p, _ in named]).values("id", *_FACTS)
    found = _standing({row.pop("id"): row for row in rows})
    waits = {wait for p, kind in named if p in found and (wait := _waiting(*found[p], kind))}
    return tuple(sorted(waits))


def record(*, job_ids: Iterable[int], after_ok: Iterable[int], after_any: Iterable[int]) -> None:
    """The dependency rows of newly submitted jobs (an array's tasks share their declaration's)."""
    pairs = _pairs(after_ok, after_any)
    Dependency.objects.bulk_create(
        Dependency(job_id=job_id, prerequisite_id=p, kind=kind) for job_id in job_ids for p, kind in pairs
    )


def end_unsatisfiable(*, now: datetime, limit: int | None = None) -> list[int]:
    """Ends, unmetered, every waiting job an ``after_ok`` prerequisite failed, then their own dependents; at most
    ``limit`` of them (None: all)."""
    ended: list[int] = []
    while failed := _failed_dependencies():
        for job_id, prerequisite, row in failed:
            if limit is not None and len(ended) >= limit:
                return ended
            detail = f"job {prerequisite} ended {_ending(row)}; this job ran only after it succeeded"
            if transition(
                job_id=job_id, source=BEFORE_RENT, target=State.ENDED, now=now, actor="scheduler",
                end_reason=EndReason.DEPENDENCY_FAILED, reason=detail, end_detail=detail, pending_reason="",
                estimated_start=None,
            ):  # fmt: skip
                ended.append(job_id)
    return ended


def _failed_dependencies() -> list[tuple[int, int, dict]]:
    """(dependent, prerequisite, the prerequisite's ending) for each waiting job with a failed after_ok."""
    rows = _edges(
        Dependency.objects.filter(
            kind=Dependency.AFTER_OK, job__state__in=BEFORE_RENT, prerequisite__state__in=lifecycle.TERMINAL
        )
    )
    failed, seen = [], set()
    for job_id, prerequisite, _, row in rows:
        if job_id not in seen and _outcome("after_ok", row) == lifecycle.FAILED:
            seen.add(job_id)
            failed.append((job_id, prerequisite, row))
    return failed


def ready_to_stage() -> list[int]:
    """Submitted jobs that waited for prerequisites before staging, and wait for none now."""
    held = list(
        Job.objects.filter(state=State.SUBMITTED, prerequisites__isnull=False)
        .distinct()
        .values_list("id", flat=True)
    )
    waiting = unmet(held)
    return [job_id for job_id in held if job_id not in waiting]


def unmet(job_ids: Iterable[int]) -> dict[int, tuple[tuple[int, str], ...]]:
    """Per waiting job, the prerequisites it still waits for: (id, "succeed") or (id, "end")."""
    return standing_of(job_ids)[0]


def standing_of(job_ids: Iterable[int]) -> tuple[dict[int, tuple[tuple[int, str], ...]], dict[int, datetime]]:
    """What ``unmet`` says of these jobs, and per job whose prerequisites are all met, when the last of them
    ended, in one read. A job may run only from then, so it ages only from then: held, it would otherwise bank
    the wait behind a placeholder its team ends when it likes (a cancelled prerequisite meets an after_any), and
    be ranked as if it had queued all along."""
    waits: dict[int, list[tuple[int, str]]] = {}
    ended: dict[int, datetime] = {}
    for job_id, prerequisite, kind, row in _edges(Dependency.objects.filter(job_id__in=list(job_ids))):
        if wait := _waiting(prerequisite, row, kind):
            waits.setdefault(job_id, []).append(wait)
        elif job_id not in ended or row["state_changed_at"] > ended[job_id]:
            ended[job_id] = row["state_changed_at"]
    eligible = {job_id: at for job_id, at in ended.items() if job_id not in waits}
    return {job_id: tuple(w) for job_id, w in waits.items()}, eligible


def _pairs(after_ok: Iterable[int], after_any: Iterable[int]) -> list[tuple[int, str]]:
    """(prerequisite, kind) of each job a declaration names."""
    return [*((p, Dependency.AFTER_OK) for p in after_ok), *((p, Dependency.AFTER_ANY) for p in after_any)]


def _waiting(prerequisite: int, row: dict, kind: str) -> tuple[int, str] | None:
    """(prerequisite, "succeed" or "end") while its outcome is not met yet; None once it is."""
    if _outcome(kind, row) == lifecycle.MET:
        return None
    return prerequisite, "succeed" if kind == Dependency.AFTER_OK else "end"


def note_replacement(*, copy_id: int, actor: str, now: datetime) -> list[int]:
    """An event on each waiting dependent of the jobs ``copy_id`` replaced: it waits for the copy now.
    Returns their ids. Called by the requeue that replaced them, in its transaction."""
    replaced = _replaced_by(copy_id)
    dependents = (
        Job.objects.filter(prerequisites__prerequisite_id__in=replaced, state__in=BEFORE_RENT)
        .distinct()
        .order_by("id")
        .values_list("id", "state", "attempt")
    )
    events = [
        JobEvent(
            job_id=job_id, from_state=state, to_state=state, at=now, actor=actor[:150], attempt=attempt,
            reason=f"job {replaced[1]} was requeued as job {copy_id} by {actor}: this job waits for job {copy_id} now",
        )
        for job_id, state, attempt in dependents
    ]  # fmt: skip
    JobEvent.objects.bulk_create(events)
    return [event.job_id for event in events]


def _edges(rows: QuerySet[Dependency]) -> list[tuple[int, int, str, dict]]:
    """(dependent, prerequisite, kind, the prerequisite's facts) per row, in order; a prerequisite a requeue
    replaced comes as the copy standing for it, so a dependent waits for the copy and is told of it."""
    read = rows.values_list("job_id", "prerequisite_id", "kind", *(f"prerequisite__{f}" for f in _FACTS))
    edges = [(job_id, p, kind, dict(zip(_FACTS, facts, strict=True))) for job_id, p, kind, *facts in read]
    standing = _standing({p: row for _, p, _, row in edges})
    resolved = []
    for job_id, p, kind, _ in edges:
        stand_in, row = standing[p]
        resolved.append((job_id, stand_in, kind, row))
    return sorted(resolved, key=itemgetter(0, 1))


def _standing(facts: dict[int, dict]) -> dict[int, tuple[int, dict]]:
    """Each prerequisite to the job standing for it and that job's facts: itself, or the copy a requeue
    replaced it by (a copy replaced in turn, by its own copy).

    Only an operator's requeue replaces a job (``replaced_by``): a team's own cancel and re-run does not, so
    its dependents end on the cancel.
    """
    out = {p: (p, row) for p, row in facts.items()}
    # Nearly always empty: one query per generation of copies, none while no prerequisite was cancelled.
    tips = {p: p for p, row in facts.items() if row["end_reason"] == EndReason.CANCELLED}
    while tips:
        copies = _copies_of(set(tips.values()))
        out |= {p: copies[tip] for p, tip in tips.items() if tip in copies}
        tips = {
            p: copies[tip][0]
            for p, tip in tips.items()
            if tip in copies and copies[tip][1]["end_reason"] == EndReason.CANCELLED
        }
    return out


def _copies_of(sources: set[int]) -> dict[int, tuple[int, dict]]:
    facts = [f"replaced_by__{fact}" for fact in _FACTS]
    read = Job.objects.filter(id__in=sources, replaced_by__isnull=False).values_list(
        "id", "replaced_by_id", *facts
    )
    return {source: (copy, dict(zip(_FACTS, row, strict=True))) for source, copy, *row in read}


def _replaced_by(copy_id: int) -> list[int]:
    """The copy, then the job it replaced, and so on back to the job first submitted."""
    chain = [copy_id]
    while source := Job.objects.filter(replaced_by_id=chain[-1]).values_list("id", flat=True).first():
        chain.append(source)
    return chain


def _outcome(kind: str, row: dict) -> str:
    return lifecycle.prerequisite_outcome(
        kind=kind, state=row["state"], end_reason=row["end_reason"], delivery_state=row["delivery_state"]
    )


def _ending(row: dict) -> str:
    if row["end_reason"] == EndReason.SUCCEEDED and row["delivery_state"] == "failed":
        return "succeeded but its outputs were not delivered"
    return row["end_reason"] or row["state"]
