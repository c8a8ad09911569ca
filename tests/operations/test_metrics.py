"""/metrics: the pool's state in Prometheus' text format, read from the database at each scrape.

It answers a scraper holding E31_METRICS_TOKEN and a signed-in operator; everyone else, and everyone
while no token is configured, gets 404, as for the other operator pages.
"""

import logging
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import time_machine
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from prometheus_client.parser import text_string_to_metric_families

from jobs import planning
from jobs.lifecycle import State
from jobs.models import Allocation, DataInput, ImagePull, Node, NodeGpu, OutputTransfer, SchedulerState
from metering import services as metering
from notifications.models import WebhookAttempt, WebhookDelivery
from operations import services, utilisation
from operations.models import UtilisationSample
from tests.factories import JobFactory, NodeFactory, WebhookFactory
from tests.operations.conftest import running_job

pytestmark = pytest.mark.django_db

URL = "/metrics"
TOKEN = "scrape-token-0123456789abcdef"
NOW = datetime(2026, 3, 2, 12, 10, tzinfo=UTC)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def metrics_on(settings):
    settings.E31_METRICS_TOKEN = TOKEN


def _scrape(client: Client | None = None, *, token: str | None = TOKEN, **headers):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token is not None else {}
    return (client or Client()).get(URL, **auth, **headers)


def _values(response) -> dict[tuple[str, tuple], float]:
    """Every sample, keyed by its name and sorted labels, as a Prometheus server would parse it."""
    families = text_string_to_metric_families(response.content.decode())
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


def _ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


# --------------------------------------------------------------------------- a known pool


def _nodes(prefix: str) -> dict[str, Node]:
    """a: 3 GPUs listed and a 4th missing; b: drained; c: down; d and e: up (e has never beaten)."""
    nodes = {
        "a": NodeFactory(name=f"{prefix}gpu-a", gpus=3),
        "b": NodeFactory(name=f"{prefix}gpu-b", gpus=4),
        "c": NodeFactory(name=f"{prefix}gpu-c", gpus=2),
        "d": NodeFactory(name=f"{prefix}gpu-d", gpus=4),
        "e": NodeFactory(name=f"{prefix}gpu-e", gpus=2),
    }
    NodeGpu.objects.bulk_create(
        NodeGpu(node=nodes["a"], index=i, present=i < 3, changed_at=_ago(3600)) for i in range(4)
    )
    return nodes


def _released_with_delivery(team, node: Node, state: str) -> None:
    job = JobFactory(team=team, state=State.RELEASED, end_reason="succeeded", attempt=1)
    allocation = Allocation.objects.create(
        job=job, attempt=1, node=node, gpu_indices=[0], rented_at=_ago(7200), released_at=_ago(600)
    )
    OutputTransfer.objects.create(allocation=allocation, job=job, state=state, updated_at=_ago(60))


def _staging_job(team) -> None:
    job = JobFactory(team=team, state=State.STAGING)
    for position, stage_state in enumerate(["staging", "waiting", "staged"]):
        DataInput.objects.create(
            job=job,
            position=position,
            name=f"d{position}",
            uri="file:///d",
            bytes=10,
            stage_state=stage_state,
        )
    ImagePull.objects.create(job=job, reference="trainer:1", stage_state="staging")


def _webhook_deliveries(team, prefix: str) -> None:
    hook = WebhookFactory(team=team, url="https://hooks.example/e31", secret="s" * 20, created_at=NOW)
    for key, state, attempts, failed_tries, age in [
        ("fresh", WebhookDelivery.PENDING, 0, 0, 120),
        ("first-try-under-way", WebhookDelivery.PENDING, 1, 0, 30),  # claimed, no answer recorded yet
        ("retried", WebhookDelivery.PENDING, 2, 2, 900),
        ("gave-up", WebhookDelivery.FAILED, 6, 6, 5000),
        ("done", WebhookDelivery.DELIVERED, 1, 0, 9000),
    ]:
        delivery = WebhookDelivery.objects.create(
            webhook=hook, event_key=f"{prefix}{key}", event="ended", payload={}, state=state,
            attempts=attempts, next_attempt_at=NOW, created_at=_ago(age),
        )  # fmt: skip
        WebhookAttempt.objects.bulk_create(
            WebhookAttempt(delivery=delivery, number=n, at=NOW, status=500)
            for n in range(1, failed_tries + 1)
        )


