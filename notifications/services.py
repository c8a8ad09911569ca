"""The only writers of notifications: choices, webhooks, and the events owed to each.

Events are recorded inside the transaction that moved the job (a rolled-back transition owes
nothing), as rows; tasks carrying their ids are enqueued after commit. A delivery is claimed by a
conditional UPDATE before each try, so a duplicated task never sends twice at once, and beat
re-sends anything due: a lost message delays an event, never loses it.
"""

import http.client
import json
import logging
import secrets
import smtplib
import ssl
import time
from datetime import datetime, timedelta
from urllib.parse import urlsplit

from django.conf import settings
from django.core.mail import send_mail
from django.db import connection, transaction
from django.db.models import Case, F, Q, QuerySet, Value, When

from accounts import scoping, selectors, team_secrets
from accounts.models import Team
from common import nul, pinned
from jobs import dispatch
from jobs.models import Job, JobArray
from notifications import addresses, signals, signing
from notifications.models import (
    EmailChoice,
    EmailPreference,
    JobEmail,
    Webhook,
    WebhookAttempt,
    WebhookDelivery,
)

log = logging.getLogger(__name__)
DELIVER_WEBHOOK = "notifications.tasks.deliver_webhook"
SEND_JOB_EMAIL = "notifications.tasks.send_job_email"
MIN_SECRET, MAX_SECRET = 16, 200
# How long a worker's claim on an e-mail holds: past it (the worker died mid-send, well beyond the SMTP
# timeout) the mail is owed again and beat's sweep sends it.
EMAIL_CLAIM = timedelta(minutes=5)
FAILED_ENDS = {
    "ended": lambda reason: reason not in ("succeeded", "cancelled"),
    "staging_failed": lambda _: True,
    "output_failed": lambda _: True,  # it succeeded, but its outputs could not be delivered: lost to its team
}


class NotAllowed(Exception):
    """The user may not change this (the message says why)."""


def set_email_preference(*, user, team: Team, email: str) -> EmailPreference:
    """A member's e-mail choice for the jobs they submit in ``team``."""
    if email not in EmailChoice.values:
        raise NotAllowed(f"e-mail is one of {', '.join(EmailChoice.values)}")
    if not scoping.teams_of(user).filter(id=team.id).exists():
        raise NotAllowed("not one of your teams")
    preference, _ = EmailPreference.objects.update_or_create(user=user, team=team, defaults={"email": email})
    return preference


def set_job_email(*, job: Job, user, email: str) -> None:
    """This job's e-mail to its submitter, over their team preference; only the submitter chooses it."""
    if email not in EmailChoice.values:
        raise NotAllowed(f"e-mail is one of {', '.join(EmailChoice.values)}")
    if job.submitted_by_id != user.id:
        raise NotAllowed("only the job's submitter chooses its e-mail")
    _addressed(user, email)
    JobEmail.objects.update_or_create(job=job, defaults={"email": email})


def _addressed(user, email: str) -> None:
    """A choice to be mailed needs an address to mail: taken silently, nothing would ever be sent."""
    if email != EmailChoice.NEVER and not user.email:
        raise NotAllowed("your account has no e-mail address, so none can be sent: an operator sets it")


def set_array_email(*, array: JobArray, user, email: str) -> int:
    """Every task's e-mail to its submitter, in one statement (an array may hold E31_MAX_ARRAY tasks); only the
    array's submitter chooses it. Returns how many tasks."""
    if email not in EmailChoice.values:
        raise NotAllowed(f"e-mail is one of {', '.join(EmailChoice.values)}")
    tasks = list(Job.objects.filter(array=array).values_list("id", "submitted_by_id"))
    if not tasks or any(submitter != user.id for _, submitter in tasks):
        raise NotAllowed("only the array's submitter chooses its e-mail")
    _addressed(user, email)
    JobEmail.objects.bulk_create(
        [JobEmail(job_id=job_id, email=email) for job_id, _ in tasks],
        update_conflicts=True, unique_fields=["job"], update_fields=["email"],
    )  # fmt: skip
    return len(tasks)


