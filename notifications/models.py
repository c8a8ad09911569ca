"""Who hears about a job: each member's e-mail choice per team, and the team's signed webhooks."""

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q

from accounts import team_secrets
from accounts.models import Team

EVENTS = ("started", "ended", "staging_failed", "output_failed", "budget_warning")


class EmailChoice(models.TextChoices):
    END = "end", "when my job ends"
    FAILURE = "failure", "when my job fails"
    NEVER = "never", "never"


class EmailPreference(models.Model):
    """A member's choice for the jobs they submit in one team (no row: never)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="+")
    email = models.CharField(max_length=8, choices=EmailChoice.choices, default=EmailChoice.NEVER)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "team"], name="one_email_preference_per_team"),
            models.CheckConstraint(condition=Q(email__in=EmailChoice.values), name="email_preference_known"),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.team}: {self.email}"


class JobEmail(models.Model):
    """One job's choice for its submitter (``e31 submit --notify``), over the team preference; and
    once the job has ended, whether its e-mail went (sent_at), so it is sent once, and who is sending it
    (claimed_at, a lease: a send cut short is sent again once it expires)."""

    job = models.OneToOneField("jobs.Job", on_delete=models.CASCADE, related_name="+")
    email = models.CharField(max_length=8, choices=EmailChoice.choices, blank=True)
    due_at = models.DateTimeField(null=True, blank=True)  # the job ended and an e-mail is owed
    claimed_at = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)  # or given up, as detail says
    detail = models.CharField(max_length=300, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)  # sends the mail server refused or could not take
    next_try_at = models.DateTimeField(null=True, blank=True)  # not before this after a failed send

    def __str__(self) -> str:
        return f"job {self.job_id}: {self.email or 'team preference'}"


class Webhook(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="webhooks")
    url = models.CharField(max_length=2000)
    # The secret each event is signed with (HMAC-SHA256), encrypted like a team secret (``secret`` reads and
    # sets it); shown once, when the webhook is added.
    sealed_secret = models.CharField(max_length=400)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    created_at = models.DateTimeField()
    # Tries in a row its receiver did not answer (services.WEBHOOK_SILENT_TRIES pauses it), and until when its
    # deliveries wait untried: each silent try held a notification worker for the whole timeout.
    silent_tries = models.PositiveIntegerField(default=0)
    paused_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["team", "id"]
        constraints = [models.CheckConstraint(condition=Q(url__startswith="http"), name="webhook_url_http")]

    def __str__(self) -> str:
        return self.url

    @property
    def secret(self) -> str:
        return team_secrets.unseal(self.sealed_secret)

    @secret.setter
    def secret(self, value: str) -> None:
        self.sealed_secret = team_secrets.seal(value)


class WebhookDelivery(models.Model):
    """One event for one webhook: sent until a 2xx answers or its attempts run out."""

    PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"

    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    event_id = models.UUIDField(default=uuid.uuid4, unique=True)
    # What happened, once: a job's transition (``job:12:1:started``) or a budget warning.
    event_key = models.CharField(max_length=120)
    event = models.CharField(max_length=20, choices=[(e, e) for e in EVENTS])
    job = models.ForeignKey("jobs.Job", on_delete=models.SET_NULL, null=True, related_name="+")
    payload = models.JSONField()
    state = models.CharField(max_length=10, default=PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    created_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["state", "next_attempt_at"]),
            models.Index(fields=["webhook", "-created_at"]),
        ]
        constraints = [
            models.UniqueConstraint(fields=["webhook", "event_key"], name="one_delivery_per_event"),
            models.CheckConstraint(
                condition=Q(state__in=["pending", "delivered", "failed"]), name="delivery_state_known"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event} to {self.webhook_id}: {self.state}"


class WebhookAttempt(models.Model):
    """One try of a delivery and what answered it, as the webhooks page shows it."""

    delivery = models.ForeignKey(WebhookDelivery, on_delete=models.CASCADE, related_name="tries")
    number = models.PositiveSmallIntegerField()
    at = models.DateTimeField()
    status = models.PositiveSmallIntegerField(null=True, blank=True)  # the HTTP status; null: no answer
    response = models.CharField(max_length=1000, blank=True)  # the start of the body, or why none came
    duration_ms = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["number"]
        constraints = [models.UniqueConstraint(fields=["delivery", "number"], name="one_row_per_try")]

    def __str__(self) -> str:
        return f"try {self.number} of {self.delivery_id}: {self.status}"