def build_pool(team, *, prefix: str = "") -> None:
    """The known pool the expected values below describe; ``prefix`` builds it again beside itself."""
    nodes = _nodes(prefix)
    running_job(team=team, node=nodes["a"], gpus=2, now=datetime(2026, 3, 2, 9, 30, tzinfo=UTC))
    running_job(team=team, node=nodes["d"], gpus=1, now=_ago(600))
    Node.objects.filter(id=nodes["b"].id).update(state=Node.NodeState.DRAINED, last_heartbeat=_ago(5))
    Node.objects.filter(id=nodes["c"].id).update(state=Node.NodeState.DOWN, last_heartbeat=_ago(600))
    Node.objects.filter(id=nodes["a"].id).update(last_heartbeat=_ago(2))
    Node.objects.filter(id=nodes["d"].id).update(last_heartbeat=_ago(45))  # past E31_NODE_TIMEOUT_S (30)
    Node.objects.filter(id=nodes["e"].id).update(last_heartbeat=None)
    JobFactory(team=team, state=State.QUEUED, state_changed_at=_ago(300), submitted_at=_ago(4000))
    JobFactory(team=team, state=State.QUEUED, state_changed_at=_ago(60))
    JobFactory(team=team, state=State.SUBMITTED)
    JobFactory(team=team, state=State.ENDED, end_reason="cancelled")
    _staging_job(team)
    _released_with_delivery(team, nodes["b"], OutputTransfer.WAITING)
    _released_with_delivery(team, nodes["b"], OutputTransfer.DELIVERING)
    _webhook_deliveries(team, prefix)


def record_the_platform_rows() -> None:
    """The single rows: the last scheduler pass, beat's and the ledger check's probes, a utilisation sample."""
    planning.record_pass(started=2, elapsed_ms=150.0, now=_ago(20))
    SchedulerState.objects.update(pass_requested=True)
    services.beat_heartbeat(now=_ago(10))
    services.record_probe(name="ledger", ok=False, detail="an allocation's rows do not tile", now=_ago(100))
    UtilisationSample.objects.create(
        minute=utilisation.minute_of(NOW), at=NOW, total_gpus=15, busy_gpus=3, reserved_gpus=1,
        idle_while_waiting_gpus=0, queued_jobs=2,
        reservations={"77": {"start_at": "2026-03-02T13:00:00+00:00", "gpus_by_node": {"gpu-a": [2]}}},
    )  # fmt: skip


@pytest.fixture
def known_pool(team):
    with time_machine.travel(NOW, tick=False):
        build_pool(team)
        record_the_platform_rows()


EXPECTED_GPUS = {  # node -> state -> GPUs
    "gpu-a": {"held": 2, "reserved": 1, "idle": 0, "drained": 0, "offline": 0, "missing": 1},
    "gpu-b": {"held": 0, "reserved": 0, "idle": 0, "drained": 4, "offline": 0, "missing": 0},
    "gpu-c": {"held": 0, "reserved": 0, "idle": 0, "drained": 0, "offline": 2, "missing": 0},
    "gpu-d": {"held": 1, "reserved": 0, "idle": 3, "drained": 0, "offline": 0, "missing": 0},
    "gpu-e": {"held": 0, "reserved": 0, "idle": 2, "drained": 0, "offline": 0, "missing": 0},
}


def _scrape_at_now():
    with time_machine.travel(NOW, tick=False):
        response = _scrape()
    assert response.status_code == 200, response.status_code
    return _values(response)


# --------------------------------------------------------------------------- values


def test_jobs_are_counted_by_every_live_state_and_the_oldest_queued_wait_is_read(metrics_on, known_pool):
    values = _scrape_at_now()
    expected = {"submitted": 1, "staging": 1, "queued": 2, "rented": 0, "running": 2, "output": 0}
    assert {s: values[("e31_jobs", (("state", s),))] for s in expected} == expected
    # Ended jobs are the history, which only grows: counting them would read every job at every scrape.
    assert not {s for (name, labels) in values if name == "e31_jobs" for _, s in labels} - set(expected)
    # Since it entered the queue, not since its submission 4000 s ago: staging is no wait for GPUs.
    assert values[("e31_queue_oldest_wait_seconds", ())] == 300


