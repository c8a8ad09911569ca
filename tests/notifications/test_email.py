"""E-mail per user per team: on end, on failure only, or never; a job may choose for itself (--notify)."""

import smtplib
from datetime import timedelta

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.core import mail
from django.utils import timezone

from jobs import transitions
from jobs.lifecycle import EndReason, State
from jobs.models import Job, JobArray
from notifications import services as notify
from notifications.models import JobEmail
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def mailed(settings, member):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    member.email = "alice@example.com"
    member.save()
    return mail.outbox


def finish(job, reason):
    target = State.ENDED if reason in (EndReason.STAGING_FAILED,) else State.RELEASED
    source = State.STAGING if target == State.ENDED else State.RUNNING
    transitions.transition(job_id=job.id, source=source, target=target, now=timezone.now(), end_reason=reason)
    notify.send_job_email(job_id=job.id, now=timezone.now())


@pytest.mark.parametrize(
    "choice, reason, sent",
    [
        ("end", EndReason.SUCCEEDED, True),
        ("end", EndReason.CANCELLED, True),
        ("failure", EndReason.SUCCEEDED, False),
        ("failure", EndReason.CANCELLED, False),
        ("failure", EndReason.FAILED, True),
        ("failure", EndReason.TIMED_OUT, True),
        ("failure", EndReason.STAGING_FAILED, True),
        ("never", EndReason.FAILED, False),
    ],
)
def test_each_choice_mails_the_submitter_as_it_says(team, member, mailed, choice, reason, sent):
    notify.set_email_preference(user=member, team=team, email=choice)
    state = "staging" if reason == EndReason.STAGING_FAILED else "running"
    job = JobFactory(team=team, submitted_by=member, state=state)
    finish(job, reason)
    assert len(mailed) == int(sent)
    if sent:
        assert mailed[0].to == ["alice@example.com"] and f"job #{job.id}" in mailed[0].subject
        assert str(reason) in mailed[0].subject and f"/jobs/{job.id}/" in mailed[0].body


def test_no_choice_means_no_mail(team, member, mailed):
    finish(JobFactory(team=team, submitted_by=member, state="running"), EndReason.FAILED)
    assert mailed == []


def test_the_choice_is_per_team(team, other_team, member, mailed):
    from accounts.models import Membership

    Membership.objects.create(team=other_team, user=member)
    notify.set_email_preference(user=member, team=team, email="never")
    notify.set_email_preference(user=member, team=other_team, email="end")
    finish(JobFactory(team=team, submitted_by=member, state="running"), EndReason.SUCCEEDED)
    finish(JobFactory(team=other_team, submitted_by=member, state="running"), EndReason.SUCCEEDED)
    assert len(mailed) == 1 and "audio" in mailed[0].body


def test_a_jobs_own_choice_wins_over_the_team_preference(team, member, mailed):
    notify.set_email_preference(user=member, team=team, email="never")
    job = JobFactory(team=team, submitted_by=member, state="running")
    notify.set_job_email(job=job, user=member, email="end")
    finish(job, EndReason.SUCCEEDED)
    assert len(mailed) == 1


def test_an_email_is_sent_once(team, member, mailed):
    notify.set_email_preference(user=member, team=team, email="end")
    job = JobFactory(team=team, submitted_by=member, state="running")
    finish(job, EndReason.SUCCEEDED)
    assert notify.send_job_email(job_id=job.id, now=timezone.now()) is False  # a duplicated task
    assert len(mailed) == 1 and JobEmail.objects.get(job=job).sent_at is not None


def test_only_the_submitter_chooses_a_jobs_email(team, member, team_admin):
    job = JobFactory(team=team, submitted_by=member, state="running")
    with pytest.raises(notify.NotAllowed):
        notify.set_job_email(job=job, user=team_admin, email="end")


def test_a_choice_for_a_team_one_is_not_in_is_refused(other_team, member):
    with pytest.raises(notify.NotAllowed):
        notify.set_email_preference(user=member, team=other_team, email="end")


def test_an_unknown_choice_is_refused(team, member):
    with pytest.raises(notify.NotAllowed, match="end, failure, never"):
        notify.set_email_preference(user=member, team=team, email="always")


