from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs and the pool"

    def ready(self) -> None:
        # Accounts signals a member removed, and Django an account deleted, without importing jobs: the arrows
        # between the apps point one way, jobs -> accounts.
        from django.contrib.auth import get_user_model
        from django.db.models.signals import pre_delete

        from accounts import signals as accounts_signals
        from jobs import membership

        accounts_signals.membership_changed.connect(
            membership.cancel_removed_members_jobs, dispatch_uid="jobs.cancel-removed-members-jobs"
        )
        pre_delete.connect(
            membership.cancel_deleted_accounts_jobs,
            sender=get_user_model(),
            dispatch_uid="jobs.cancel-deleted-accounts-jobs",
        )
