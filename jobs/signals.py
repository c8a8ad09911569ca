"""What jobs tells other apps, and where they weigh in, without jobs importing them.

Metering listens (its receivers are connected in its ``AppConfig.ready``), so the arrows between
the two apps point one way, metering -> jobs: it closes an allocation's meter at RELEASE, inside
the releasing transaction, and weighs a submission against its team's monthly budget.
"""

from datetime import datetime
from typing import Protocol

from django.dispatch import Signal

# Sent inside the transaction that releases an allocation, with ``allocation_id``, ``released_at`` and ``credit``
# (why the platform credits its held time, the job's process never having run; "" for none). A receiver's error
# rolls the release back: freed GPUs never leave a meter open.
allocation_released = Signal()

# Sent inside the releasing transaction before allocations are released, with ``allocation_ids``. A receiver
# answers the latest instant their meters have closed (an hour the accrual closed while the release was on its
# way), or None: no release is dated before it, so the ledger holds exactly RELEASE - RENT.
meter_closed_until = Signal()

# Sent before a job is stored, and for the submit form's preview, with ``team``, ``gpu_hours``
# (the job's GPUs x hours) and ``now``. A receiver answers a BudgetCheck, or None.
budget_asked = Signal()

# Sent inside the transaction of what a team hears about (notifications listens), with ``job_id``,
# ``event`` (started, ended, staging_failed, output_failed, budget_warning), ``attempt``, ``now`` and ``detail``.
job_event = Signal()


class BudgetCheck(Protocol):
    """A team's budget's word on more GPU-hours this month."""

    @property
    def refused(self) -> bool: ...  # over an enforced budget: the job is refused

    @property
    def would_exceed(self) -> bool: ...  # over the budget, enforced or not

    @property
    def left_gpu_hours(
        self,
    ) -> float | None: ...  # the budget less everything counted, this ask too; None: none

    @property
    def message(self) -> str: ...  # the sentence the team reads


def check_budget(*, team, gpu_hours: float, now: datetime) -> BudgetCheck | None:
    """The first answer to ``budget_asked``; None when no installed app keeps budgets."""
    for _receiver, answer in budget_asked.send(sender=BudgetCheck, team=team, gpu_hours=gpu_hours, now=now):
        if answer is not None:
            return answer
    return None


def meter_closed_after(allocation_ids: list[int]) -> datetime | None:
    """The latest instant any installed app's meter has closed for these allocations (None: none closed)."""
    answers = meter_closed_until.send(sender="jobs.Allocation", allocation_ids=allocation_ids)
    return max((answer for _receiver, answer in answers if answer is not None), default=None)