def test_a_submitter_without_an_address_gets_nothing_and_the_job_says_why(team, member, mailed):
    member.email = ""
    member.save()
    notify.set_email_preference(user=member, team=team, email="end")
    job = JobFactory(team=team, submitted_by=member, state="running")
    finish(job, EndReason.SUCCEEDED)
    assert mailed == [] and JobEmail.objects.get(job=job).detail == "the submitter has no e-mail address"


def one_job_file(tmp_path, roots):
    _, out = roots
    path = tmp_path / "j.toml"
    path.write_text(
        f'name = "n"\n[work]\nargv = ["true"]\n[request]\ngpus = 1\nhours = 1\n[output]\nuri = "file://{out}/n"\nbytes = 10\n'
    )
    return path


def test_e31_submit_notify_sets_the_jobs_choice(
    monkeypatch, team, member, member_token, pool, roots, mailed, tmp_path
):
    from tests.cli.inprocess import e31

    job_file = one_job_file(tmp_path, roots)
    code, stdout, stderr = e31(monkeypatch, member_token, "submit", str(job_file), "--notify", "failure")
    assert code == 0, stderr
    assert JobEmail.objects.get(job_id=int(stdout.strip())).email == "failure"
    assert e31(monkeypatch, member_token, "submit", str(job_file), "--notify", "sometimes")[0] == 2


def test_e31_submit_notify_on_an_array_sets_every_tasks_choice(
    monkeypatch, team, member, member_token, pool, roots, mailed, tmp_path
):
    """The choice was set on the job submit answered with, the array's first task: with --notify never and a team
    choice of "end", tasks 2 to 5 still mailed their submitter."""
    from tests.cli.inprocess import e31

    notify.set_email_preference(user=member, team=team, email="end")
    job_file = one_job_file(tmp_path, roots)
    job_file.write_text('array = "0-4"\n' + job_file.read_text())
    code, _, stderr = e31(monkeypatch, member_token, "submit", str(job_file), "--notify", "never")
    assert code == 0, stderr
    tasks = list(Job.objects.order_by("id"))
    assert len(tasks) == 5
    for job in tasks:
        Job.objects.filter(id=job.id).update(state="running")
        finish(job, EndReason.SUCCEEDED)
    assert [m.subject for m in mailed] == []


def test_e31_submit_reports_the_job_when_its_email_choice_is_refused(
    monkeypatch, team, member, member_token, pool, roots, tmp_path
):
    """The job exists once submitted: a refused e-mail choice is a warning, never a failed submit that a
    script would answer by submitting again."""
    from tests.cli.inprocess import e31

    def refuse(**_):
        raise notify.NotAllowed("this job has ended")

    monkeypatch.setattr(notify, "set_job_email", refuse)
    job_file = one_job_file(tmp_path, roots)
    code, stdout, stderr = e31(monkeypatch, member_token, "submit", str(job_file), "--notify", "end")
    assert code == 0, stderr
    job_id = int(stdout.strip())
    said = " ".join(stderr.split())
    assert f"Submitted job {job_id}" in said
    assert f"job {job_id}'s e-mail choice was not set: this job has ended" in said
    assert not JobEmail.objects.filter(job_id=job_id).exists()


def test_the_api_sets_a_jobs_choice_for_its_submitter_only(
    client, team, member, member_token, team_admin, mailed
):
    from accounts import services as accounts

    job = JobFactory(team=team, submitted_by=member)
    answer = client.post(f"/api/v1/jobs/{job.id}/email", {"email": "end"}, content_type="application/json",
                         HTTP_AUTHORIZATION=f"Bearer {member_token}")  # fmt: skip
    assert answer.status_code == 200 and JobEmail.objects.get(job=job).email == "end"
    _, admin_token = accounts.create_api_token(user=team_admin, label="t")
    other = client.post(f"/api/v1/jobs/{job.id}/email", {"email": "never"}, content_type="application/json",
                        HTTP_AUTHORIZATION=f"Bearer {admin_token}")  # fmt: skip
    assert other.status_code == 409
    bad = client.post(f"/api/v1/jobs/{job.id}/email", {"email": "always"}, content_type="application/json",
                      HTTP_AUTHORIZATION=f"Bearer {member_token}")  # fmt: skip
    assert bad.status_code == 422


