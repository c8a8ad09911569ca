"""Who may open what: one expectation per URL of the console, and how to request it.

A new URL fails the matrix until it is added here with the objects its arguments name, so no
page or endpoint ships without its authorization being checked for every kind of visitor.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from enum import Enum

from django.test import Client
from django.urls import reverse
from django.utils import timezone

from tests.security.conftest import World
from tests.security.routes import Route, build_path


class Policy(Enum):
    PUBLIC = "everyone"
    SIGNED_IN = "any signed-in user"
    TEAM_A = "team A's members, its admin and operators; 404 for team B"
    STAFF = "operators only; for other signed-in users the page does not exist (404)"
    METRICS = (
        "operators, and a scraper sending E31_METRICS_TOKEN; 404 for everyone else, visitors too "
        "(429 for an address past E31_METRICS_FAILURE_LIMIT wrong tokens: tests/operations/test_metrics.py)"
    )
    ADMIN_SITE = "Django admin: staff only, everybody else sent to its sign-in"


LOGIN = "login redirect"
REFUSED = frozenset({404})  # one operator guard: 404, never 403, so probing reveals nothing


@dataclass(frozen=True)
class Case:
    policy: Policy
    ok: frozenset[int] = frozenset({200})
    method: str = "GET"
    kwargs: Callable[[World], dict] = lambda w: {}
    query: Callable[[World], str] = lambda w: ""
    data: dict = field(default_factory=dict)

    def expected(self, visitor: str, *, api: bool) -> frozenset[int] | str:
        if self.policy is Policy.PUBLIC or (visitor != "anonymous" and self.policy is Policy.SIGNED_IN):
            return self.ok
        if self.policy is Policy.METRICS:  # a scraper has no sign-in page to be sent to
            return self.ok if visitor == "operator" else REFUSED
        if visitor == "anonymous":
            return frozenset({401}) if api else LOGIN
        if self.policy is Policy.TEAM_A:
            return frozenset({404}) if visitor == "member_b" else self.ok
        return self.ok if visitor == "operator" else REFUSED


def C(policy: Policy, *ok: int, **options) -> Case:
    return Case(policy, frozenset(ok or {200}), **options)


P, S, T, ST = Policy.PUBLIC, Policy.SIGNED_IN, Policy.TEAM_A, Policy.STAFF
JOB = {"kwargs": lambda w: {"job_id": w.job_a.id}}
ARRAY = {"kwargs": lambda w: {"array_id": w.array_a.id}}
PROBLEM = {"kwargs": lambda w: {"slug": w.problem.slug}}
APPLICATION = {"kwargs": lambda w: {"application_id": w.application.id}}
TEAM_A_QUERY = {"query": lambda w: f"team={w.team_a.slug}"}
RANGE = "start=2020-01-01&end=2030-12-31"

EXPECTATIONS: dict[str, list[Case]] = {
    "home": [C(P)],
    "healthz": [C(P)],
    "favicon": [C(P, 302)],
    # Prometheus' endpoint: the world configures a token, as it is off (404 for all) without one.
    "metrics": [C(Policy.METRICS)],
    "unsolved": [C(P)],
    "unsolved-feed": [C(P)],
    "problem-new": [C(ST)],
    "problem-edit": [C(ST, **PROBLEM)],
    "problem-solve": [C(ST, **PROBLEM)],
    "problem-reviewed": [C(ST, 302, method="POST", **PROBLEM)],
    "partners": [C(P)],
    "partners-thanks": [C(P)],
    "partners-review": [C(ST)],
    "partners-intake": [C(ST, 302, method="POST")],
    "partners-application": [C(ST, **APPLICATION)],
    "partners-accept": [C(ST, 422, method="POST", **APPLICATION)],  # an empty form: refused, nothing decided
    "partners-decline": [C(ST, 422, method="POST", **APPLICATION)],
    "partners-reinvite": [C(ST, 302, method="POST", **APPLICATION)],
    # A live link moves its token into the session and sends the visitor on to the password form (no token in
    # that URL, so none in a log).
    "invite": [C(P, 302, kwargs=lambda w: {"token": w.invitation_token})],
    "accounts:login": [C(P)],
    "accounts:logout": [C(P, 302, method="POST")],
    "accounts:tokens": [C(S)],
    "accounts:password": [C(S)],
    "accounts:password-reset": [C(P)],
    "accounts:password-reset-sent": [C(P)],
    "accounts:password-reset-confirm": [C(P, kwargs=lambda w: {"uidb64": "MQ", "token": "set-password"})],
    "notifications:settings": [C(S)],
    "notifications:webhooks": [C(T, kwargs=lambda w: {"team_slug": w.team_a.slug})],
    # A member who is not the team's admin is told so on the page (302); the webhook stays for the next visitor.
    "notifications:remove-webhook": [
        C(T, 302, method="POST", kwargs=lambda w: {"team_slug": w.team_a.slug, "webhook_id": _webhook(w).id})
    ],
    # Another user's token id is a silent no-op (the token stays live: checked in the test).
    "accounts:revoke-token": [C(S, 302, method="POST", kwargs=lambda w: {"token_id": w.token_a.id})],
    "accounts:secrets": [C(S)],
    # A plain member of team A is told only an admin deletes: a redirect, the secret kept (checked in tests/accounts).
    "accounts:delete-secret": [C(T, 302, method="POST", kwargs=lambda w: {"team_slug": w.team_a.slug})],
    # Members: a signed-in user with no team is told so (403); the others go to their first team's page.
    "accounts:members-home": [C(S, 302, 403)],
    "accounts:members": [C(T, kwargs=lambda w: {"team_slug": w.team_a.slug})],
    # A plain member of team A is refused (403); its admin and operators are refused too, with nothing changed:
    # no role was given (409), and removing team A's admin would leave it without one (409).
    "accounts:member-role": [C(T, 403, 409, method="POST", kwargs=lambda w: _member_of_a(w, "member_a"))],
    "accounts:member-remove": [C(T, 403, 409, method="POST", kwargs=lambda w: _member_of_a(w, "admin_a"))],
    "accounts:invitation-cancel": [
        C(
            T,
            302,
            403,
            method="POST",
            kwargs=lambda w: {"team_slug": w.team_a.slug, "invitation_id": _invitation(w).id},
        )
    ],
    "jobs:list": [C(S)],
    "jobs:new": [C(S)],
    "jobs:estimate": [C(S, method="POST")],
    "jobs:queue": [C(S), C(S, **TEAM_A_QUERY)],
    "jobs:detail": [C(T, **JOB)],
    "jobs:live": [C(T, **JOB)],
    "jobs:cancel": [C(T, 302, method="POST", **JOB)],
    "jobs:array-cancel": [C(T, 302, method="POST", **ARRAY)],
    "jobs:log": [C(T, **JOB)],
    "jobs:rerun": [C(T, **JOB)],
    # Team A's job has no delivered file of that name: 404 to its members too (the download itself is
    # checked per team in tests/staging/test_output_page_download.py).
    "jobs:output": [C(T, 404, query=lambda w: "path=result.txt", **JOB)],
    "jobs:transfers": [C(ST)],
    "metering:ledger": [C(S), C(T, **TEAM_A_QUERY)],
    "metering:live": [C(S), C(T, **TEAM_A_QUERY)],
    "metering:export_csv": [
        C(S, query=lambda w: RANGE),
        C(T, query=lambda w: f"team={w.team_a.slug}&{RANGE}"),
    ],
    "metering:export_json": [
        C(S, query=lambda w: RANGE),
        C(T, query=lambda w: f"team={w.team_a.slug}&{RANGE}"),
    ],
    "metering:check": [C(ST)],
    "metering:budget": [C(ST, kwargs=lambda w: {"slug": w.team_a.slug})],
    "metering:adjust": [C(ST, kwargs=lambda w: {"allocation_id": w.allocation_a.id})],
    "api:openapi-json": [C(P)],
    "api:openapi-view": [C(P)],
    "api:api-root": [C(P, 404)],
    "api:submit_job": [C(S, 422, method="POST")],  # an empty body: refused by validation, never stored
    "api:submit_job_file": [C(S, 422, method="POST")],  # "{}" is no job file: refused naming it, never stored
    "api:list_jobs": [C(S)],
    "api:get_job": [C(T, **JOB)],
    "api:list_outputs": [C(T, **JOB)],
    "api:cancel_job": [C(T, 409, method="POST", **JOB)],  # the job has ended: nothing to cancel
    "api:get_array": [C(T, **ARRAY)],
    "api:cancel_array": [C(T, 409, method="POST", **ARRAY)],  # no live task: nothing to cancel
    "api:job_meter": [C(T, **JOB)],
    "api:job_log": [C(T, **JOB)],
    # Only a job's submitter chooses its e-mail; the world's job has none, so every member is refused with 409.
    "api:set_job_email": [C(T, 409, method="POST", data={"email": "end"}, **JOB)],
    # The same for an array's tasks: none of the world's was submitted by a visitor.
    "api:set_array_email": [C(T, 409, method="POST", data={"email": "end"}, **ARRAY)],
    "api:email_choices": [C(S)],
    "api:set_email_choice": [
        C(T, method="PUT", data={"email": "failure"}, kwargs=lambda w: {"team_slug": w.team_a.slug})
    ],
    # The world's job was stored as a row, not submitted: its declaration is refused again (422), past the team gate.
    "api:rerun_job": [C(T, 422, method="POST", **JOB)],
    # Team A's job delivered nothing under that name: 404 for its team too, never its bytes to team B.
    "api:download_output": [C(T, 404, query=lambda w: "path=ok.txt", **JOB)],
    "api:list_secrets": [C(T, kwargs=lambda w: {"slug": w.team_a.slug})],
    # An empty body is refused before the team is looked up, for every signed-in visitor alike (no probing).
    "api:set_secret": [C(S, 422, method="PUT", kwargs=lambda w: {"slug": w.team_a.slug, "name": "HF_TOKEN"})],
    # Team A holds no such secret: 404 for its admin and operators, 403 for its plain member, 404 for team B.
    "api:delete_secret": [
        C(T, 403, 404, method="DELETE", kwargs=lambda w: {"slug": w.team_a.slug, "name": "HF_TOKEN"})
    ],
    "api:ledger": [C(S, query=lambda w: RANGE), C(T, query=lambda w: f"team={w.team_a.slug}&{RANGE}")],
    # The operator dashboard (operations/): staff only, 404 for everyone else. GET on an action: its confirm page.
    "operations:pool": [C(ST)],
    "operations:node-action": [C(ST, kwargs=lambda w: {"name": w.node.name, "action": "drain"})],
    "operations:queue": [C(ST)],
    "operations:utilisation": [C(ST)],
    "operations:jobs": [C(ST)],
    # Team A's job has ended: there is nothing to cancel (409), the page still opens for operators.
    "operations:job-action": [C(ST, 409, kwargs=lambda w: {"job_id": w.job_a.id, "action": "cancel"})],
    "operations:teams": [C(ST)],
    "operations:team": [C(ST, kwargs=lambda w: {"slug": w.team_a.slug})],
    "operations:health": [C(ST)],
    "operations:ledger-check": [C(ST, 302, method="POST")],
    "operations:audit": [C(ST)],
}

ADMIN_PUBLIC = {"admin:login": C(P, 200, 302)}  # operators are sent on to the admin index


def cases_for(route: Route) -> list[Case]:
    if route.key in EXPECTATIONS:
        return EXPECTATIONS[route.key]
    if route.key in ADMIN_PUBLIC:
        return [ADMIN_PUBLIC[route.key]]
    if route.route.startswith("admin/"):
        return [Case(Policy.ADMIN_SITE)]
    raise LookupError(
        f"URL {route.route!r} ({route.key}) has no expectation: add it to EXPECTATIONS in "
        "tests/security/matrix.py with the objects its arguments need"
    )


def admin_kwargs(route: Route, world: World) -> dict:
    """The admin's routes are generated per registered model: fill them from the route itself."""
    from django.apps import apps
    from django.contrib.contenttypes.models import ContentType

    parts = route.route.split("/")
    values: dict[str, object] = {"url": "no-such-admin-page/", "id": world.users["member_a"].pk}
    if "app_label" in route.args:
        values["app_label"] = route.route.split("(?P<app_label>")[1].split("|")[0]
    if "content_type_id" in route.args:
        values["content_type_id"] = ContentType.objects.get_for_model(world.team_a).id
        values["object_id"] = world.team_a.pk
    elif "object_id" in route.args:
        model = apps.get_model(parts[1], parts[2])
        first = model.objects.order_by("pk").first()
        values["object_id"] = first.pk if first else 1
    return values


