"""The public design-partner page: waitlist while closed, the application when open, and abuse checks."""

from datetime import timedelta
from smtplib import SMTPException, SMTPRecipientsRefused

import pytest
from django.conf import settings as django_settings
from django.core import mail
from django.db import IntegrityError, transaction
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from public import emails, selectors, services
from public.models import Application, IntakeChange, Problem, WaitlistEntry
from tests.pages.factories import ApplicationFactory, ProblemFactory, application_post

URL = "/design-partners/"


def _post(client: Client, data: dict, **extra):
    return client.post(reverse("partners"), data, **extra)


def test_the_intake_page_lives_at_design_partners():
    assert reverse("partners") == URL


@pytest.mark.django_db
def test_intake_is_closed_by_default_and_the_page_says_so_and_offers_the_waitlist(client):
    response = client.get(reverse("partners"))
    html = response.content.decode()
    assert response.status_code == 200
    assert "What we would ask of a design partner" in html
    assert "Intake is closed" in html and "Join the waitlist" in html
    assert 'name="team_name"' not in html
    assert 'name="csrfmiddlewaretoken"' in html


@pytest.mark.django_db
def test_a_visitor_joins_the_waitlist_and_sees_a_confirmation(client):
    response = _post(
        client, {"form": "waitlist", "email": "Dana@Example.com", "note": "video backlog"}, follow=True
    )
    assert response.redirect_chain[-1][0] == f"{reverse('partners-thanks')}?for=waitlist"
    assert "You are on the waitlist" in response.content.decode()
    entry = WaitlistEntry.objects.get()
    assert (entry.email, entry.note) == ("dana@example.com", "video backlog")


@pytest.mark.django_db
def test_the_waitlist_is_written_to_once_when_intake_opens(operator_client, operator, settings):
    """The page promised "we will write to you when intake opens", and opening intake wrote to nobody."""
    settings.E31_WAITLIST_MAILS_PER_RUN = 2
    for n in range(3):
        services.join_waitlist(email=f"w{n}@example.com", note="", now=timezone.now())
    assert (
        services.tell_waitlist(now=timezone.now()) == 0 and not mail.outbox
    )  # intake closed: nothing to tell

    operator_client.post(reverse("partners-intake"), {"open": "1"})
    assert services.tell_waitlist(now=timezone.now()) == 2  # a run's share: the next run takes the rest
    assert services.tell_waitlist(now=timezone.now()) == 1
    assert services.tell_waitlist(now=timezone.now()) == 0
    assert sorted(m.to[0] for m in mail.outbox) == ["w0@example.com", "w1@example.com", "w2@example.com"]
    assert "intake is open" in mail.outbox[0].body and reverse("partners") in mail.outbox[0].body
    assert "3 of 3 told" in operator_client.get(reverse("partners-review")).content.decode()


@pytest.mark.django_db
def test_a_waitlist_mail_that_fails_is_tried_again_at_the_next_run(intake_open, monkeypatch):
    services.join_waitlist(email="w@example.com", note="", now=timezone.now())
    monkeypatch.setattr(
        emails, "send_mail", lambda *a, **k: (_ for _ in ()).throw(SMTPException("relay down"))
    )
    assert services.tell_waitlist(now=timezone.now()) == 0
    monkeypatch.undo()
    assert services.tell_waitlist(now=timezone.now()) == 1 and mail.outbox[0].to == ["w@example.com"]


@pytest.mark.django_db
def test_an_address_the_relay_refuses_does_not_hold_up_the_rest_of_the_waitlist(intake_open, monkeypatch):
    """Its claim was released and the run stopped: the next run took the same oldest entry first, and nobody after
    it was ever told."""
    for n in range(3):
        services.join_waitlist(email=f"w{n}@example.com", note="", now=timezone.now() + timedelta(seconds=n))
    real = emails.send_mail

    def refusing(subject, body, sender, to, **kwargs):
        if to == ["w0@example.com"]:
            raise SMTPRecipientsRefused({"w0@example.com": (550, b"no such user")})
        return real(subject, body, sender, to, **kwargs)

    monkeypatch.setattr(emails, "send_mail", refusing)
    assert services.tell_waitlist(now=timezone.now()) == 2
    assert sorted(m.to[0] for m in mail.outbox) == ["w1@example.com", "w2@example.com"]
    assert services.tell_waitlist(now=timezone.now()) == 0  # the refused address is not tried again


