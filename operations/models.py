"""The operator dashboard's own rows: the audit log, utilisation samples and health probes."""

import json

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models

from common.append_only import AppendOnlyError, AppendOnlyModel


class AuditIsAppendOnly(AppendOnlyError):
    """Raised on any attempt to change or remove an audit entry."""


class AuditEntry(AppendOnlyModel):
    """One operator action: who, what, on what, when, and the target before and after. Append-only."""

    # The actor is copied, not a foreign key: an entry must outlive the account, and a
    # SET_NULL would be an UPDATE, which the trigger refuses.
    actor_user_id = models.IntegerField(null=True, blank=True)
    actor = models.CharField(max_length=150)
    action = models.CharField(max_length=40, db_index=True)
    target = models.CharField(max_length=200)
    before = models.JSONField(default=dict, encoder=DjangoJSONEncoder)
    after = models.JSONField(default=dict, encoder=DjangoJSONEncoder)
    at = models.DateTimeField(db_index=True)

    append_only_error = AuditIsAppendOnly
    append_only_noun = "audit entries"

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name_plural = "audit entries"
        # The audit page's filters (an exact actor or target, newest first) and the team page's last entries.
        indexes = [
            models.Index(fields=["target", "-at"], name="audit_target_at"),
            models.Index(fields=["actor", "-at"], name="audit_actor_at"),
        ]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.target}"

    @property
    def before_text(self) -> str:
        return json.dumps(self.before, sort_keys=True, cls=DjangoJSONEncoder)

    @property
    def after_text(self) -> str:
        return json.dumps(self.after, sort_keys=True, cls=DjangoJSONEncoder)


class UtilisationSample(models.Model):
    """The pool in one UTC minute, written by beat; the utilisation charts read only these rows.

    ``total = busy + reserved + idle_while_waiting + other_idle`` where other idle GPUs are free
    with nothing ready to use them, or on a draining/drained node. ``reservations`` is the plan's
    reservations at that minute, so pages can show them without running the policy.
    """

    minute = models.BigIntegerField(unique=True)  # whole minutes since the epoch: one row per minute
    at = models.DateTimeField()
    total_gpus = models.PositiveIntegerField()
    busy_gpus = models.PositiveIntegerField()
    reserved_gpus = models.PositiveIntegerField()
    idle_while_waiting_gpus = models.PositiveIntegerField()
    queued_jobs = models.PositiveIntegerField()
    reservations = models.JSONField(default=dict)  # {job id: {"start_at": iso, "gpus_by_node": {...}}}

    class Meta:
        ordering = ["-minute"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M} {self.busy_gpus}/{self.total_gpus} busy"


class TeamBusySample(models.Model):
    """GPUs one team held in one sampled minute (teams holding none get no row)."""

    sample = models.ForeignKey(UtilisationSample, on_delete=models.CASCADE, related_name="teams")
    minute = models.BigIntegerField()  # copied from the sample so range scans need no join
    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="+")
    busy_gpus = models.PositiveIntegerField()

    class Meta:
        indexes = [models.Index(fields=["minute", "team"])]
        constraints = [models.UniqueConstraint(fields=["sample", "team"], name="one_team_row_per_sample")]

    def __str__(self) -> str:
        return f"minute {self.minute}: team {self.team_id} {self.busy_gpus} GPUs"


class HealthProbe(models.Model):
    """The last result of a periodic check that is too costly for a page view (beat, ledger)."""

    name = models.CharField(max_length=40, unique=True)
    ok = models.BooleanField()
    detail = models.TextField(blank=True)
    at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.name}: {'ok' if self.ok else 'failing'} at {self.at}"