def test_another_teams_job_is_a_404_for_its_email(client, team, member, outsider):
    from accounts import services as accounts

    job = JobFactory(team=team, submitted_by=member)
    _, token = accounts.create_api_token(user=outsider, label="t")
    answer = client.post(f"/api/v1/jobs/{job.id}/email", {"email": "end"}, content_type="application/json",
                         HTTP_AUTHORIZATION=f"Bearer {token}")  # fmt: skip
    assert answer.status_code == 404 and not JobEmail.objects.exists()


def test_the_api_reads_and_sets_the_choice_per_team(client, team, member, member_token):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {member_token}"}
    assert client.get("/api/v1/notifications/email", **auth).json() == [{"team": "vision", "email": "never"}]
    put = client.put(
        "/api/v1/notifications/email/vision", {"email": "failure"}, content_type="application/json", **auth
    )
    assert put.status_code == 200
    assert client.get("/api/v1/notifications/email", **auth).json() == [
        {"team": "vision", "email": "failure"}
    ]
    assert client.put("/api/v1/notifications/email/audio", {"email": "end"}, content_type="application/json",
                      **auth).status_code == 404  # fmt: skip


@pytest.mark.parametrize("leaves", ["removed from the team", "deactivated"])
def test_someone_who_left_the_team_is_not_mailed_about_its_jobs(team, member, mailed, leaves):
    """The end of a job, its exit code and its detail are the team's: a former member has no claim on them."""
    from accounts.models import Membership

    notify.set_email_preference(user=member, team=team, email="end")
    job = JobFactory(team=team, submitted_by=member, state="running")
    if leaves == "removed from the team":
        Membership.objects.filter(team=team, user=member).delete()
    else:
        member.is_active = False
        member.save()
    finish(job, EndReason.FAILED)
    assert mailed == []


def _leave(team, member):
    from accounts.models import Membership

    Membership.objects.filter(team=team, user=member).delete()


def _delete_account(team, member):
    member.delete()


@pytest.mark.parametrize("gone", [_leave, _delete_account], ids=["left-the-team", "account-deleted"])
def test_a_submitter_gone_after_the_end_is_not_mailed_and_the_mail_is_dropped(team, member, mailed, gone):
    """Deleted, the submitter is NULL: the send crashed on it and the mail stayed owed, tried again every few
    minutes for ever."""
    notify.set_email_preference(user=member, team=team, email="end")
    job = JobFactory(team=team, submitted_by=member, state="running")
    transitions.transition(
        job_id=job.id,
        source=State.RUNNING,
        target=State.RELEASED,
        now=timezone.now(),
        end_reason=EndReason.FAILED,
    )
    gone(team, member)
    assert notify.send_job_email(job_id=job.id, now=timezone.now()) is False
    row = JobEmail.objects.get(job=job)
    assert mailed == [] and row.sent_at is not None and "no longer" in row.detail
    assert not notify._owed_emails(timezone.now() + timedelta(hours=1)).exists()


def test_an_email_whose_send_was_cut_short_is_sent_later(team, member, mailed, monkeypatch):
    """Alice asked to be mailed when her job ends. The worker sending the mail dies mid-send (a soft time
    limit while the SMTP server hangs, an OOM kill, a deploy restart): send_job_email has already set
    sent_at as its claim, so the redelivered task (acks_late) and beat's sweep both see the mail as
    sent, and Alice never gets it, although the README says beat sends any still owed a minute later.
    The claim should expire (as a webhook delivery's lease does) so the mail goes out once, later."""
    notify.set_email_preference(user=member, team=team, email="end")
    job = JobFactory(team=team, submitted_by=member, state="running")
    t0 = timezone.now()
    transitions.transition(job_id=job.id, source=State.RUNNING, target=State.RELEASED, now=t0,
                           end_reason=EndReason.FAILED, exit_code=1)  # fmt: skip

    def dies(*args, **kwargs):
        raise SoftTimeLimitExceeded()

    monkeypatch.setattr(notify, "send_mail", dies)
    with pytest.raises(SoftTimeLimitExceeded):
        notify.send_job_email(job_id=job.id, now=t0)
    monkeypatch.undo()
    mailed.clear()
    assert notify.send_job_email(job_id=job.id, now=t0 + timedelta(seconds=30)) is False  # still claimed

    later = t0 + timedelta(hours=1)
    notify.send_due_notifications(now=later)  # beat's sweep
    notify.send_job_email(job_id=job.id, now=later)  # the task, redelivered or rung again
    assert len(mailed) == 1, f"no e-mail ever sent; JobEmail: {JobEmail.objects.values().get()}"
    assert f"job #{job.id}" in mailed[0].subject


