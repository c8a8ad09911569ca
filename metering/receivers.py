"""What metering does when jobs speaks (connected in ``MeteringConfig.ready``).

Jobs sends its signals without importing metering; these receivers are the other end.
"""

from datetime import datetime

from metering import selectors, services


def close_meter_at_release(
    sender, *, allocation_id: int, released_at: datetime, credit: str = "", **_
) -> None:
    services.close_meter(allocation_id=allocation_id, released_at=released_at)
    if credit:
        services.credit_never_ran(allocation_id=allocation_id, why=credit)


def meter_closed_until(sender, *, allocation_ids: list[int], **_) -> datetime | None:
    return selectors.metered_until(allocation_ids=allocation_ids)


def answer_budget(sender, *, team, gpu_hours: float, now: datetime, **_) -> selectors.Projection:
    return selectors.projection(team=team, extra_gpu_hours=gpu_hours, now=now)
