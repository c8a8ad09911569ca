"""A startup check that metering listens: without its receivers an enforced budget goes unanswered
and jobs takes the silence for "no budget" (it must not import metering to know better)."""

from django.core import checks

from jobs import signals

# The dispatch_uid each receiver is connected with in MeteringConfig.ready.
RECEIVERS = {
    "metering.close": signals.allocation_released,
    "metering.budget": signals.budget_asked,
    "metering.closed": signals.meter_closed_until,
}


def receivers_connected(app_configs=None, **kwargs) -> list[checks.Error]:
    return [
        checks.Error(
            f"metering's receiver {uid!r} is not connected: budgets and meters would be skipped without a word",
            hint="connect it in MeteringConfig.ready",
            id="metering.E001",
        )
        for uid, signal in RECEIVERS.items()
        if not any(key[0] == uid for key, *_ in signal.receivers)
    ]