@transaction.atomic
def reseal_webhook_secrets() -> tuple[int, list[int]]:
    """Re-encrypts every webhook's signing secret under the first secrets key (a rotation): (how many, the ids of
    those no key opens, left as they are: their events are already refused as unsigned, and the team re-adds them)."""
    count, unopened = 0, []
    for hook in Webhook.objects.select_for_update().only("id", "sealed_secret").order_by("id"):
        try:
            sealed = team_secrets.reseal(hook.sealed_secret)
        except team_secrets.SecretsUnavailable:
            unopened.append(hook.id)
            continue
        Webhook.objects.filter(id=hook.id).update(sealed_secret=sealed)
        count += 1
    return count, unopened


@transaction.atomic
def add_webhook(*, team: Team, user, url: str, secret: str, now: datetime) -> Webhook:
    """A team admin's webhook; its URL must pass the address rules now (and again before each send)."""
    if not scoping.is_team_admin(user, team):
        raise NotAllowed("only the team's admins manage its webhooks")
    host, port = addresses.check_url(url)
    # Within a deadline: the page waits on it, and a name whose server never answers held a web thread for
    # the resolver's whole timeout. Before any lock: the team's submissions and releases would wait on it.
    addresses.checked_addresses(host, port, deadline=time.monotonic() + settings.E31_WEBHOOK_TIMEOUT_S)
    secret = secret or secrets.token_urlsafe(32)
    if not (MIN_SECRET <= len(secret) <= MAX_SECRET) or not secret.isascii() or not secret.isprintable():
        raise addresses.Refused(f"a secret is {MIN_SECRET} to {MAX_SECRET} printable ASCII characters")
    Team.objects.select_for_update(no_key=True).filter(
        id=team.id
    ).first()  # two adds at once count each other
    _refuse_more_webhooks(team, url)
    webhook = Webhook.objects.create(team=team, url=url, secret=secret, created_by=user, created_at=now)
    _changed(webhook, "team.webhook-add", actor=user, now=now)
    return webhook


def _refuse_more_webhooks(team: Team, url: str) -> None:
    """Every event of the team's jobs goes out to each of its webhooks from inside the job's own change (and the
    scheduler pass that makes it), so their number is bounded; a second webhook to one URL only sends each event
    there twice."""
    hooks = Webhook.objects.filter(team=team)
    if hooks.filter(url=url).exists():
        raise addresses.Refused("the team already has a webhook to this URL")
    limit = settings.E31_WEBHOOKS_PER_TEAM
    if hooks.count() >= limit:
        raise addresses.Refused(f"a team has at most {limit} webhooks: remove one first")


@transaction.atomic
def remove_webhook(*, webhook: Webhook, user, now: datetime) -> None:
    if not scoping.is_team_admin(user, webhook.team):
        raise NotAllowed("only the team's admins manage its webhooks")
    # Held first, so a job event holding it is over and its deliveries are seen (and removed) with it.
    webhook = Webhook.objects.select_for_update().filter(id=webhook.id).first()
    if webhook is not None:
        _delete(webhook, actor=user, now=now)


@transaction.atomic
def remove_webhooks_added_by(*, team: Team, user_id: int, actor, now: datetime) -> int:
    """Removes the webhooks an admin added to the team, once they are no admin of it (removed, or made a member):
    a webhook speaks for the admin who added it, as their invitations do, and would go on hearing every event of
    the team's jobs. Returns how many."""
    hooks = list(Webhook.objects.select_for_update().filter(team=team, created_by_id=user_id).order_by("id"))
    for webhook in hooks:
        _delete(webhook, actor=actor, now=now)
    return len(hooks)


def _delete(webhook: Webhook, *, actor, now: datetime) -> None:
    _changed(webhook, "team.webhook-remove", actor=actor, now=now)
    webhook.delete()


def _changed(webhook: Webhook, action: str, *, actor, now: datetime) -> None:
    """Tells operations (the audit log) what was added or removed: the webhook, its host, and whose it was. Never
    its path or query, which often carry the receiver's own secret (a chat service's incoming-webhook token), and
    the audit log keeps everything for ever."""
    added_by = webhook.created_by.get_username() if webhook.created_by_id else ""
    said = {"webhook": webhook.id, "host": urlsplit(webhook.url).hostname or "", "added_by": added_by}
    before, after = ({}, said) if action == "team.webhook-add" else (said, {})
    signals.webhook_changed.send(
        sender=Webhook, team=webhook.team, action=action, before=before, after=after, actor=actor, now=now
    )