def test_the_waitlist_mails_run_on_the_notify_queue_not_the_control_queue():
    entry = django_settings.CELERY_BEAT_SCHEDULE["public-tell-waitlist"]
    assert entry["options"]["queue"] == f"{django_settings.CELERY_TASK_DEFAULT_QUEUE}.notify"


@pytest.mark.django_db
def test_every_waitlist_entry_can_be_reached_from_the_review_page(operator_client):
    """Only the newest 200 were shown, with no pager: the first to join could not be found."""
    WaitlistEntry.objects.bulk_create(
        WaitlistEntry(email=f"w{n}@example.com", created_at=timezone.now() + timedelta(seconds=n))
        for n in range(205)
    )
    first = operator_client.get(reverse("partners-review")).content.decode()
    assert "w204@example.com" in first and "w0@example.com" not in first and "waitlist_page=2" in first
    second = operator_client.get(reverse("partners-review"), {"waitlist_page": 2}).content.decode()
    assert "w0@example.com" in second


@pytest.mark.django_db
def test_joining_the_waitlist_twice_keeps_one_entry_and_answers_the_same(client):
    first = _post(client, {"form": "waitlist", "email": "dana@example.com"})
    second = _post(client, {"form": "waitlist", "email": "DANA@example.com", "note": "again"})
    assert first.status_code == second.status_code == 302
    assert WaitlistEntry.objects.count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    "data, message",
    [
        ({"email": "not-an-email"}, "Enter a valid email address."),
        ({"email": ""}, "This field is required."),
        ({"email": "a@example.com", "note": "n" * 501}, "at most 500 characters"),
        ({"email": "a" * 140 + "@example.com"}, "at most 150 characters"),
    ],
)
def test_a_bad_waitlist_entry_is_refused_with_422_and_the_error_beside_the_field(client, data, message):
    response = _post(client, {"form": "waitlist", **data})
    assert response.status_code == 422
    html = response.content.decode()
    assert message in html and 'class="field-error"' in html
    assert not WaitlistEntry.objects.exists()


@pytest.mark.django_db
def test_when_intake_is_open_the_application_form_offers_only_open_problems(client, intake_open):
    solved = ProblemFactory(title="Already solved thing")
    services.mark_problem_solved(
        problem_id=solved.id,
        solution="done",
        solved_on=timezone.now().date(),
        author="olga",
        now=timezone.now(),
    )
    html = client.get(reverse("partners")).content.decode()
    for name in ("team_name", "contact_name", "email", "work", "data_bytes", "data_location"):
        assert f'name="{name}"' in html
    for name in ("compute_request", "output", "output_bytes", "can_run_when"):
        assert f'name="{name}"' in html
    assert html.count('name="problems"') == 4
    assert "Already solved thing" not in html
    assert "Intake is closed" not in html


@pytest.mark.django_db
def test_a_complete_application_is_saved_confirmed_and_emailed_to_the_applicant(client, intake_open):
    chosen = Problem.objects.filter(slug__in=["large-datasets", "fair-scheduling"])
    data = application_post(problems=[str(p.id) for p in chosen])
    response = _post(client, data, follow=True)
    assert response.redirect_chain[-1][0] == f"{reverse('partners-thanks')}?for=application"
    assert "Your application has reached us" in response.content.decode()
    application = Application.objects.get()
    assert (application.team_name, application.status) == ("Footage Lab", "pending")
    assert (application.data_bytes, application.output_bytes) == (40 * 10**12, 2 * 10**12)
    assert set(application.problems.all()) == set(chosen)
    assert len(mail.outbox) == 1
    assert mail.outbox[0].to == ["carla@example.com"]
    assert "design partner" in mail.outbox[0].body


@pytest.mark.django_db
def test_an_application_with_errors_saves_nothing_sends_nothing_and_marks_each_field(client, intake_open):
    data = application_post(team_name="", email="nope", data_bytes="a lot", output_bytes="", work="w" * 2001)
    response = _post(client, data)
    assert response.status_code == 422
    form = response.context["form"]
    assert set(form.errors) == {"team_name", "email", "data_bytes", "output_bytes", "work"}
    html = response.content.decode()
    assert "write a size such as 40 TB" in html
    assert "Ensure this value has at most 2000 characters" in html
    assert 'aria-invalid="true"' in html
    assert "w" * 2001 in html  # what was typed comes back to be fixed, not retyped
    assert not Application.objects.exists() and not mail.outbox


