"""The doorbell sends tasks by name, after commit: every name it rings is a task a worker runs."""

import ast
import threading
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import celery
import psycopg
import pytest
from django.conf import settings
from django.db import connection

from jobs import dispatch, nodes, scheduler
from jobs.models import SchedulerState
from notifications import services as notifications


def _registered_in_a_worker() -> set[str]:
    celery.current_app.loader.import_default_modules()  # what a worker does on start: autodiscovery
    return set(celery.current_app.tasks)


ROOT = Path(__file__).resolve().parents[2]


def _product_modules() -> list[Path]:
    packages = [p for p in ROOT.iterdir() if (p / "__init__.py").is_file() and p.name != "tests"]
    return [path for package in packages for path in package.rglob("*.py") if "migrations" not in path.parts]


def _callee(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _rung_by_the_product() -> tuple[set[str], list[str]]:
    """The task names the product passes to dispatch.send_after_commit, directly or through a function
    of its module that hands its first parameter on (notifications' ``_ring``); and what could not be read."""
    trees = {path: ast.parse(path.read_text()) for path in _product_modules()}
    constants = {
        target.id: node.value.value
        for tree in trees.values()
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for target in node.targets
        if isinstance(target, ast.Name) and isinstance(node.value.value, str)
    }
    rung, unread = set(), []
    for path, tree in trees.items():
        functions = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)]
        forwarding = {}  # a function's name -> its parameter it rings with
        for function in functions:
            params = [a.arg for a in function.args.args + function.args.kwonlyargs]
            for call in ast.walk(function):
                if isinstance(call, ast.Call) and _callee(call) == "send_after_commit" and call.args:
                    first = call.args[0]
                    if isinstance(first, ast.Name) and first.id in params:
                        forwarding[function.name] = first.id
        ringers = {"send_after_commit", *forwarding}
        for call in ast.walk(tree):
            if not (isinstance(call, ast.Call) and _callee(call) in ringers and call.args):
                continue
            first = call.args[0]
            name = first.id if isinstance(first, ast.Name) else getattr(first, "attr", None)
            if name in constants:
                rung.add(constants[name])
            elif not any(name == param for param in forwarding.values()):
                unread.append(f"{path.relative_to(ROOT)}:{call.lineno}")
    return rung, unread


def test_every_task_the_doorbell_rings_is_registered():
    rung, unread = _rung_by_the_product()
    assert unread == [], "send_after_commit called with a task name that is not a module constant"
    assert {
        dispatch.STAGE_JOB, dispatch.RUN_REQUESTED_PASSES, dispatch.RUN_PART, dispatch.DELIVER_PART,
        notifications.SEND_JOB_EMAIL, notifications.DELIVER_WEBHOOK,
    } <= rung  # fmt: skip
    registered = _registered_in_a_worker()
    assert rung <= registered, f"not registered: {rung - registered}"


def test_every_beat_entry_names_a_registered_task():
    registered = _registered_in_a_worker()
    scheduled = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert scheduled <= registered, f"not registered: {scheduled - registered}"


@pytest.mark.django_db
def test_tasks_are_sent_by_name_to_their_queue_once_the_transaction_commits(
    monkeypatch, django_capture_on_commit_callbacks
):
    sent = []
    monkeypatch.setattr(celery.current_app, "send_task", lambda name, **kw: sent.append((name, kw)))
    with django_capture_on_commit_callbacks(execute=True):
        dispatch.stage_job(7)
        dispatch.run_part(8, "gpu-01")
        dispatch.deliver_part(9, "gpu-02")
        assert sent == []  # nothing leaves before the commit
    assert sent == [
        (dispatch.STAGE_JOB, {"args": (7,), "queue": f"{settings.CELERY_TASK_DEFAULT_QUEUE}.staging"}),
        (dispatch.RUN_PART, {"args": (8,), "queue": "node.gpu-01"}),
        (dispatch.DELIVER_PART, {"args": (9,), "queue": "node.gpu-02"}),
    ]


