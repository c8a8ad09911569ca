"""The audit log: operations.audit.record, append-only in the model and in the database, and its page."""

from datetime import timedelta

import pytest
from django.contrib.messages import get_messages
from django.db import DatabaseError, connection, transaction
from django.urls import reverse

from operations import audit
from operations.models import AuditEntry, AuditIsAppendOnly
from tests.operations.conftest import HTMX

pytestmark = pytest.mark.django_db
AUDIT = reverse("operations:audit")


def test_record_stores_who_what_when_and_before_and_after(operator, now):
    entry = audit.record(
        actor=operator, action="node.drain", target="node:gpu-01", before={"state": "up"},
        after={"state": "draining", "at": now}, now=now,
    )  # fmt: skip
    entry.refresh_from_db()
    assert (entry.actor, entry.actor_user_id, entry.action, entry.target, entry.at) == (
        "olga",
        operator.id,
        "node.drain",
        "node:gpu-01",
        now,
    )
    assert entry.before == {"state": "up"} and entry.after["state"] == "draining"


def test_record_accepts_a_plain_name_for_system_actions(now):
    entry = audit.record(actor="beat", action="x", target="y", before={}, after={}, now=now)
    assert (entry.actor, entry.actor_user_id) == ("beat", None)


def test_an_audit_entry_is_never_changed_or_removed_by_the_model(now):
    entry = audit.record(actor="system", action="x", target="y", before={}, after={}, now=now)
    entry.action = "rewritten"
    with pytest.raises(AuditIsAppendOnly):
        entry.save()
    with pytest.raises(AuditIsAppendOnly):
        entry.delete()
    with pytest.raises(AuditIsAppendOnly):
        AuditEntry.objects.filter(id=entry.id).update(action="rewritten")
    with pytest.raises(AuditIsAppendOnly):
        AuditEntry.objects.all().delete()


@pytest.mark.parametrize(
    "sql", ["UPDATE operations_auditentry SET action = 'x'", "DELETE FROM operations_auditentry"]
)
def test_the_database_refuses_to_change_or_remove_an_audit_entry(now, sql):
    audit.record(actor="system", action="a", target="t", before={}, after={}, now=now)
    with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql)
    assert AuditEntry.objects.get().action == "a"


def test_the_audit_page_lists_entries_newest_first_and_filters_them(operator_client, now):
    audit.record(
        actor="olga",
        action="node.drain",
        target="node:gpu-01",
        before={"state": "up"},
        after={"state": "draining"},
        now=now - timedelta(minutes=2),
    )
    audit.record(
        actor="olga",
        action="team.share",
        target="team:vision",
        before={"share": 1.0},
        after={"share": 2.0},
        now=now,
    )
    page = operator_client.get(AUDIT).content.decode()
    assert page.index("team.share") < page.index("node.drain")
    assert "{&quot;state&quot;: &quot;up&quot;}" in page and "{&quot;share&quot;: 2.0}" in page
    filtered = operator_client.get(AUDIT, {"action": "node."}).content.decode()
    assert "node.drain" in filtered and "team.share" not in filtered
    assert "team.share" in operator_client.get(AUDIT, {"target": "team:vision"}).content.decode()
    fragment = operator_client.get(AUDIT, **HTMX).content.decode()
    assert fragment.lstrip().startswith('<section id="audit-rows"')


def test_an_egress_post_that_changes_nothing_writes_no_audit_entry(operator_client, team):
    """An operator clicks "Take egress back" on a stale page (a colleague already took it back), or
    posts twice. The team was already offline, nothing changed, yet the audit log gains an entry
    claiming an action with identical before and after. operations.audit promises one entry per action
    that changed something."""
    assert not team.egress_allowed
    response = operator_client.post(reverse("operations:team", args=[team.slug]), {"egress": "deny"})
    assert response.status_code == 302
    team.refresh_from_db()
    assert not team.egress_allowed
    assert list(AuditEntry.objects.values_list("before", "after")) == []
    assert any("nothing changed" in str(m) for m in get_messages(response.wsgi_request))


def test_a_share_post_that_changes_nothing_writes_no_audit_entry(operator_client, team):
    """Set share 1 on a team whose share is already 1 (a double submit): no change, but an audit entry."""
    assert team.share == 1.0
    operator_client.post(reverse("operations:team", args=[team.slug]), {"share": "1"})
    assert list(AuditEntry.objects.values_list("before", "after")) == []