def test_each_nodes_gpus_are_counted_by_state_and_add_up_to_its_listed_gpus(metrics_on, known_pool):
    values = _scrape_at_now()
    found = {
        node: {state: values[("e31_node_gpus", (("node", node), ("state", state)))] for state in states}
        for node, states in EXPECTED_GPUS.items()
    }
    assert found == EXPECTED_GPUS


def test_nodes_are_counted_by_state_with_each_ones_heartbeat_age(metrics_on, known_pool):
    values = _scrape_at_now()
    assert {s: values[("e31_nodes", (("state", s),))] for s in Node.NodeState.values} == {
        "up": 3, "draining": 0, "drained": 1, "down": 1,
    }  # fmt: skip
    ages = {
        labels[0][1]: v for (name, labels), v in values.items() if name == "e31_node_heartbeat_age_seconds"
    }
    assert ages == {"gpu-a": 2, "gpu-b": 5, "gpu-c": 600, "gpu-d": 45}  # gpu-e never beat: no sample
    # Live nodes silent past E31_NODE_TIMEOUT_S, as the health page counts them: gpu-d, and gpu-e which never beat.
    assert values[("e31_nodes_silent", ())] == 2


def test_the_scheduler_beat_and_ledger_check_are_read_from_their_rows(metrics_on, known_pool):
    values = _scrape_at_now()
    assert values[("e31_scheduler_last_pass_age_seconds", ())] == 20
    assert values[("e31_scheduler_last_pass_duration_seconds", ())] == 0.15
    assert values[("e31_scheduler_last_pass_started_jobs", ())] == 2
    assert values[("e31_scheduler_pass_requested", ())] == 1
    assert values[("e31_probe_age_seconds", (("probe", "beat"),))] == 10
    assert values[("e31_probe_ok", (("probe", "beat"),))] == 1
    assert values[("e31_probe_age_seconds", (("probe", "ledger"),))] == 100
    assert values[("e31_probe_ok", (("probe", "ledger"),))] == 0


def test_transfers_and_webhook_deliveries_in_flight_are_counted(metrics_on, known_pool):
    values = _scrape_at_now()
    staging = {k: values[("e31_staging_transfers", (("kind", k[0]), ("state", k[1])))]
               for k in [("dataset", "staging"), ("dataset", "waiting"), ("image", "staging"), ("image", "waiting")]}  # fmt: skip
    assert staging == {("dataset", "staging"): 1, ("dataset", "waiting"): 1, ("image", "staging"): 1,
                       ("image", "waiting"): 0}  # fmt: skip
    assert values[("e31_output_transfers", (("state", "waiting"),))] == 1
    assert values[("e31_output_transfers", (("state", "delivering"),))] == 1
    hooks = {
        s: values[("e31_webhook_deliveries", (("state", s),))] for s in ("pending", "retrying", "failed")
    }
    # Retrying: a try answered and failed; one under way for the first time is still only pending.
    assert hooks == {"pending": 2, "retrying": 1, "failed": 1}
    assert values[("e31_webhook_oldest_pending_seconds", ())] == 900


def test_the_meter_lag_is_how_long_ago_the_first_hour_accrual_has_not_closed_ended(metrics_on, known_pool):
    # gpu-a's job was rented at 09:30 and nothing accrued it: its hour 09:30-10:00 ended 2 h 10 min ago.
    assert _scrape_at_now()[("e31_meter_accrual_lag_seconds", ())] == 2 * 3600 + 600
    metering.accrue_meter(now=NOW)  # closes every held allocation's ended hours, through 12:00
    assert _scrape_at_now()[("e31_meter_accrual_lag_seconds", ())] == 0


def test_an_empty_pool_still_answers_with_zeros_and_no_pass_figures(metrics_on, db):
    values = _scrape_at_now()
    assert values[("e31_jobs", (("state", "queued"),))] == 0
    assert values[("e31_queue_oldest_wait_seconds", ())] == 0
    assert values[("e31_meter_accrual_lag_seconds", ())] == 0
    assert not any(name.startswith("e31_scheduler_last_pass") for name, _ in values)  # nothing recorded yet
    assert not SchedulerState.objects.exists()  # a scrape writes nothing, not even the scheduler's row