@pytest.mark.django_db
def test_pass_requests_coalesce_into_one_ring_until_a_pass_claims_them(
    monkeypatch, django_capture_on_commit_callbacks
):
    sent = []
    monkeypatch.setattr(celery.current_app, "send_task", lambda name, **kw: sent.append(name))
    with django_capture_on_commit_callbacks(execute=True):
        dispatch.request_scheduler_pass()
        dispatch.request_scheduler_pass()
    assert sent == [dispatch.RUN_REQUESTED_PASSES]
    assert dispatch.claim_requested_pass() is True
    assert dispatch.claim_requested_pass() is False
    assert SchedulerState.objects.count() == 1


@pytest.mark.django_db(transaction=True)  # the flag is raised at commit
def test_requested_passes_run_until_no_request_is_left(monkeypatch):
    now = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
    ran = []

    def one_pass(*, now):
        ran.append(now)
        if len(ran) == 1:
            dispatch.request_scheduler_pass()  # a submission arrives during the first pass

    monkeypatch.setattr(scheduler, "_pass", one_pass)
    dispatch.request_scheduler_pass()
    assert scheduler.run_requested_passes(clock=lambda: now) == 2
    assert ran == [now, now]
    assert scheduler.run_requested_passes(clock=lambda: now) == 0  # nothing asked: no pass


@contextmanager
def _pass_elsewhere():
    """Another process holding the pass lock (its own session), mid-pass; ``release()`` ends its pass."""
    db = connection.settings_dict
    other = psycopg.connect(dbname=db["NAME"], user=db["USER"], password=db["PASSWORD"], host=db["HOST"],
                            port=db["PORT"], autocommit=True)  # fmt: skip
    other.execute("SELECT pg_advisory_lock(%s)", [scheduler.ADVISORY_LOCK_KEY])
    try:
        yield lambda: other.execute("SELECT pg_advisory_unlock(%s)", [scheduler.ADVISORY_LOCK_KEY])
    finally:
        other.close()


@pytest.mark.django_db(transaction=True)  # the flag is raised at commit
def test_a_request_claimed_while_a_pass_runs_elsewhere_waits_for_it_then_runs(monkeypatch):
    ran = []
    monkeypatch.setattr(scheduler, "_pass", lambda *, now: ran.append(now))
    dispatch.request_scheduler_pass()  # staging queued a job after the pass elsewhere read the pool
    with _pass_elsewhere() as end_it:
        threading.Timer(0.3, end_it).start()
        assert scheduler.run_requested_passes(clock=lambda: datetime(2026, 12, 1, 9, 0, tzinfo=UTC)) == 1
    assert len(ran) == 1


@pytest.mark.django_db(transaction=True)  # the flag is raised at commit
def test_a_request_is_asked_again_when_a_pass_elsewhere_outlasts_the_wait(monkeypatch):
    monkeypatch.setattr(scheduler, "PASS_WAIT_S", 0.2)
    monkeypatch.setattr(scheduler, "_pass", lambda *, now: pytest.fail("ran a pass without the lock"))
    dispatch.request_scheduler_pass()
    with _pass_elsewhere():
        assert scheduler.run_requested_passes(clock=lambda: datetime(2026, 12, 1, 9, 0, tzinfo=UTC)) == 0
    assert SchedulerState.objects.get().pass_requested


@pytest.mark.django_db(transaction=True)  # the flag is raised at commit
def test_a_safety_pass_that_finds_a_pass_running_elsewhere_leaves_the_request_to_its_doorbell(monkeypatch):
    """It cleared the flag and then ran nothing: the doorbell's task, coming next, found no request and the
    submission made during the other pass waited for the next safety pass (up to 30 s)."""
    monkeypatch.setattr(scheduler, "_pass", lambda *, now: pytest.fail("ran a pass without the lock"))
    monkeypatch.setattr(nodes, "settle_drains", lambda *, now: None)
    dispatch.request_scheduler_pass()  # a submission while the pass elsewhere runs
    with _pass_elsewhere():
        scheduler.run_safety_pass(now=datetime(2026, 12, 1, 9, 0, tzinfo=UTC))
    assert SchedulerState.objects.get().pass_requested