def record_job_event(*, job_id: int, event: str, attempt: int, now: datetime, detail: str = "") -> None:
    """What a job's event owes: a delivery per webhook of its team, and its submitter's e-mail."""
    job = Job.objects.select_related("team").get(id=job_id)
    payload = _payload(job, event, now=now, detail=detail)
    key = f"job:{job.id}:{attempt}:{event}"
    team_webhooks = Webhook.objects.filter(team_id=job.team_id).select_related("created_by", "team")
    for webhook in _held(job.team_id, team_webhooks):
        if not selectors.speaks_for(webhook.created_by, webhook.team):
            continue  # its adder was deactivated, lost operator rights or was deleted: see deliver_webhook
        delivery, created = WebhookDelivery.objects.get_or_create(
            webhook=webhook, event_key=key,
            defaults={"event": event, "job": job, "payload": payload, "next_attempt_at": now, "created_at": now},
        )  # fmt: skip
        if created:
            _ring(DELIVER_WEBHOOK, delivery.id)
    if event in FAILED_ENDS and _email_wanted(job, event):
        JobEmail.objects.update_or_create(
            job=job,
            defaults={"due_at": now, "claimed_at": None, "sent_at": None, "attempts": 0, "next_try_at": None},
        )
        _ring(SEND_JOB_EMAIL, job.id)


def _held(team_id: int, webhooks: QuerySet[Webhook]) -> QuerySet[Webhook]:
    """The webhooks, each held until this transaction ends (FOR KEY SHARE, which job events do not contend for):
    the deliveries' foreign key is checked at commit, so a webhook removed in between would roll back the job's
    change, or the whole scheduler pass that made it. A removal waits instead, and then removes these
    deliveries with it. The team row is held first, as a removal takes it (an admin's removal locks the team,
    then the admin's webhooks): held after the webhooks, by the foreign keys at commit, the two deadlocked.
    Submissions take the team FOR NO KEY UPDATE, which KEY SHARE lets by. SQLite runs one writer at a time."""
    ids = list(webhooks.values_list("id", flat=True))
    if connection.vendor != "postgresql" or not ids:
        return webhooks
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM {Team._meta.db_table} WHERE id = %s FOR KEY SHARE", [team_id])
        cursor.execute(
            f"SELECT id FROM {Webhook._meta.db_table} WHERE id = ANY(%s) ORDER BY id FOR KEY SHARE", [ids]
        )
        held = [row[0] for row in cursor.fetchall()]
    return webhooks.filter(id__in=held)


def _email_wanted(job: Job, event: str) -> bool:
    if job.submitted_by_id is None:
        return False
    override = JobEmail.objects.filter(job=job).values_list("email", flat=True).first()
    choice = override or (
        EmailPreference.objects.filter(user_id=job.submitted_by_id, team_id=job.team_id)
        .values_list("email", flat=True)
        .first()
    )
    wanted = choice == EmailChoice.END or (
        choice == EmailChoice.FAILURE and FAILED_ENDS[event](job.end_reason)
    )
    return wanted and _still_sees(job)  # asked last: most ends want no mail


def _still_sees(job: Job) -> bool:
    """The submitter is an active user who may still see the job: the end, exit code and detail are
    the team's, and a former member has no claim on them."""
    user = job.submitted_by  # None once the account is deleted
    return (
        user is not None
        and user.is_active
        and scoping.visible_to(user, Job.objects.filter(id=job.id)).exists()
    )


def _payload(job: Job, event: str, *, now: datetime, detail: str) -> dict:
    return {
        "type": event,
        "created_at": now.isoformat(),
        "team": job.team.slug,
        "job": {
            "id": job.id, "name": job.name, "state": job.state, "end_reason": job.end_reason,
            "exit_code": job.exit_code, "attempt": job.attempt, "url": f"/jobs/{job.id}/",
        },
        "detail": detail[:500],
    }  # fmt: skip


def _ring(task: str, object_id: int) -> None:
    dispatch.send_after_commit(task, (object_id,), queue=dispatch.notify_queue())


# Tries in a row a receiver may leave unanswered before its webhook is paused for E31_WEBHOOK_PAUSE_S: each held a
# notification worker for the whole E31_WEBHOOK_TIMEOUT_S, and one team's silent receivers (10 webhooks, a 1,000-task
# array cancelled: 10,000 deliveries) kept every other team's notifications waiting for hours.
WEBHOOK_SILENT_TRIES = 5
# A try answered after this share of E31_WEBHOOK_TIMEOUT_S counts as one with no answer: a receiver answering (500,
# or even 200) just inside the timeout held a worker as long as a silent one, and was never paused.
WEBHOOK_SLOW_SHARE = 0.5