def _webhook(world: World):
    """Team A's webhook, made again for each visitor (an admin's visit removes it)."""
    from notifications.models import Webhook

    hook, _ = Webhook.objects.get_or_create(
        team=world.team_a,
        url="https://hooks.example/e31",
        defaults={"secret": "s" * 20, "created_at": timezone.now()},
    )
    return hook


def _member_of_a(world: World, visitor: str) -> dict:
    return {"team_slug": world.team_a.slug, "user_id": world.users[visitor].pk}


def _invitation(world: World):
    """Team A's pending invitation, made again for each visitor (an admin's visit cancels it)."""
    from accounts.models import TeamInvitation

    now = timezone.now()
    invitation, _ = TeamInvitation.objects.get_or_create(
        team=world.team_a,
        email="invited@example.com",
        used_at=None,
        defaults={"digest": "0" * 64, "created_at": now, "expires_at": now + timedelta(days=7)},
    )
    return invitation


def path_for(route: Route, case: Case, world: World) -> str:
    kwargs = admin_kwargs(route, world) if route.route.startswith("admin/") else case.kwargs(world)
    try:
        path = build_path(route, kwargs)
    except LookupError as exc:
        raise AssertionError(
            f"URL {route.route!r} ({route.key}): cannot fill its arguments ({exc}); give its case in "
            "tests/security/matrix.py a kwargs= with a real object"
        ) from exc
    query = case.query(world)
    return f"{path}?{query}" if query else path


