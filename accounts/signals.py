"""What accounts tells other apps without importing them.

Operations listens (its receiver is connected in ``OperationsConfig.ready``): it imports accounts, so
accounts cannot import it back to write the audit log, and the arrows point one way.
"""

from django.dispatch import Signal

# Sent inside the transaction that changes a team's members or open invitations (``accounts.members``), with
# ``team``, ``action`` ("team.member-add", "team.member-invite", "team.invitation-cancel", "team.member-join",
# "team.member-role", "team.member-remove"), ``before``, ``after``, ``actor`` and ``now``. A receiver's error
# rolls the change back: the audit log holds exactly the membership changes that took effect.
membership_changed = Signal()
