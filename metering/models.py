"""The meter ledger: append-only rows of held GPU-time, one per allocation per UTC hour."""

from django.conf import settings
from django.db import models
from django.db.models import Q

from accounts.models import Team
from common.append_only import AppendOnlyError, AppendOnlyModel
from jobs.models import Allocation, Job
from metering.periods import MICROS_PER_HOUR


class LedgerIsAppendOnly(AppendOnlyError):
    """Raised on any attempt to change or remove a ledger row; corrections are adjustment rows."""


class MeterEntry(AppendOnlyModel):
    """Held GPU-time of one allocation in one period: ``gpus`` GPUs for ``microseconds`` each.

    Metered rows (accrual, final) tile RENT..RELEASE exactly, one per UTC hour; adjustment rows
    are signed corrections with a reason and the operator who made them, or the platform's credits (no
    operator) of the hours of an allocation whose job's process it never ran.
    """

    class Kind(models.TextChoices):
        ACCRUAL = "accrual", "Accrual"
        FINAL = "final", "Final"
        ADJUSTMENT = "adjustment", "Adjustment"

    allocation = models.ForeignKey(Allocation, on_delete=models.PROTECT, related_name="meter_entries")
    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="meter_entries")
    # Indexed together with period_start below; a lone team index would be redundant.
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="meter_entries", db_index=False)
    period_start = models.DateTimeField()
    period_end = models.DateTimeField()
    gpus = models.PositiveSmallIntegerField()
    microseconds = models.BigIntegerField(
        help_text="Held time in the period, per GPU. Negative only on an adjustment that credits."
    )
    kind = models.CharField(max_length=10, choices=Kind.choices)
    reason = models.CharField(max_length=300, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField()

    append_only_error = LedgerIsAppendOnly
    append_only_noun = "ledger rows"
    append_only_hint = "; append an adjustment instead"

    class Meta:
        ordering = ["period_start", "allocation_id", "id"]
        verbose_name_plural = "meter entries"
        indexes = [
            # Statement, chart and team exports read a team's rows by period; operators' views
            # read every team's by period. (No INCLUDE columns: SQLite, the embedded default,
            # has none, and the bench meets its target without them.)
            models.Index(fields=["team", "period_start"], name="meter_team_period"),
            models.Index(fields=["period_start"], name="meter_period"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["allocation", "period_start"],
                condition=~Q(kind="adjustment"),
                name="meter_one_row_per_allocation_period",
            ),
            models.CheckConstraint(
                condition=Q(kind__in=["accrual", "final", "adjustment"]), name="meter_kind"
            ),
            models.CheckConstraint(condition=Q(gpus__gte=1), name="meter_gpus_positive"),
            models.CheckConstraint(
                condition=Q(period_end__gte=models.F("period_start")), name="meter_period_ordered"
            ),
            models.CheckConstraint(
                condition=Q(kind="adjustment")
                | Q(
                    microseconds__gt=0, microseconds__lte=MICROS_PER_HOUR, reason="", created_by__isnull=True
                ),
                name="meter_metered_row_within_an_hour",
            ),
            # An operator signs each adjustment; the platform, signing none, only credits
            # (services.credit_never_ran), once a period.
            models.CheckConstraint(
                condition=~Q(kind="adjustment")
                | (
                    ~Q(microseconds=0) & ~Q(reason="") & (Q(created_by__isnull=False) | Q(microseconds__lt=0))
                ),
                name="meter_adjustment_reasoned_charge_signed",
            ),
            models.UniqueConstraint(
                fields=["allocation", "period_start"],
                condition=Q(kind="adjustment", created_by__isnull=True),
                name="meter_one_platform_credit_per_period",
            ),
        ]

    def __str__(self) -> str:
        return (
            f"{self.kind} allocation {self.allocation_id} {self.period_start:%Y-%m-%d %H:%M} {self.seconds} s"
        )

    @property
    def seconds(self) -> str:
        """The exact held seconds per GPU, as a decimal string with six places."""
        return format_seconds(self.microseconds)


def format_seconds(micros: int) -> str:
    sign = "-" if micros < 0 else ""
    whole, frac = divmod(abs(micros), 1_000_000)
    return f"{sign}{whole}.{frac:06d}"


class LedgerDay(models.Model):
    """One team's GPU-microseconds in one UTC day of ledger periods (adjustments included).

    Kept by a database trigger on every ledger insert (migration 0003), in the inserting
    transaction, so it always equals the sum of the rows; pages read it instead of summing them.
    """

    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="+", db_index=False)
    day = models.DateField()
    gpu_micros = models.BigIntegerField()
    rows = models.BigIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team", "day"], name="ledger_day_one_row_per_team_day")
        ]
        indexes = [models.Index(fields=["day"], name="ledger_day_by_day")]

    def __str__(self) -> str:
        return f"team {self.team_id} {self.day}: {self.gpu_micros} GPU-µs"


class LedgerJobMonth(models.Model):
    """One job's metered and adjusted GPU-microseconds in one UTC month: the statement's lines.

    Kept by the same trigger as ``LedgerDay``.
    """

    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="+", db_index=False)
    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="+", db_index=False)
    month = models.DateField()
    metered = models.BigIntegerField()
    adjusted = models.BigIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "month"], name="ledger_job_month_one_row")]
        indexes = [
            models.Index(fields=["team", "month"], name="ledger_job_month_team"),
            models.Index(fields=["month"], name="ledger_job_month_month"),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} {self.month:%Y-%m}: {self.metered} + {self.adjusted} GPU-µs"
