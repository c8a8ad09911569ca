from django.apps import AppConfig


class OperationsConfig(AppConfig):
    name = "operations"
    verbose_name = "The operator dashboard"

    def ready(self) -> None:
        # Metering signals a budget change and a ledger adjustment, accounts a membership change, a team's rename, a change of rights, a
        # lockout cleared and a token revoked, public a declined application, without importing operations: the apps' arrows point one way.
        from accounts import signals as accounts_signals
        from metering import signals
        from notifications import signals as notifications_signals
        from operations import receivers
        from public import signals as public_signals

        signals.budget_set.connect(receivers.audit_budget, dispatch_uid="operations.audit-budget")
        signals.ledger_adjusted.connect(
            receivers.audit_ledger_adjustment, dispatch_uid="operations.audit-ledger-adjustment"
        )
        accounts_signals.membership_changed.connect(
            receivers.audit_team_change, dispatch_uid="operations.audit-membership"
        )
        accounts_signals.secret_changed.connect(
            receivers.audit_team_change, dispatch_uid="operations.audit-secret"
        )
        notifications_signals.webhook_changed.connect(
            receivers.audit_team_change, dispatch_uid="operations.audit-webhook"
        )
        accounts_signals.rights_changed.connect(
            receivers.audit_rights, dispatch_uid="operations.audit-rights"
        )
        accounts_signals.account_changed.connect(
            receivers.audit_account, dispatch_uid="operations.audit-account"
        )
        accounts_signals.team_renamed.connect(
            receivers.audit_team_rename, dispatch_uid="operations.audit-team-rename"
        )
        accounts_signals.lockout_cleared.connect(
            receivers.audit_unlock, dispatch_uid="operations.audit-unlock"
        )
        accounts_signals.token_revoked.connect(
            receivers.audit_token_revoke, dispatch_uid="operations.audit-token-revoke"
        )
        public_signals.application_declined.connect(
            receivers.audit_partner_decline, dispatch_uid="operations.audit-partner-decline"
        )