def test_no_sample_names_a_team_a_job_or_a_secret(metrics_on, known_pool, team):
    with time_machine.travel(NOW, tick=False):
        text = _scrape().content.decode()
    assert team.slug not in text and team.name not in text
    assert "hooks.example" not in text and "s" * 20 not in text
    labels = {k for (_, ls), _ in _values(_scrape()).items() for k, _ in ls}
    assert labels <= {"state", "node", "kind", "probe"}


# --------------------------------------------------------------------------- cost


def _queries(client: Client) -> int:
    with CaptureQueriesContext(connection) as queries:
        assert _scrape(client).status_code == 200
    return len(queries)


def test_a_scrape_runs_a_fixed_number_of_queries_whatever_the_pools_size(metrics_on, team):
    client = Client()
    with time_machine.travel(NOW, tick=False):
        build_pool(team)
        record_the_platform_rows()
        small = _queries(client)
        for i in range(4):
            build_pool(team, prefix=f"x{i}-")
        large = _queries(client)
    assert Node.objects.count() == 25
    assert small == large <= 13  # 13 reads of the pool; the right token reads nothing of the limiter


def test_a_scrape_counts_only_the_live_jobs_never_the_history(metrics_on, team):
    """Every scrape grouped the whole jobs table by state: 63 ms of database time at 200,000 jobs, growing with
    a history that retention never shrinks. Only live states are read, a range of the (state, …) index."""
    with CaptureQueriesContext(connection) as queries:
        assert _scrape(Client()).status_code == 200
    on_jobs = [q["sql"] for q in queries if 'FROM "jobs_job"' in q["sql"]]
    assert on_jobs and all('"jobs_job"."state" IN (' in sql for sql in on_jobs), on_jobs
    assert all(f"'{state}'" not in sql for sql in on_jobs for state in ("released", "ended")), on_jobs


# --------------------------------------------------------------------------- who may read it


def test_a_scraper_with_the_token_gets_the_text_format_and_no_cookie(metrics_on, db):
    response = _scrape(Client(enforce_csrf_checks=True))
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    assert not response.cookies  # no session, no CSRF cookie: a scraper keeps no state
    assert {"private", "no-store"} <= {d.strip() for d in response["Cache-Control"].split(",")}


def test_a_scraper_asking_for_openmetrics_gets_it(metrics_on, db):
    response = _scrape(HTTP_ACCEPT="application/openmetrics-text; version=1.0.0")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/openmetrics-text")
    assert response.content.decode().endswith("# EOF\n")


@pytest.mark.parametrize(
    "header",
    [None, "Bearer ", "Bearer wrong-token-0123456789abcdef", f"Basic {TOKEN}", f"Bearer {TOKEN}x", TOKEN],
)
def test_a_missing_or_wrong_token_is_refused_with_404(metrics_on, db, header):
    headers = {"HTTP_AUTHORIZATION": header} if header is not None else {}
    assert Client().get(URL, **headers).status_code == 404


def test_a_wrong_token_is_logged_as_a_denial(metrics_on, db, caplog):
    caplog.set_level(logging.WARNING, logger="e31.denials")
    assert _scrape(token="wrong-token-0123456789abcdef").status_code == 404
    assert any(r.name == "e31.denials" and r.status == 404 and r.path == URL for r in caplog.records)


# --------------------------------------------------------------------------- guessing the token

WRONG = "wrong-token-0123456789abcdef"
GUESSER, SCRAPER = "203.0.113.7", "198.51.100.9"


@pytest.fixture
def limit_of_3(metrics_on, settings):
    settings.E31_METRICS_FAILURE_LIMIT, settings.E31_METRICS_FAILURE_WINDOW_S = 3, 600
    with time_machine.travel(NOW + timedelta(seconds=10), tick=False):  # 590 s left in the window
        yield


def _from(address: str, token: str | None):
    return _scrape(token=token, REMOTE_ADDR=address)


