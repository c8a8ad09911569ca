"""A job runs in its image on a real pool: the image's root as /, read-only, its Env, WorkingDir and
Entrypoint/Cmd honoured, the job's own directories under /e31, and argv in place of Cmd."""

import os

import pytest
from django.utils import timezone

from jobs import declaration, services
from jobs.models import ImagePull
from tests.e2e.conftest import live_pool, wait_for_state  # noqa: F401 - the pool fixture
from tests.factories import MembershipFactory, TeamFactory, UserFactory

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

PROBE = (
    'echo "greeting=$GREETING pwd=$(pwd) home=$HOME"; '
    "test -e /usr/bin/python3 && echo host-visible || echo host-hidden; "
    "touch /made-here 2>/dev/null && echo root-writable || echo root-read-only; "
    "cat /etc/image-release; echo result > $E31_OUTPUT_DIR/out.txt && echo wrote-output"
)


@pytest.fixture
def image_pool(monkeypatch, pool_registry, base_image):
    """The agents' environment names the tests' registry as the pool's (set before the pool starts)."""
    monkeypatch.setenv("E31_POOL_REGISTRIES", pool_registry.host)
    return base_image


def submit(member, image: str, argv: list[str], name: str):
    team = member.memberships.first().team
    from django.conf import settings

    spec = declaration.validate(
        {
            "name": name, "work": {"argv": argv, "image": image},
            "request": {"gpus": 1, "hours": 1.0},
            "output": {"uri": f"file://{settings.E31_OUTPUT_ROOTS[0]}/{team.slug}/out", "bytes": 1000},
        },
        limits=services.pool_limits(team=team),
    )  # fmt: skip
    return services.submit_job(team=team, user=member, spec=spec, now=timezone.now())


@pytest.mark.skipif(os.geteuid() != 0, reason="the pool's agents run jobs in bubblewrap as root, as CI does")
def test_a_job_runs_in_its_image_with_its_entrypoint_env_and_workdir(image_pool, live_pool, settings):  # noqa: F811
    member = MembershipFactory(team=TeamFactory(slug="vision"), user=UserFactory(username="alice")).user
    plain = wait_for_state(submit(member, image_pool, [], "image-cmd").id, "released", "ended", timeout=90)
    assert plain.end_reason == "succeeded", (plain.end_detail, plain.log_tail)
    assert (
        "hello from the image in /srv as " in plain.log_tail
    )  # Entrypoint sh -c, the image's Cmd, Env, WorkingDir

    probe = wait_for_state(
        submit(member, image_pool, [PROBE], "image-argv").id, "released", "ended", timeout=90
    )
    assert probe.end_reason == "succeeded", (probe.end_detail, probe.log_tail)
    lines = probe.log_tail.splitlines()
    assert "greeting=hello from the image pwd=/srv home=/e31/work" in lines  # argv replaced Cmd, nothing else
    assert {"host-hidden", "root-read-only", "tests", "wrote-output"} <= set(lines)
    assert list(probe.output_files.values_list("path", flat=True)) == ["out.txt"]
    pulls = {p.job_id: p for p in ImagePull.objects.all()}
    assert pulls[probe.id].digest == pulls[plain.id].digest.lower() != ""
    assert pulls[probe.id].stage_state == "cached"  # the second job moved no layer