def is_api(route: Route) -> bool:
    return route.route.startswith(reverse("api:api-root").lstrip("/"))


def problem_with(route: Route, case: Case, visitor: str, response) -> str | None:
    """What is wrong with this answer to this visitor, or None."""
    status, location = response.status_code, response.get("Location", "")
    if case.policy is Policy.ADMIN_SITE:
        if visitor == "operator":
            good = status < 500
        else:  # to its sign-in, or (logout) to its index, which sends them on to sign in
            good = status == 302 and location.startswith((reverse("admin:login"), reverse("admin:index")))
        want = "< 500" if visitor == "operator" else "a redirect to the admin's sign-in"
    else:
        want = case.expected(visitor, api=is_api(route))
        if want == LOGIN:
            good = status == 302 and location.startswith(reverse("accounts:login"))
        else:
            good = status in want
    if good:
        return None
    return f"{case.method} {route.key} as {visitor}: got {status} {location}, expected {want}"


def request(world: World, visitor: str, route: Route, case: Case):
    path = path_for(route, case, world)
    if is_api(route):
        client = Client(raise_request_exception=False)
        headers = {"Authorization": f"Bearer {world.bearer[visitor]}"} if visitor != "anonymous" else {}
        body = json.dumps(case.data) if case.data else ("{}" if case.method == "POST" else None)
        return client.generic(case.method, path, body or "", content_type="application/json", headers=headers)
    client = world.client(visitor)
    response = client.post(path, case.data) if case.method == "POST" else client.get(path)
    if response.streaming:  # read to its end, as a server sends it: an export frees its place only then
        b"".join(response.streaming_content)
    return response