def test_a_success_whose_outputs_are_lost_mails_a_member_who_asked_for_failures(team, member, mailed):
    """Alice chose e-mail "when my job fails". Her job exits 0 and is released as succeeded; its outputs
    are still on the node, which then goes down for good, so the delivery fails (fail_stranded). The CLI
    exits 74 for this and after_ok dependents fail: Alice hears of it as of a failure, the mail says the
    outputs were not delivered and why, and the team's webhooks get an ``output_failed`` event."""
    from jobs import delivery
    from jobs.models import Allocation, Node
    from notifications.models import WebhookDelivery
    from tests.factories import NodeFactory
    from tests.notifications.test_webhooks import hook

    hook(team, "http://hooks.example/")
    notify.set_email_preference(user=member, team=team, email="failure")
    job = JobFactory(team=team, submitted_by=member, state="running", attempt=1)
    t0 = timezone.now()
    transitions.transition(job_id=job.id, source=State.RUNNING, target=State.RELEASED, now=t0,
                           end_reason=EndReason.SUCCEEDED, exit_code=0, delivery_state="delivering")  # fmt: skip
    node = NodeFactory()
    Allocation.objects.create(job=job, attempt=1, node=node, gpu_indices=[0], rented_at=t0, released_at=t0)
    Node.objects.filter(id=node.id).update(state=Node.NodeState.DOWN, state_changed_at=t0 - timedelta(days=1))
    later = t0 + timedelta(hours=1)
    assert delivery.fail_stranded(now=later) == [job.id]  # the outputs are lost
    assert delivery.fail_stranded(now=later) == []  # and said once
    notify.send_job_email(job_id=job.id, now=later + timedelta(minutes=5))
    assert len(mailed) == 1, "a member who asked for failures is never told the job's outputs were lost"
    assert "succeeded, outputs not delivered" in mailed[0].subject
    assert f"node {node.name}, which holds this attempt's outputs, has been down" in mailed[0].body
    events = list(WebhookDelivery.objects.filter(job=job).values_list("event", flat=True))
    assert sorted(events) == ["ended", "output_failed"]


def test_a_mail_asked_for_again_while_the_first_is_being_sent_is_still_sent(
    team, member, mailed, monkeypatch
):
    """Alice gets e-mail at every end. Her job's 'succeeded' mail is being sent when the delivery of its
    outputs fails, which asks for another mail ('outputs not delivered'). The first send's end marked the
    row sent, so the second mail never went out: only this claim's row is marked sent."""
    notify.set_email_preference(user=member, team=team, email="end")
    job = JobFactory(team=team, submitted_by=member, state="running", attempt=1)
    transitions.transition(job_id=job.id, source=State.RUNNING, target=State.RELEASED, now=timezone.now(),
                           end_reason=EndReason.SUCCEEDED, exit_code=0)  # fmt: skip
    real_send = notify.send_mail

    def send_while_outputs_fail(*args, **kwargs):
        notify.record_job_event(job_id=job.id, event="output_failed", attempt=1, now=timezone.now())
        return real_send(*args, **kwargs)

    monkeypatch.setattr(notify, "send_mail", send_while_outputs_fail)
    assert notify.send_job_email(job_id=job.id, now=timezone.now())
    monkeypatch.setattr(notify, "send_mail", real_send)
    assert notify.send_job_email(job_id=job.id, now=timezone.now() + timedelta(seconds=1))
    assert len(mailed) == 2


