from django.apps import AppConfig


class MeteringConfig(AppConfig):
    name = "metering"
    verbose_name = "The meter ledger"

    def ready(self) -> None:
        # Jobs signals release and submission without importing metering: the apps' arrows point one way.
        from django.core import checks

        from jobs import signals
        from metering import checks as metering_checks
        from metering import receivers

        signals.allocation_released.connect(receivers.close_meter_at_release, dispatch_uid="metering.close")
        signals.budget_asked.connect(receivers.answer_budget, dispatch_uid="metering.budget")
        signals.meter_closed_until.connect(receivers.meter_closed_until, dispatch_uid="metering.closed")
        checks.register(
            metering_checks.receivers_connected
        )  # fail closed: a server without them does not start
