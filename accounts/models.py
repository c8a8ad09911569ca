"""Teams, their members and per-user API tokens."""

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Lower
from django.utils import timezone


class Team(models.Model):
    name = models.CharField(max_length=80, unique=True)
    slug = models.SlugField(max_length=80, unique=True)
    # Fair-share weight: the scheduler normalises shares over the teams with work.
    share = models.FloatField(default=1.0)
    # Monthly GPU-hour budget; null means none. enforce=False only warns.
    monthly_budget_gpu_hours = models.DecimalField(max_digits=12, decimal_places=2, null=True, blank=True)
    budget_enforced = models.BooleanField(default=True)
    # Jobs are offline by default; an operator may let a team's jobs reach the internet (never the
    # platform, the node or private ranges: jobs.network).
    # db_default: a process of the release before, inserting a team without this column, still gets "offline".
    egress_allowed = models.BooleanField(default=False, db_default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    class Role(models.TextChoices):
        MEMBER = "member", "Member"
        ADMIN = "admin", "Team admin"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)
    joined_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="one_membership_per_team")]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


class ApiToken(models.Model):
    """A bearer token. Only its SHA-256 is stored; the token itself is shown once."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    label = models.CharField(max_length=80)
    prefix = models.CharField(max_length=12, help_text="First characters, to tell tokens apart.")
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # Refused from then on; null: made before tokens expired, kept working so nothing stops without warning.
    expires_at = models.DateTimeField(null=True, blank=True)
    # Reads only (GET, HEAD, OPTIONS): what watches the jobs (a dashboard, a CI status check) needs no power to
    # submit, cancel or change a team's secrets. Tokens made before this can change things, as they always could.
    read_only = models.BooleanField(default=False)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.label})"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None and not self.has_expired

    @property
    def has_expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= timezone.now()


class TeamSecret(models.Model):
    """A named value a team's jobs receive as an environment variable. Only its Fernet token is stored
    (``accounts.team_secrets``): no page, API answer or log shows the value after it is entered."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="secrets")
    name = models.CharField(max_length=128)
    token = models.TextField()  # the value, encrypted under E31_SECRETS_KEYS
    set_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="one_secret_per_team_and_name")]

    def __str__(self) -> str:
        return f"{self.team} secret {self.name}"


class InvitationLink(models.Model):
    """A single-use link to set a password under an address: only the token's SHA-256 is kept; ``used_at``
    is claimed once (a conditional UPDATE), ``user`` the account it made."""

    email = models.EmailField(max_length=150)  # 150: it becomes the username, which Django caps there
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"invitation for {self.email}"


class TeamInvitation(InvitationLink):
    """A team admin's single-use link to an address. For an address with no account, whoever opens it sets a
    password and joins the team as a member, under the address (lowercased) as username; for one with an account,
    only that account, signed in, joins by it: an admin never adds an account without its consent. Only the
    token's SHA-256 is kept. Written only by ``accounts.members``; the design-partner invitation (``public.Invitation``) is the
    operators' own, for a team's first admin."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="invitations")
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta:
        ordering = ["expires_at", "id"]
        constraints = [
            # Inviting an address again renews its one open link: two live links would each make an account.
            models.UniqueConstraint(
                fields=["team", "email"],
                condition=Q(used_at__isnull=True),
                name="one_open_invitation_per_address",
            ),
            # Lowercased once, so the unique constraint above and the username both see one spelling.
            models.CheckConstraint(
                condition=Q(email=Lower("email")), name="team_invitation_email_lowercased"
            ),
        ]

    def __str__(self) -> str:
        return f"invitation to {self.team} for {self.email}"

    @property
    def role(self) -> str:
        """What the invited person becomes (the invitation page says so); an admin promotes them later."""
        return Membership.Role.MEMBER
