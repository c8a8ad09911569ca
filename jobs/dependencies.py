"""Jobs that run after others: prerequisites checked at intake, dependents ended when one fails.

A prerequisite is an older job of the submitting team (the database refuses any other order, so no
cycle can form). While one is left the scheduler holds the dependent back (``snapshot`` states the
facts, the policy's ``gates`` decide); this module is the writer that ends a dependent whose
``after_ok`` prerequisite ended without success, before any pass could place it.
"""

from collections.abc import Iterable
from datetime import datetime

from jobs import declaration, lifecycle
from jobs.lifecycle import BEFORE_RENT, EndReason, State
from jobs.models import Dependency, Job
from jobs.transitions import transition


def check_prerequisites(*, team, after_ok: Iterable[int], after_any: Iterable[int]) -> None:
    """Refuses ids that are not the team's jobs (worded as for a job that does not exist, so another
    team's ids reveal nothing), and an ``after_ok`` on a job that already ended without success."""
    named = [
        *(("after_ok", i, p) for i, p in enumerate(after_ok)),
        *(("after_any", i, p) for i, p in enumerate(after_any)),
    ]
    if not named:
        return
    found = {
        row.pop("id"): row
        for row in Job.objects.filter(team=team, id__in=[p for _, _, p in named]).values(
            "id", "state", "end_reason", "delivery_state"
        )
    }
    errors = []
    for key, i, prerequisite in named:
        row = found.get(prerequisite)
        if row is None:
            errors.append((f"{key}[{i}]", f"no job {prerequisite} in your team"))
        elif _outcome(key, row) == lifecycle.FAILED:
            errors.append(
                (
                    f"{key}[{i}]",
                    f"job {prerequisite} already ended {_ending(row)}: this job could never start",
                )
            )
    if errors:
        raise declaration.DeclarationInvalid(errors)


def record(*, job_ids: Iterable[int], after_ok: Iterable[int], after_any: Iterable[int]) -> None:
    """The dependency rows of newly submitted jobs (an array's tasks share their declaration's)."""
    pairs = [*((p, Dependency.AFTER_OK) for p in after_ok), *((p, Dependency.AFTER_ANY) for p in after_any)]
    Dependency.objects.bulk_create(
        Dependency(job_id=job_id, prerequisite_id=p, kind=kind) for job_id in job_ids for p, kind in pairs
    )


def end_unsatisfiable(*, now: datetime) -> list[int]:
    """Ends, unmetered, every waiting job an ``after_ok`` prerequisite failed, then their own dependents."""
    ended: list[int] = []
    while failed := _failed_dependencies():
        for job_id, prerequisite, row in failed:
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
    rows = Dependency.objects.filter(
        kind=Dependency.AFTER_OK, job__state__in=BEFORE_RENT, prerequisite__state__in=lifecycle.TERMINAL
    ).values_list(
        "job_id",
        "prerequisite_id",
        "prerequisite__state",
        "prerequisite__end_reason",
        "prerequisite__delivery_state",
    )
    failed, seen = [], set()
    for job_id, prerequisite, state, end_reason, delivery in rows.order_by("job_id", "prerequisite_id"):
        row = {"state": state, "end_reason": end_reason, "delivery_state": delivery}
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
    out: dict[int, list[tuple[int, str]]] = {}
    rows = Dependency.objects.filter(job_id__in=list(job_ids)).values_list(
        "job_id", "prerequisite_id", "kind", "prerequisite__state", "prerequisite__end_reason",
        "prerequisite__delivery_state",
    )  # fmt: skip
    for job_id, prerequisite, kind, state, end_reason, delivery in rows.order_by("job_id", "prerequisite_id"):
        row = {"state": state, "end_reason": end_reason, "delivery_state": delivery}
        if _outcome(kind, row) != lifecycle.MET:
            out.setdefault(job_id, []).append(
                (prerequisite, "succeed" if kind == Dependency.AFTER_OK else "end")
            )
    return {job_id: tuple(waits) for job_id, waits in out.items()}


def _outcome(kind: str, row: dict) -> str:
    return lifecycle.prerequisite_outcome(kind=kind, **row)


def _ending(row: dict) -> str:
    if row["end_reason"] == EndReason.SUCCEEDED and row["delivery_state"] == "failed":
        return "succeeded but its outputs were not delivered"
    return row["end_reason"] or row["state"]