def deliver_webhook(*, delivery_id: int, now: datetime) -> str:
    """One try of a due delivery: signed, sent to the address that passed the rules, no redirects followed. A
    delivery of a paused webhook waits untried, its tries not counted, until the pause ends ("paused")."""
    lease = timedelta(seconds=settings.E31_WEBHOOK_TIMEOUT_S * 2 + 5)
    if paused_until := _paused_until(delivery_id, now, probe_for=lease):
        WebhookDelivery.objects.filter(
            id=delivery_id, state=WebhookDelivery.PENDING, next_attempt_at__lt=paused_until
        ).update(next_attempt_at=paused_until)
        return "paused"
    claimed = WebhookDelivery.objects.filter(
        id=delivery_id, state=WebhookDelivery.PENDING, next_attempt_at__lte=now
    ).update(next_attempt_at=now + lease, attempts=F("attempts") + 1)
    if not claimed:
        return "not due"  # delivered, given up, or another task holds this try
    delivery = WebhookDelivery.objects.select_related("webhook__created_by", "webhook__team").get(
        id=delivery_id
    )
    if refusal := _unvouched(delivery.webhook):
        return _record_try(delivery, status=None, response=refusal, refused=True, took_ms=0, now=now)
    try:
        secret = delivery.webhook.secret
    except (
        team_secrets.SecretsUnavailable
    ) as exc:  # nothing goes out unsigned; tried again, as a key may come back
        return _record_try(
            delivery, status=None, response=f"not sent: {exc}", refused=False, took_ms=0, now=now
        )
    status, response, refused, took = _send(delivery, secret, now=now)
    if not refused:
        _count_silence(delivery.webhook_id, answered=status is not None and not _slow(took), now=now)
    return _record_try(delivery, status=status, response=response, refused=refused, took_ms=took, now=now)


def _paused_until(delivery_id: int, now: datetime, *, probe_for: timedelta) -> datetime | None:
    """Until when this delivery's webhook is paused, or None: it may be tried. Once a pause ends, one try decides
    (it holds the pause ``probe_for`` longer, by a conditional UPDATE); the deliveries due meanwhile wait for it."""
    found = WebhookDelivery.objects.filter(id=delivery_id).values_list(
        "webhook_id", "webhook__silent_tries", "webhook__paused_until"
    )
    webhook_id, silent, until = found.first() or (None, 0, None)
    if until is not None and until > now:
        return until
    if silent < WEBHOOK_SILENT_TRIES:
        return None
    probing = Webhook.objects.filter(Q(paused_until__isnull=True) | Q(paused_until__lte=now), id=webhook_id)
    if probing.update(paused_until=now + probe_for):
        return None  # this try is the probe
    return Webhook.objects.filter(id=webhook_id).values_list("paused_until", flat=True).first() or None


def _slow(took_ms: int) -> bool:
    return took_ms > WEBHOOK_SLOW_SHARE * settings.E31_WEBHOOK_TIMEOUT_S * 1000


def _count_silence(webhook_id: int, *, answered: bool, now: datetime) -> None:
    """A prompt answer of any kind (a 500 is quick) resumes the webhook; a try with none, or a late one, counts,
    and the WEBHOOK_SILENT_TRIES-th in a row, and each after it, pauses it. One UPDATE: tries finish concurrently."""
    webhooks = Webhook.objects.filter(id=webhook_id)
    if answered:
        webhooks.exclude(silent_tries=0, paused_until=None).update(silent_tries=0, paused_until=None)
        return
    pause = now + timedelta(seconds=settings.E31_WEBHOOK_PAUSE_S)
    webhooks.update(
        silent_tries=F("silent_tries") + 1,
        paused_until=Case(
            When(silent_tries__gte=WEBHOOK_SILENT_TRIES - 1, then=Value(pause)), default=F("paused_until")
        ),
    )


def _unvouched(webhook: Webhook) -> str:
    """Why nothing more goes to ``webhook`` ("" while it may): it speaks for the admin (or operator) who added it,
    as their invitations do. Removed or made a member, they take it with them (remove_webhooks_added_by); an
    account deactivated, no longer an operator, or deleted changes no membership, so each event asks again."""
    if selectors.speaks_for(webhook.created_by, webhook.team):
        return ""
    who = webhook.created_by.get_username() if webhook.created_by_id else "a deleted account"
    return f"not sent: {who}, who added this webhook, no longer speaks for team {webhook.team.slug}"


