"""A node agent SIGKILLed mid-job leaves its part's network behind; its next start removes it, and
nothing of the other node's running part on the same machine."""

import os

import pytest
from django.utils import timezone

from jobs import devices, leftovers, network, sandbox
from jobs.models import Allocation
from operations import services as operations
from tests.e2e.conftest import UIDS_PER_AGENT, wait_for, wait_for_state
from tests.e2e.test_lifecycle_e2e import py, submit

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(300),
    pytest.mark.skipif(os.geteuid() != 0, reason="an agent wires part networks as root only"),
]


def test_an_agent_started_after_a_kill_removes_its_dead_parts_network_and_not_the_other_nodes(
    live_pool, member, operator
):
    team = member.memberships.first().team
    # Egress gives each one-node part a namespace, veth pair and nftables table of its own.
    operations.set_team_egress(team_id=team.id, allowed=True, actor=operator, now=timezone.now())
    jobs = [submit(member, py("import time; time.sleep(300)"), gpus=4, name=f"hold-{i}") for i in range(2)]
    parts = {}
    try:
        for job in jobs:
            wait_for_state(job.id, "running", timeout=120)
        held = Allocation.objects.filter(job__in=jobs).select_related("node")
        parts = {a.node.name: leftovers.part_key(a.node.name, a.id) for a in held}
        wait_for(lambda: set(parts.values()) <= network.wired_keys(), timeout=30, what="both parts wired")
        killed, other = live_pool.nodes
        live_pool.kill(killed)
        assert parts[killed] in network.wired_keys()  # a SIGKILLed agent cleans nothing up
        live_pool.start_agent(killed)
        wait_for(
            lambda: parts[killed] not in network.wired_keys(), timeout=90, what="the dead part's network gone"
        )
        assert parts[other] in network.wired_keys()
        assert f"part {parts[killed]}" in live_pool.log(killed)
    finally:
        for node, key in parts.items():
            network.unwire_key(key)
            devices.remove_left(key)
            leftovers.kill_uid_range(sandbox.UidRange(live_pool.uid_base(node), UIDS_PER_AGENT))
