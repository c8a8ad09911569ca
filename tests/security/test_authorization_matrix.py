"""Every route, for every kind of visitor, generated from the URL configuration: a new URL cannot skip it."""

import logging

import pytest

from tests.security.conftest import VISITORS
from tests.security.matrix import EXPECTATIONS, cases_for, path_for, problem_with, request
from tests.security.routes import all_routes

pytestmark = pytest.mark.django_db


def test_every_url_has_an_expectation_and_real_objects_for_its_arguments(world):
    problems = []
    for route in all_routes():
        try:
            for case in cases_for(route):
                path_for(route, case, world)
        except (LookupError, AssertionError) as exc:
            problems.append(str(exc))
    assert not problems, "\n".join(problems)


def test_the_expectations_name_no_url_that_no_longer_exists():
    names = {route.key for route in all_routes()}
    assert set(EXPECTATIONS) - names == set()


def _logged_denial(caplog, *, status: int, path: str, user: str) -> bool:
    return any(
        r.name == "e31.denials" and r.levelno == logging.WARNING
        and (r.status, r.path, r.user) == (status, path, user)
        for r in caplog.records
    )  # fmt: skip


def _denial_problem(caplog, response) -> str | None:
    status, path = response.status_code, response.wsgi_request.path
    # The request's own user: a Bearer token is only read by the endpoints that require one.
    user = response.wsgi_request.user.get_username() if response.wsgi_request.user.is_authenticated else ""
    must_log = status in (401, 403, 429) or (status == 404 and user)
    if must_log and not _logged_denial(caplog, status=status, path=path, user=user):
        return f"{status} on {path} for {user or 'anonymous'} was not logged on e31.denials"
    return None


def test_every_route_answers_each_visitor_as_its_policy_says_and_every_denial_is_logged(world, caplog):
    caplog.set_level(logging.WARNING, logger="e31.denials")
    failures, requests, denials = [], 0, 0
    for route in all_routes():
        for case in cases_for(route):
            for visitor in VISITORS:
                caplog.clear()
                response = request(world, visitor, route, case)
                requests += 1
                denials += response.status_code in (401, 403, 404)
                failures += filter(None, [
                    problem_with(route, case, visitor, response), _denial_problem(caplog, response),
                ])  # fmt: skip
                if route.key == "accounts:revoke-token" and visitor != "member_a":
                    world.token_a.refresh_from_db()
                    if world.token_a.revoked_at is not None:
                        failures.append(f"{visitor} revoked member_a's API token")
    print(f"authorization matrix: {len(all_routes())} routes, {requests} requests, {denials} denials")
    assert not failures, "\n".join(failures)
