"""Team secrets on real agents: the job sees the value; the host's processes, logs, pages and API never do."""

import hashlib
import json
import os
from pathlib import Path

import pytest
import redis
from django.conf import settings as django_settings
from django.test import Client
from django.utils import timezone

from accounts import services as accounts
from accounts import team_secrets
from jobs import declaration, logs, sandbox, services
from jobs.models import Job
from tests.e2e.conftest import wait_for, wait_for_state
from tests.e2e.test_lifecycle_e2e import py
from tests.factories import MembershipFactory, TeamFactory, UserFactory

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
VALUE = "wandb-e2e-3f9a71c0d2-never-on-the-host"

PROBE = """
import hashlib, json, os, pathlib, sys, time
value = os.environ.get('WANDB_API_KEY', '')
print('the job sees', value, flush=True)
home = pathlib.Path(os.environ['HOME'])
(home / 'ready').write_text(json.dumps({'sha256': hashlib.sha256(value.encode()).hexdigest(), 'pid': os.getpid()}))
for _ in range(600):
    if (home / 'go').exists():
        break
    time.sleep(0.1)
print('done', flush=True)
"""


@pytest.fixture
def member(live_pool):
    team = TeamFactory(name="vision", slug="vision")
    user = MembershipFactory(team=team, user=UserFactory(username="alice"), role="admin").user
    team_secrets.set_secret(team=team, name="WANDB_API_KEY", value=VALUE, user=user, now=timezone.now())
    return user


def submit_with_secret(member) -> Job:
    team = member.memberships.first().team
    spec = declaration.validate(
        {
            "name": "secret-probe", "work": {"argv": py(PROBE), "secrets": ["WANDB_API_KEY"]},
            "request": {"gpus": 1, "hours": 1},
            "output": {"uri": f"file://{django_settings.E31_OUTPUT_ROOTS[0]}/{team.slug}/out", "bytes": 1000},
        },
        limits=services.pool_limits(team=team),
    )  # fmt: skip
    return services.submit_job(team=team, user=member, spec=spec, now=timezone.now())


def processes() -> dict[int, dict]:
    """Every process on the host: uid, executable, command line and environment block as /proc shows them."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            found[int(entry.name)] = {
                "uid": entry.stat().st_uid,
                "exe": os.path.basename(os.readlink(entry / "exe")),
                "cmdline": (entry / "cmdline").read_bytes(),
                "environ": (entry / "environ").read_bytes(),
            }
        except OSError:  # gone meanwhile, or a kernel thread
            continue
    return found


def broker_bytes() -> bytes:
    """Everything the broker's database holds now (queues, unacked messages, results)."""
    client = redis.Redis.from_url(django_settings.CELERY_BROKER_URL)
    held = []
    for key in client.scan_iter(count=1000):
        kind = client.type(key)
        if kind == b"list":
            held += client.lrange(key, 0, -1)
        elif kind == b"hash":
            held += [k + v for k, v in client.hgetall(key).items()]
        elif kind == b"string":
            held.append(client.get(key) or b"")
        elif kind in (b"set", b"zset"):
            held += list(client.smembers(key)) if kind == b"set" else client.zrange(key, 0, -1)
    return b"".join(held)


def test_a_job_gets_its_secret_while_the_host_logs_pages_and_api_never_show_it(live_pool, member):
    job = wait_for_state(submit_with_secret(member).id, "running")
    allocation = job.allocations.get()
    work = sandbox.attempt_dirs(allocation).work
    wait_for(lambda: (work / "ready").exists(), what="the probe to read its secret")
    inside = json.loads((work / "ready").read_text())
    seen = processes()
    secret = VALUE.encode()
    job_uid = work.stat().st_uid
    agents = {live_pool.procs[node].pid for node in live_pool.nodes}
    try:
        on_command_lines = [pid for pid, p in seen.items() if secret in p["cmdline"]]
        in_environments = {pid: p for pid, p in seen.items() if secret in p["environ"]}
        bwraps = [pid for pid, p in seen.items() if p["exe"] == "bwrap" and p["uid"] == job_uid]
    finally:
        (work / "go").write_text("")
    assert inside["sha256"] == hashlib.sha256(secret).hexdigest()  # the job received the exact value
    assert bwraps and agents <= set(seen)  # what is looked at exists: the agents and the job's bubblewrap
    assert on_command_lines == []  # no `ps` shows it: not the agent's, not bwrap's, not the job's
    # Only the job's own process holds it in its environment: never an agent, never bubblewrap.
    assert set(in_environments) == {
        pid for pid, p in in_environments.items() if p["exe"].startswith("python")
    }
    assert all(p["uid"] == job_uid for p in in_environments.values()) and not agents & set(in_environments)
    assert not set(bwraps) & set(in_environments)

    job = wait_for_state(job.id, "released")
    assert job.end_reason == "succeeded", job.log_tail
    whole_log = b"".join(logs.log_bytes(job, attempt=job.attempt, rank=0))
    assert b"the job sees [secret WANDB_API_KEY]" in whole_log and secret not in whole_log
    assert "[secret WANDB_API_KEY]" in job.log_tail and VALUE not in job.log_tail
    assert VALUE not in json.dumps(list(job.events.values()), default=str)
    for node in live_pool.nodes:
        assert VALUE not in live_pool.log(node)  # the agents' own logs
    assert secret not in broker_bytes()

    client = Client()
    token = accounts.create_api_token(user=member, label="e2e")[1]
    api = client.get(f"/api/v1/jobs/{job.id}", HTTP_AUTHORIZATION=f"Bearer {token}")
    log_api = client.get(f"/api/v1/jobs/{job.id}/log", HTTP_AUTHORIZATION=f"Bearer {token}")
    client.force_login(member)
    pages = [
        client.get(f"/jobs/{job.id}/"),
        client.get(f"/jobs/{job.id}/log/"),
        client.get("/accounts/secrets/"),
    ]
    for response in (api, log_api, *pages):
        assert response.status_code == 200
        body = b"".join(response.streaming_content) if response.streaming else response.content
        assert secret not in body
    assert b"[secret WANDB_API_KEY]" in log_api.content