def _send(delivery: WebhookDelivery, secret: str, *, now: datetime) -> tuple[int | None, str, bool, int]:
    """(HTTP status or None, what answered or why not, refused by the rules, milliseconds)."""
    body = json.dumps({"id": str(delivery.event_id), **delivery.payload}, separators=(",", ":")).encode()
    headers = signing.headers(
        secret=secret,
        event_id=str(delivery.event_id),
        timestamp=int(now.timestamp()),
        body=body,
    )
    began = time.monotonic()
    # One deadline for the whole try, the names' lookups included: the lease allows a try twice as long.
    deadline = began + settings.E31_WEBHOOK_TIMEOUT_S
    try:
        host, port = addresses.check_url(delivery.webhook.url)
        checked = addresses.checked_addresses(host, port, deadline=deadline)
        status, text = _post(delivery.webhook.url, checked, port, headers, body, deadline=deadline)
    except addresses.Unresolved as exc:  # like a refused connection: tried again with backoff
        status, text = None, f"no answer: {exc}"
    except addresses.Refused as exc:
        return None, str(exc), True, 0
    except (OSError, http.client.HTTPException, ssl.SSLError) as exc:
        status, text = None, f"no answer: {exc.__class__.__name__}: {exc}"
    return status, text, False, int((time.monotonic() - began) * 1000)


def _post(
    url: str, checked: list[str], port: int, headers: dict, body: bytes, *, deadline: float
) -> tuple[int, str]:
    # A deadline on the whole try, not only on each read: a receiver that trickles its answer would
    # otherwise hold it past the delivery's lease, and beat would send the event again meanwhile.
    timeout = max(deadline - time.monotonic(), 0.001)
    conn, target = pinned.connection(
        urlsplit(url), port, addresses=checked, timeout=timeout, deadline=deadline
    )
    try:
        conn.request("POST", target, body=body, headers={**headers, "User-Agent": "e31-webhooks"})
        response = conn.getresponse()
        text = response.read(1000).decode("utf-8", "replace")
        if 300 <= response.status < 400:
            text = f"redirects are not followed ({response.getheader('Location', '')[:200]}) {text}"
        return response.status, text
    finally:
        conn.close()


@transaction.atomic
def _record_try(delivery, *, status: int | None, response: str, refused: bool, took_ms: int, now) -> str:
    WebhookAttempt.objects.create(  # a NUL in the answer (PostgreSQL stores none) is written out
        delivery=delivery, number=delivery.attempts, at=now, status=status, response=nul.shown(response)[:1000],
        duration_ms=took_ms,
    )  # fmt: skip
    if status is not None and 200 <= status < 300:
        state, next_at = WebhookDelivery.DELIVERED, now
    elif refused or delivery.attempts >= settings.E31_WEBHOOK_ATTEMPTS:
        state, next_at = WebhookDelivery.FAILED, now
    else:  # retried with backoff: 10 s, 20 s, 40 s, … by default
        state = WebhookDelivery.PENDING
        next_at = now + timedelta(seconds=settings.E31_WEBHOOK_BACKOFF_S * 2 ** (delivery.attempts - 1))
    WebhookDelivery.objects.filter(id=delivery.id, attempts=delivery.attempts).update(
        state=state, next_attempt_at=next_at, finished_at=None if state == WebhookDelivery.PENDING else now
    )
    return state


