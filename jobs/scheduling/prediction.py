"""Run times learned per team: how long a job will really run, for backfill and estimates.

The approach of Tsafrir, Etsion and Feitelson ("Backfilling using system-generated predictions
rather than user runtime estimates", IEEE TPDS 2007): a team's declared hours are a limit, not a
forecast, and most teams declare far more than their jobs use. From a team's last finished jobs
the scheduler learns the ratio actual run time / declared hours and plans with
``declared x ratio``:

- robust: the weighted median of the ratios, so one job that ran to its limit moves nothing;
- recent-weighted: a job's weight halves every ``half_life_jobs`` jobs back;
- never past the limit: each ratio is capped at 1 and the prediction at the declaration, which
  stays the kill deadline;
- cold start: under ``min_jobs`` finished jobs the prediction is the declaration;
- a running job that outruns its prediction has it extended at once (doubled until it lies past
  what the job has run, never past its limit);
- for backfill and estimated starts only: a job is ranked by its declared hours (``planned`` keeps them
  as ``limit_hours``), or a team that taught the scheduler short run times would jump the queue;
- only runs that tell a run time teach (``TEACHES``).

Pure standard library; the live scheduler and the trace replay use the same functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from jobs.scheduling.types import PendingJob, ranked_hours

HOUR_S = 3600.0
MIN_JOBS = 5
WINDOW = 50  # the most recent finished jobs a ratio is learned from
HALF_LIFE_JOBS = 10.0
FLOOR_S = 60.0  # no prediction below a minute: start-up alone takes that

# The end reasons (``jobs.lifecycle.EndReason``) whose run time teaches a team's prediction. A job that
# succeeded ran as long as its work took; one stopped at its limit (timed_out) needed at least all of it, and
# can only raise the ratio (to 1). The others tell nothing of how long the work takes, and a team chooses them
# at will: a job that fails, or is stopped at its memory limit, within seconds (five ``false`` jobs declared
# 168 h would plan every 168 h job of the team as a minute), one cancelled, one whose node was lost or whose
# outputs failed. The gap left: a team running ``true`` jobs declared long, which succeed within seconds, still
# lowers its own predictions. As ranking reads the declared hours, that buys no place in the queue, only
# backfill: a long job may start in a gap before another team's reservation, planned as short. The extension
# below bounds the plan (once the job outruns its prediction, the reservation is planned after it, each pass),
# not the job: started, it runs to its limit. Weighting each run by its GPU-seconds, or ignoring runs under a
# minute, would only raise what the trick costs, and would change what honest teams of short jobs are told.
TEACHES = ("succeeded", "timed_out")


@dataclass(frozen=True, slots=True)
class Finished:
    """One finished job of a team: how long it ran, what it had declared and how it ended."""

    run_s: float
    declared_hours: float
    end_reason: str = "succeeded"


@dataclass(frozen=True, slots=True)
class Learned:
    """A team's learned ratio (None: not enough history yet) and how many jobs it rests on."""

    ratio: float | None
    jobs: int
    min_jobs: int = MIN_JOBS

    def predict_hours(self, declared_hours: float) -> float:
        """The run time the scheduler plans with: declared x ratio, at least a minute, at most declared."""
        if self.ratio is None:
            return declared_hours
        return min(declared_hours, max(declared_hours * self.ratio, FLOOR_S / HOUR_S))

    def reason(self) -> str:
        if self.ratio is None:
            return (
                f"planned with the declared hours: your team has {self.jobs} finished job"
                f"{'' if self.jobs == 1 else 's'} that succeeded or reached {'its' if self.jobs == 1 else 'their'} "
                f"limit, a prediction needs {self.min_jobs}"
            )
        return (
            f"your team's jobs use {100 * self.ratio:.0f} % of their declared hours "
            f"(last {self.jobs} finished jobs that succeeded or reached their limit)"
        )


COLD = Learned(ratio=None, jobs=0)


def learn(
    history: Sequence[Finished],
    *,
    min_jobs: int = MIN_JOBS,
    window: int = WINDOW,
    half_life_jobs: float = HALF_LIFE_JOBS,
) -> Learned:
    """The team's ratio from ``history`` (oldest first): the recency-weighted median over the window of the
    runs that teach (``TEACHES``)."""
    teaching = [f for f in history if f.end_reason in TEACHES]
    recent = teaching[-window:] if window else teaching
    if len(recent) < max(min_jobs, 1):
        return Learned(ratio=None, jobs=len(recent), min_jobs=min_jobs)
    last = len(recent) - 1
    weighted = sorted((_ratio(f), 0.5 ** ((last - i) / half_life_jobs)) for i, f in enumerate(recent))
    return Learned(ratio=_weighted_median(weighted), jobs=len(recent), min_jobs=min_jobs)


def _ratio(f: Finished) -> float:
    """Actual / declared, capped at 1: a run past its declaration was let run, but plans never exceed the limit."""
    return min(max(f.run_s, 0.0) / (f.declared_hours * HOUR_S), 1.0)


def _weighted_median(pairs: Sequence[tuple[float, float]]) -> float:
    """The smallest value whose cumulative weight reaches half the total (``pairs`` sorted by value)."""
    half = sum(w for _, w in pairs) / 2.0
    seen = 0.0
    for value, weight in pairs:
        seen += weight
        if seen >= half:
            return value
    return pairs[-1][0]


def planned(job: PendingJob, learned: Learned) -> PendingJob:
    """``job`` as the scheduler plans it: with its team's predicted run time, ranked by its declared hours."""
    declared = ranked_hours(job)
    return replace(job, hours=learned.predict_hours(declared), limit_hours=declared)


def planned_end(learned: Learned, *, started_at: float, limit_s: float, now: float) -> float:
    """When a job running since ``started_at`` under a limit of ``limit_s`` is planned to end."""
    predicted_s = learned.predict_hours(limit_s / HOUR_S) * HOUR_S
    return started_at + extended_s(predicted_s, elapsed_s=now - started_at, limit_s=limit_s)


def extended_s(predicted_s: float, *, elapsed_s: float, limit_s: float) -> float:
    """The run time to plan with for a job that has run ``elapsed_s``: its prediction, or once it
    outran it, the prediction doubled until it lies past ``elapsed_s``; never past ``limit_s``."""
    planned = max(predicted_s, 1.0)
    while planned <= elapsed_s and planned < limit_s:
        planned *= 2.0
    return min(planned, limit_s)
