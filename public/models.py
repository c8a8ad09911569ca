"""The public record (unsolved problems, their revisions, console measurements) and design-partner intake.

Problems are never deleted and their revisions and the measurements are never changed: the page
promises readers a history they can trust, so the models refuse it here and PostgreSQL refuses it
again with triggers (e31web migration 0002) for writes that bypass the models.

These models were born in the ``e31web`` package and moved here with their rows: each keeps its
``e31web_*`` table (``db_table``), so the move touched no data (migration public 0001).
"""

from django.db import models
from django.db.models import Q
from django.db.models.functions import Lower

from accounts.models import InvitationLink, Team
from common.append_only import AppendOnlyError, AppendOnlyModel


class ProblemQuerySet(models.QuerySet):
    def delete(self):
        raise AppendOnlyError("a problem is never deleted: it leaves the open list only by being solved")

    def open(self) -> "ProblemQuerySet":
        return self.filter(status=Problem.Status.OPEN)


class Problem(models.Model):
    """One item of the public list of unsolved problems. Written only by public.services."""

    class Status(models.TextChoices):
        OPEN = "open", "Open"
        SOLVED = "solved", "Solved"

    slug = models.SlugField(
        max_length=80, unique=True
    )  # fixed at creation: anchors and feed links keep working
    title = models.CharField(max_length=120)
    summary = models.CharField(max_length=600)
    why_hard = models.TextField(max_length=4000)
    open_questions = models.JSONField(default=list, blank=True)
    # Measurement keys shown beside the problem, e.g. ["scheduler.simulation"].
    measurement_keys = models.JSONField(default=list, blank=True)
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.OPEN)
    solution = models.TextField(max_length=4000, blank=True)
    solved_on = models.DateField(null=True, blank=True)
    position = models.PositiveIntegerField(default=0)
    added_at = models.DateTimeField()
    reviewed_at = models.DateTimeField()

    objects = ProblemQuerySet.as_manager()

    class Meta:
        db_table = "e31web_problem"
        ordering = ["position", "id"]
        constraints = [
            models.CheckConstraint(
                condition=(Q(status="open", solved_on__isnull=True, solution=""))
                | (Q(status="solved", solved_on__isnull=False) & ~Q(solution="")),
                name="problem_solved_only_with_solution_and_date",
            ),
        ]

    def __str__(self) -> str:
        return self.title

    def save(self, *args, **kwargs) -> None:
        # An edit must leave a revision row: public.services does both in one transaction.
        if not self._state.adding:
            raise AppendOnlyError("edit a problem through public.services so the edit is kept")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise AppendOnlyError("a problem is never deleted: it leaves the open list only by being solved")

    @property
    def is_solved(self) -> bool:
        return self.status == self.Status.SOLVED


class ProblemRevision(AppendOnlyModel):
    """One edit of a problem, with the problem as it read after the edit."""

    class Kind(models.TextChoices):
        ADDED = "added", "added"
        REWORDED = "reworded", "reworded"
        REVIEWED = "reviewed", "reviewed"
        SOLVED = "solved", "marked solved"

    problem = models.ForeignKey(Problem, on_delete=models.PROTECT, related_name="revisions")
    kind = models.CharField(max_length=10, choices=Kind.choices)
    at = models.DateTimeField(db_index=True)
    # A name, not a foreign key: removing an operator's account must not rewrite the history.
    author = models.CharField(max_length=150)
    note = models.CharField(max_length=300, blank=True)
    title = models.CharField(max_length=120)
    summary = models.CharField(max_length=600)
    why_hard = models.TextField()
    open_questions = models.JSONField(default=list)
    measurement_keys = models.JSONField(default=list)
    status = models.CharField(max_length=8)
    solution = models.TextField(blank=True)
    solved_on = models.DateField(null=True, blank=True)

    class Meta:
        db_table = "e31web_problemrevision"
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.title}: {self.get_kind_display()} {self.at:%Y-%m-%d}"


class Measurement(AppendOnlyModel):
    """A figure this console measured (a simulation, a staging bench), stored as the tool reported it."""

    key = models.CharField(max_length=80)
    title = models.CharField(max_length=200)
    figures = models.JSONField()
    command = models.CharField(max_length=2000)
    measured_at = models.DateTimeField()

    class Meta:
        db_table = "e31web_measurement"
        ordering = ["-measured_at", "-id"]
        indexes = [models.Index(fields=["key", "-measured_at"])]

    def __str__(self) -> str:
        return f"{self.key} at {self.measured_at:%Y-%m-%d %H:%M}"


class IntakeChange(AppendOnlyModel):
    """Operators open and close design-partner intake; the latest row wins, none means closed."""

    is_open = models.BooleanField()
    at = models.DateTimeField()
    by = models.CharField(max_length=150)

    class Meta:
        db_table = "e31web_intakechange"
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"intake {'opened' if self.is_open else 'closed'} {self.at:%Y-%m-%d}"


class WaitlistEntry(models.Model):
    email = models.EmailField(max_length=150, unique=True)
    note = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField()
    told_at = models.DateTimeField(null=True, blank=True)  # written to that intake is open (once)

    class Meta:
        db_table = "e31web_waitlistentry"
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "waitlist entries"

    def __str__(self) -> str:
        return self.email


class Application(models.Model):
    """A team's request to become a design partner: the job it would run, in the four parts."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        ACCEPTED = "accepted", "Accepted"
        DECLINED = "declined", "Declined"

    team_name = models.CharField(max_length=80)
    contact_name = models.CharField(max_length=120)
    # 150 characters: the address becomes the contact's username, which Django caps there.
    email = models.EmailField(max_length=150)
    work = models.TextField(max_length=2000)
    data_bytes = models.BigIntegerField()
    data_location = models.CharField(max_length=500)
    compute_request = models.TextField(max_length=1000)
    output = models.TextField(max_length=1000)
    output_bytes = models.BigIntegerField()
    can_run_when = models.CharField(max_length=300)
    problems = models.ManyToManyField(
        Problem, blank=True, related_name="applications", db_table="e31web_application_problems"
    )
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    created_at = models.DateTimeField()
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.CharField(max_length=150, blank=True)
    decision_note = models.CharField(max_length=1000, blank=True)
    team = models.ForeignKey(Team, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")

    class Meta:
        db_table = "e31web_application"
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["status", "-created_at"])]
        constraints = [
            # A double click or a second visit must not queue the same team twice for review.
            models.UniqueConstraint(
                Lower("email"), condition=Q(status="pending"), name="one_pending_application_per_address"
            )
        ]

    def __str__(self) -> str:
        return f"{self.team_name} ({self.status})"


class Invitation(InvitationLink):
    """The single-use link an accepted contact follows to set a password and become its team's first admin."""

    application = models.OneToOneField(Application, on_delete=models.PROTECT, related_name="invitation")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="+")

    class Meta:
        db_table = "e31web_invitation"

    @property
    def role(self) -> str:
        """What the contact becomes: the first admin of the team made for them."""
        return "admin"
