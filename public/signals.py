"""What public tells other apps without importing them (operations imports public, so never the other way).

Operations listens: its receivers are connected in ``OperationsConfig.ready`` and write the audit log.
"""

from django.dispatch import Signal

# Sent inside the transaction that declines a design partner's application (``public.services``), with
# ``application_id``, the operators' ``note``, ``actor`` (who declined) and ``now``. Accepting one makes a team,
# and is told as ``accounts.signals.membership_changed`` ("team.create"), as is sending its invitation again.
application_declined = Signal()