def send_job_email(*, job_id: int, now: datetime) -> bool:
    """The e-mail owed for a job's end: claimed for EMAIL_CLAIM by a conditional UPDATE, marked sent
    only once the mail server took it, so a send cut short goes out again later."""
    if not _owed_emails(now).filter(job_id=job_id).update(claimed_at=now):
        return False
    job = Job.objects.select_related("submitted_by", "team").get(id=job_id)
    if not _still_sees(job):  # left the team (or was deactivated) between the end and this send
        JobEmail.objects.filter(job_id=job_id).update(
            sent_at=now, detail="the submitter can no longer see this job"
        )
        return False
    if not job.submitted_by.email:
        JobEmail.objects.filter(job_id=job_id).update(
            sent_at=now, detail="the submitter has no e-mail address"
        )
        return False
    outcome = job.end_reason or job.state
    if job.delivery_state == "failed":
        outcome = f"{outcome}, outputs not delivered"
    subject = f"[E31] job #{job.id} {job.name}: {outcome}"
    lines = [f"Job #{job.id} {job.name} of team {job.team.name} ended: {outcome}."]
    if job.exit_code is not None:
        lines.append(f"Exit code: {job.exit_code}.")
    lines += filter(None, [job.end_detail, job.delivery_detail if job.delivery_state == "failed" else ""])
    lines.append(f"{settings.E31_CONSOLE_URL.rstrip('/')}/jobs/{job.id}/")
    # Only this claim's row: a new event may have asked for another mail meanwhile (re-armed, unclaimed).
    claimed = JobEmail.objects.filter(job_id=job_id, claimed_at=now, sent_at__isnull=True)
    try:
        send_mail(subject, "\n".join(lines), None, [job.submitted_by.email])
    except (OSError, ValueError) as exc:  # the mail server refused or is down
        _failed_send(claimed, exc, now=now)
        return False
    claimed.update(sent_at=now)
    return True


def _failed_send(claimed: QuerySet[JobEmail], exc: Exception, *, now: datetime) -> None:
    """Tried again after E31_EMAIL_BACKOFF_S, doubling, up to E31_EMAIL_ATTEMPTS sends; given up at once where
    the recipient was refused for good (a 5xx: no such mailbox), which no later try changes."""
    row = claimed.first()
    if row is None:
        return
    attempts = row.attempts + 1
    if _refused_for_good(exc) or attempts >= settings.E31_EMAIL_ATTEMPTS:
        claimed.update(sent_at=now, attempts=attempts, detail=f"gave up after {attempts} tries: {exc}"[:300])
        return
    backoff = timedelta(seconds=settings.E31_EMAIL_BACKOFF_S * 2 ** (attempts - 1))
    claimed.update(claimed_at=None, attempts=attempts, next_try_at=now + backoff, detail=str(exc)[:300])


def _refused_for_good(exc: Exception) -> bool:
    """The recipient's own server said no for good (a 5xx for every recipient: no such mailbox). A refusal of the
    platform's own sending (its login, its sender address, TLS) is fixed by an operator, and then sends again."""
    return isinstance(exc, smtplib.SMTPRecipientsRefused) and all(
        code >= 500 for code, _ in exc.recipients.values()
    )


def _owed_emails(now: datetime) -> QuerySet[JobEmail]:
    """E-mails owed and not being sent: unclaimed, or claimed by a worker that has had EMAIL_CLAIM."""
    unclaimed = Q(claimed_at__isnull=True) | Q(claimed_at__lte=now - EMAIL_CLAIM)
    due = Q(next_try_at__isnull=True) | Q(next_try_at__lte=now)
    return JobEmail.objects.filter(unclaimed, due, due_at__isnull=False, sent_at__isnull=True)


# Past this many waiting on the notification queue the sweep rings for nothing: no notification worker is taking
# them (a deployment upgraded without one), and ringing every 5 s for every delivery due would grow the queue
# until the broker's memory ran out. What is due stays due in the database and is rung once a worker drains it.
NOTIFY_BACKLOG = 2000


def send_due_notifications(*, now: datetime) -> int:
    """Beat's sweep: rings again for every delivery due and every e-mail owed a while."""
    waiting = dispatch.queue_depth(dispatch.notify_queue())
    if waiting >= NOTIFY_BACKLOG:
        log.warning(
            "%d notifications wait on the queue and none is taken: is a notification worker running "
            "(celery -A e31web worker -Q %s)? None rung again until it drains", waiting, dispatch.notify_queue(),
        )  # fmt: skip
        return 0
    due = list(
        WebhookDelivery.objects.filter(state=WebhookDelivery.PENDING, next_attempt_at__lte=now)
        .order_by("next_attempt_at")
        .values_list("id", flat=True)[:500]
    )
    owed = list(
        _owed_emails(now)
        .filter(due_at__lte=now - timedelta(minutes=1))
        .values_list("job_id", flat=True)[:500]
    )
    with transaction.atomic():
        for delivery_id in due:
            _ring(DELIVER_WEBHOOK, delivery_id)
        for job_id in owed:
            _ring(SEND_JOB_EMAIL, job_id)
    return len(due) + len(owed)