def test_an_address_past_its_wrong_tokens_gets_429_until_the_window_ends(limit_of_3, caplog):
    caplog.set_level(logging.WARNING, logger="e31.denials")
    assert [_from(GUESSER, WRONG).status_code for _ in range(3)] == [404, 404, 404]
    refused = _from(GUESSER, WRONG)
    assert refused.status_code == 429 and refused["Retry-After"] == "590"
    assert any(r.name == "e31.denials" and r.status == 429 and r.path == URL for r in caplog.records)
    with time_machine.travel(NOW + timedelta(seconds=600), tick=False):
        assert _from(GUESSER, WRONG).status_code == 404


def test_past_the_limit_the_right_token_from_that_address_is_still_served(limit_of_3):
    """The scraper may share its address (NAT, a proxy not in E31_TRUSTED_PROXIES) with whoever sends wrong
    tokens: were the right token refused too, a few wrong ones each window would keep the monitoring dark."""
    assert [_from(SCRAPER, WRONG).status_code for _ in range(3)] == [404, 404, 404]
    served = _from(SCRAPER, TOKEN)
    assert served.status_code == 200 and "e31_jobs" in served.content.decode()
    refused = _from(SCRAPER, WRONG)
    assert refused.status_code == 429 and refused["Retry-After"] == "590"
    assert _from(SCRAPER, TOKEN).status_code == 200


def test_the_right_token_from_another_address_is_served_while_a_guesser_is_refused(limit_of_3):
    for _ in range(4):
        _from(GUESSER, WRONG)
    assert _from(SCRAPER, TOKEN).status_code == 200
    assert _from(SCRAPER, WRONG).status_code == 404  # the scraper's address has its own count


def test_the_right_token_is_never_counted_as_a_failure(limit_of_3):
    assert all(_from(SCRAPER, TOKEN).status_code == 200 for _ in range(5))
    assert [_from(SCRAPER, WRONG).status_code for _ in range(3)] == [404, 404, 404]


def test_a_guessers_address_may_still_open_the_page_in_an_operators_session(limit_of_3, operator_client):
    for _ in range(4):
        _from(GUESSER, WRONG)
    assert operator_client.get(URL, REMOTE_ADDR=GUESSER).status_code == 200


def test_a_members_api_token_is_not_the_metrics_token(metrics_on, member_token):
    assert _scrape(token=member_token).status_code == 404


def test_a_members_session_is_refused_and_an_operators_is_let_in(metrics_on, member_client, operator_client):
    assert member_client.get(URL).status_code == 404
    response = operator_client.get(URL)
    assert response.status_code == 200 and "e31_jobs" in response.content.decode()


def test_a_wrong_token_is_refused_even_beside_an_operators_session(metrics_on, operator_client):
    assert _scrape(operator_client, token="wrong-token-0123456789abcdef").status_code == 404


def test_with_no_token_configured_the_endpoint_is_off_for_everyone(settings, operator_client, db):
    settings.E31_METRICS_TOKEN = ""
    assert _scrape(token="").status_code == 404
    assert _scrape(token=TOKEN).status_code == 404
    assert operator_client.get(URL).status_code == 404


def test_only_safe_methods_are_answered(metrics_on, db):
    response = Client().post(URL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 405


# --------------------------------------------------------------------------- the setting


def _setting(**env: str) -> subprocess.CompletedProcess:
    """Settings are read once at start-up: each case reads them in a fresh process."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("E31_METRICS_TOKEN")}
    code = (
        "import django; django.setup(); from django.conf import settings; print(settings.E31_METRICS_TOKEN)"
    )
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**clean, "DJANGO_SETTINGS_MODULE": "e31web.settings", **env},
    )  # fmt: skip


def test_the_token_may_come_from_a_file(tmp_path):
    secret = tmp_path / "metrics_token"
    secret.write_text(TOKEN + "\n")
    done = _setting(E31_METRICS_TOKEN_FILE=str(secret))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == TOKEN


def test_a_short_token_is_refused_at_start():
    done = _setting(E31_METRICS_TOKEN="short")
    assert done.returncode != 0
    assert "E31_METRICS_TOKEN" in done.stderr


def test_a_failure_window_of_zero_seconds_is_refused_at_start():
    done = _setting(E31_METRICS_FAILURE_WINDOW_S="0")
    assert done.returncode != 0
    assert "E31_METRICS_FAILURE_WINDOW_S" in done.stderr