def _ended_owing_mail(team, member):
    notify.set_email_preference(user=member, team=team, email="end")
    job = JobFactory(team=team, submitted_by=member, state="running")
    t0 = timezone.now()
    transitions.transition(job_id=job.id, source=State.RUNNING, target=State.RELEASED, now=t0,
                           end_reason=EndReason.FAILED, exit_code=1)  # fmt: skip
    return job, t0


def test_a_mail_the_server_refuses_for_good_is_given_up_at_once(team, member, mailed, monkeypatch):
    """A 550 for a deleted mailbox cleared the claim like any failure, and beat's sweep rang it again every 5 s:
    one e-mail made 17,269 SMTP tries in a simulated day."""
    job, t0 = _ended_owing_mail(team, member)
    tries = []

    def refused(*args, **kwargs):
        tries.append(1)
        raise smtplib.SMTPRecipientsRefused({"alice@example.com": (550, b"5.1.1 mailbox unavailable")})

    monkeypatch.setattr(notify, "send_mail", refused)
    for minute in range(60):
        notify.send_job_email(job_id=job.id, now=t0 + timedelta(minutes=minute))
    assert len(tries) == 1
    row = JobEmail.objects.get(job=job)
    assert row.sent_at is not None and "gave up" in row.detail and "550" in row.detail


def test_a_mail_server_that_is_down_is_tried_again_with_backoff_then_given_up(
    team, member, mailed, monkeypatch, settings
):
    settings.E31_EMAIL_ATTEMPTS, settings.E31_EMAIL_BACKOFF_S = 4, 60
    job, t0 = _ended_owing_mail(team, member)
    tries = []

    def down(*args, **kwargs):
        tries.append(1)
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(notify, "send_mail", down)
    for second in range(0, 3600, 5):  # every beat sweep of an hour
        notify.send_job_email(job_id=job.id, now=t0 + timedelta(seconds=second))
    assert len(tries) == 4  # at 0, 60, 180 and 420 s
    row = JobEmail.objects.get(job=job)
    assert row.sent_at is not None and "gave up after 4 tries" in row.detail


def test_a_refusal_of_the_platforms_own_sending_is_tried_again(team, member, mailed, monkeypatch, settings):
    """A wrong SMTP password or a sender address the relay refuses is the operator's to fix: given up at once,
    every job's e-mail of that hour was lost."""
    settings.E31_EMAIL_BACKOFF_S = 60
    job, t0 = _ended_owing_mail(team, member)

    def sender_refused(*args, **kwargs):
        raise smtplib.SMTPSenderRefused(553, b"5.7.1 sender not allowed", "noreply@e31.invalid")

    monkeypatch.setattr(notify, "send_mail", sender_refused)
    notify.send_job_email(job_id=job.id, now=t0)
    row = JobEmail.objects.get(job=job)
    assert row.sent_at is None and row.attempts == 1 and "553" in row.detail
    monkeypatch.undo()
    assert notify.send_job_email(job_id=job.id, now=t0 + timedelta(seconds=61))  # the operator fixed it
    assert len(mailed) == 1


@pytest.mark.parametrize("email", ["end", "failure"])
def test_a_job_or_array_e_mail_for_an_account_without_an_address_is_refused_saying_why(team, member, email):
    """Reproduction: `e31 submit --notify end` as the demo account (no e-mail address) said nothing, and nothing
    was ever sent; the refusal is the CLI's warning."""
    job = JobFactory(team=team, submitted_by=member, state="running")
    with pytest.raises(notify.NotAllowed, match="no e-mail address"):
        notify.set_job_email(job=job, user=member, email=email)
    notify.set_job_email(job=job, user=member, email="never")  # saying no needs no address
    assert JobEmail.objects.get(job=job).email == "never"
    array = JobArray.objects.create(
        team=team, name="sweep", spec="0-1", size=2, first_index=0, submitted_at=timezone.now()
    )
    JobFactory(team=team, submitted_by=member, array=array, array_index=0)
    with pytest.raises(notify.NotAllowed, match="no e-mail address"):
        notify.set_array_email(array=array, user=member, email=email)