@pytest.mark.django_db
@pytest.mark.parametrize(
    "field, limit",
    [
        ("team_name", 80),
        ("contact_name", 120),
        ("data_location", 500),
        ("compute_request", 1000),
        ("output", 1000),
        ("can_run_when", 300),
    ],
)
def test_every_application_field_has_a_size_limit(client, intake_open, field, limit):
    response = _post(client, application_post(**{field: "x" * (limit + 1)}))
    assert response.status_code == 422
    assert list(response.context["form"].errors) == [field]
    assert not Application.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["!!!", "日本チーム"])
def test_a_team_name_without_latin_letters_or_digits_is_refused_at_once(client, intake_open, name):
    """A name of other letters only passed the form, and was refused when an operator accepted it, with a reason
    ("at least one letter or digit") that was not true of it: the team's web address and folders are made of
    Latin letters and digits."""
    response = _post(client, application_post(team_name=name))
    assert response.status_code == 422
    assert "at least one Latin letter (a-z) or digit" in response.content.decode()
    assert selectors.team_name_problem(name) == selectors.TEAM_NAME_NEEDS


@pytest.mark.django_db
def test_an_application_posted_after_intake_closed_is_not_saved(client, intake_open, operator):
    services.set_intake_open(is_open=False, by=operator.username, now=timezone.now())
    response = _post(client, application_post(work="python render.py --backlog <b>4k</b>"))
    assert response.status_code == 409
    page = response.content.decode()
    assert "Intake closed while you were filling in the form" in page
    assert not Application.objects.exists() and not mail.outbox
    # What was typed is shown back, as text, so that it is not lost; the waitlist is offered beside it.
    assert "python render.py --backlog &lt;b&gt;4k&lt;/b&gt;" in page and "Footage Lab" in page
    assert 'name="form" value="waitlist"' in page


@pytest.mark.django_db
def test_a_waitlist_form_sent_once_intake_opened_is_answered_with_the_application_form(client, intake_open):
    """A page loaded while intake was closed, sent after it opened with a bad address: the waitlist form was
    rendered inside the application's section, a dozen empty labels and its note lost."""
    response = _post(client, {"form": "waitlist", "email": "not-an-email", "note": "video backlog"})
    page = response.content.decode()
    assert response.status_code == 422 and 'for=""' not in page
    assert "Intake is open now" in page and 'name="form" value="application"' in page


@pytest.mark.django_db
def test_the_service_refuses_an_application_while_intake_is_closed():
    with pytest.raises(services.IntakeError):
        services.submit_application(
            team_name="t",
            contact_name="c",
            email="c@example.com",
            work="w",
            data_bytes=1,
            data_location="l",
            compute_request="r",
            output="o",
            output_bytes=1,
            can_run_when="now",
            problem_ids=[],
            now=timezone.now(),
        )


@pytest.mark.django_db
def test_a_filled_honeypot_looks_accepted_but_saves_and_sends_nothing(client, intake_open):
    application = _post(client, application_post(website="http://spam.example"))
    waitlist = _post(client, {"form": "waitlist", "email": "bot@example.com", "website": "x"})
    assert application.status_code == waitlist.status_code == 302
    assert application["Location"] == f"{reverse('partners-thanks')}?for=application"
    assert not Application.objects.exists() and not WaitlistEntry.objects.exists()
    assert not mail.outbox


@pytest.mark.django_db
def test_the_honeypot_is_in_the_forms_but_hidden_from_people(client, intake_open):
    html = client.get(reverse("partners")).content.decode()
    assert 'class="hp" aria-hidden="true"' in html
    assert 'name="website" value="" tabindex="-1"' in html


@pytest.mark.django_db
def test_the_sixth_post_from_one_address_within_the_window_gets_429(client):
    for n in range(5):
        assert _post(client, {"form": "waitlist", "email": f"p{n}@example.com"}).status_code == 302
    response = _post(client, {"form": "waitlist", "email": "p6@example.com"})
    assert response.status_code == 429
    assert int(response["Retry-After"]) == 600
    assert WaitlistEntry.objects.count() == 5
    assert client.get(reverse("partners")).status_code == 200  # reading is never limited


@pytest.mark.django_db
def test_invalid_and_honeypot_posts_count_toward_the_limit(client):
    for _ in range(3):
        _post(client, {"form": "waitlist", "email": "bad"})
    for _ in range(2):
        _post(client, {"form": "waitlist", "email": "bot@example.com", "website": "x"})
    assert _post(client, {"form": "waitlist", "email": "real@example.com"}).status_code == 429


