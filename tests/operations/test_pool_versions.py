"""The pool page shows each node's code version beside this console's, and why a node drained itself for an
upgrade."""

import re

import pytest
from django.urls import reverse

from common import schema
from jobs import nodes
from jobs.models import Node
from tests.factories import NodeFactory

pytestmark = pytest.mark.django_db
POOL = reverse("operations:pool")


def _row(page: str, node: Node) -> str:
    return re.search(rf'<tr id="node-{node.id}-row">.*?</tr>', page, re.S).group(0)


def test_a_node_running_other_code_than_the_console_is_marked_and_counted(operator_client):
    same = NodeFactory(name="gpu-same", agent_version=schema.code().version)
    old = NodeFactory(name="gpu-old", agent_version="1.0")
    page = operator_client.get(POOL).content.decode()
    assert f"console code <code>{schema.code().version}</code>" in page
    said = page.replace('<strong class="bad">', "").replace("</strong>", "")
    assert "1 node runs other code: the scheduler places no work there until its agent is restarted" in said
    assert schema.code().version in _row(page, same) and "OTHER CODE" not in _row(page, same)
    assert "1.0" in _row(page, old) and "OTHER CODE" in _row(page, old)


def test_no_count_of_other_code_when_every_node_runs_the_consoles(operator_client):
    NodeFactory(name="gpu-same", agent_version=schema.code().version)
    page = operator_client.get(POOL).content.decode()
    assert "other code" not in page and "OTHER CODE" not in page


def test_a_node_whose_agent_drained_it_for_an_upgrade_says_why(operator_client, now):
    NodeFactory(name="gpu-old", agent_version="1.0")
    reason = (
        "the database has migrations this code does not know: jobs.0999_x; upgrade this machine's checkout"
    )
    assert nodes.drain_for_upgrade(name="gpu-old", reason=reason, now=now)
    page = operator_client.get(POOL).content.decode()
    assert "UPGRADE" in page and "jobs.0999_x; upgrade this machine&#x27;s checkout" in page


def test_an_operators_drain_is_not_called_an_upgrade(operator_client, now):
    NodeFactory(name="gpu-01", agent_version=schema.code().version)
    nodes.set_node_state(name="gpu-01", target=Node.NodeState.DRAINING, now=now, actor="olga")
    assert "UPGRADE" not in operator_client.get(POOL).content.decode()
