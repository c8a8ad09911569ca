from django.apps import AppConfig


class OperationsConfig(AppConfig):
    name = "operations"
    verbose_name = "The operator dashboard"

    def ready(self) -> None:
        # Metering signals a budget change, accounts a membership change, without importing operations: the
        # apps' arrows point one way.
        from accounts import signals as accounts_signals
        from metering import signals
        from operations import receivers

        signals.budget_set.connect(receivers.audit_budget, dispatch_uid="operations.audit-budget")
        accounts_signals.membership_changed.connect(
            receivers.audit_membership, dispatch_uid="operations.audit-membership"
        )