@pytest.mark.django_db
def test_the_rate_limit_counts_each_address_separately(client):
    for n in range(5):
        _post(client, {"form": "waitlist", "email": f"p{n}@example.com"}, REMOTE_ADDR="10.0.0.1")
    assert (
        _post(client, {"form": "waitlist", "email": "x@example.com"}, REMOTE_ADDR="10.0.0.1").status_code
        == 429
    )
    assert (
        _post(client, {"form": "waitlist", "email": "y@example.com"}, REMOTE_ADDR="10.0.0.2").status_code
        == 302
    )


@pytest.mark.django_db
def test_the_rate_limit_and_window_come_from_the_settings(client, settings):
    settings.E31_PUBLIC_FORM_LIMIT = 2
    settings.E31_PUBLIC_FORM_WINDOW_S = 30
    for n in range(2):
        assert _post(client, {"form": "waitlist", "email": f"s{n}@example.com"}).status_code == 302
    response = _post(client, {"form": "waitlist", "email": "s3@example.com"})
    assert response.status_code == 429 and response["Retry-After"] == "30"


@pytest.mark.django_db
def test_the_public_forms_refuse_a_post_without_a_csrf_token(intake_open):
    client = Client(enforce_csrf_checks=True)
    assert _post(client, application_post()).status_code == 403
    assert _post(client, {"form": "waitlist", "email": "c@example.com"}).status_code == 403
    assert not Application.objects.exists() and not WaitlistEntry.objects.exists()


@pytest.mark.django_db
def test_html_typed_into_an_application_is_shown_as_text_everywhere(client, operator_client, intake_open):
    script = "<script>alert('x')</script>"
    _post(client, application_post(team_name=f"Team {script}", work=script, data_location="<b>here</b>"))
    application = Application.objects.get()
    for url in (reverse("partners-review"), reverse("partners-application", args=[application.id])):
        html = operator_client.get(url).content.decode()
        assert script not in html and "<b>here</b>" not in html
        assert "&lt;script&gt;" in html


@pytest.mark.django_db
def test_an_operator_opens_and_closes_intake_on_a_page_and_each_change_is_kept(operator_client, client):
    assert "Intake is closed" in operator_client.get(reverse("partners-review")).content.decode()
    operator_client.post(reverse("partners-intake"), {"open": "1"})
    assert 'name="team_name"' in client.get(reverse("partners")).content.decode()
    operator_client.post(reverse("partners-intake"), {"open": "0"})
    assert "Intake is closed" in client.get(reverse("partners")).content.decode()
    assert list(IntakeChange.objects.values_list("is_open", "by")) == [(False, "olga"), (True, "olga")]


@pytest.mark.django_db
def test_only_operators_can_open_intake(member_client, client):
    assert member_client.post(reverse("partners-intake"), {"open": "1"}).status_code == 404
    assert client.post(reverse("partners-intake"), {"open": "1"}).status_code == 302
    assert not selectors.intake_is_open()


@pytest.mark.django_db
def test_the_same_application_sent_twice_is_kept_once_and_answered_the_same(client, intake_open):
    """A double click on "Send the application", or the applicant coming back a day later."""
    first = _post(client, application_post(email="Carla@Example.com"))
    second = _post(client, application_post(email="carla@example.com", work="something else"))
    assert first.status_code == second.status_code == 302
    assert first["Location"] == second["Location"] == f"{reverse('partners-thanks')}?for=application"
    application = Application.objects.get()
    assert (application.email, application.work) == ("carla@example.com", "python render.py --backlog")
    assert len(mail.outbox) == 1  # confirmed once


@pytest.mark.django_db
def test_the_database_keeps_one_pending_application_per_address(application):
    with pytest.raises(IntegrityError), transaction.atomic():
        ApplicationFactory(email=application.email.upper())
    ApplicationFactory(email=application.email, status="declined")  # a decided one may be followed by another


@pytest.mark.django_db
def test_the_receipt_repeats_nothing_the_applicant_typed(client, intake_open):
    """The form takes any address: a receipt that echoed the free text would carry a stranger's words to it."""
    words = {"team_name": "Win a prize", "contact_name": "Visit phish.example", "work": "click http://phish.example/x",
             "data_location": "http://phish.example/d", "compute_request": "call +1 555 0100",
             "output": "reply with your password", "can_run_when": "today only"}  # fmt: skip
    assert _post(client, application_post(email="victim@example.com", **words)).status_code == 302
    (receipt,) = mail.outbox
    assert receipt.to == ["victim@example.com"]
    assert not [typed for typed in words.values() if typed in receipt.body + receipt.subject]
    assert (
        "design partner of E31 Network" in receipt.body
        and "an operator reads every application" in receipt.body
    )
