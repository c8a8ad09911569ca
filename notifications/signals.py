"""What notifications tells other apps without importing them (operations writes the audit log from it)."""

from django.dispatch import Signal

# Sent inside the transaction that adds or removes a team's webhook (``notifications.services``), with ``team``,
# ``action`` ("team.webhook-add", "team.webhook-remove"), ``before`` and ``after`` ({"webhook", "host", "added_by"} or {}: never the URL's path or query),
# ``actor`` (who added or removed it; for a webhook removed with the admin who added it, whoever removed or
# demoted that admin) and ``now``. A receiver's error rolls the change back.
webhook_changed = Signal()
