"""What accounts tells other apps without importing them.

Operations listens (its receivers are connected in ``OperationsConfig.ready``): it imports accounts, so
accounts cannot import it back to write the audit log, and the arrows point one way.
"""

from django.dispatch import Signal

# Sent inside the transaction that changes a team's members or open invitations (``accounts.members``), or makes a
# team from a design partner's application and lets its contact join it (``public.services``), with ``team``,
# ``action`` ("team.create", "team.invitation-reissue", "team.member-invite", "team.invitation-cancel", "team.member-join",
# "team.member-role", "team.member-remove"; older audit entries also hold "team.member-add", from when an invited account was added
# without its consent), ``before``, ``after``, ``actor`` and ``now``. A receiver's error rolls the change back:
# the audit log holds exactly the membership changes that took effect.
membership_changed = Signal()

# Sent inside the transaction that sets, replaces or deletes a team's secret (``accounts.team_secrets``), with
# ``team``, ``action`` ("team.secret-set", "team.secret-replace", "team.secret-delete"), ``before`` and ``after``
# ({"name"} or {}: a secret's value is never said), ``actor`` and ``now``. A receiver's error rolls it back.
secret_changed = Signal()

# Sent inside the transaction that changes what an account, or a group of accounts, may do beyond its teams:
# ``kind`` ("user" or "group"), its ``name``, ``before`` and ``after`` (``accounts.services.user_rights`` or
# ``group_rights``; ``after`` is {} when the account or group was deleted), ``actor`` and ``now``. An account is
# an operator while ``is_staff`` (``common.operators``); is_superuser, groups and admin permissions say what it
# may change in the admin. A receiver's error rolls the change back.
rights_changed = Signal()

# Sent inside the transaction that changes how an account signs in, in the admin (``accounts.admin``): its
# username, e-mail (which signs it in too, and which team invitations go to) or active flag, or its password; with
# ``name`` (the username after), ``before`` and ``after`` ({"username", "email", "is_active"}, or {"password"}
# saying only whether one was set: never a hash), ``actor`` and ``now``. A receiver's error rolls it back.
account_changed = Signal()

# Sent inside the transaction that renames a team (``accounts.services.rename_team``), with ``team`` (its slug
# unchanged), ``before`` and ``after`` ({"name"}), ``actor`` and ``now``.
team_renamed = Signal()

# Sent inside the transaction that removes a sign-in lockout's count (``accounts.services.clear_lockouts``), once
# for each (username, client address) cleared, with ``username``, ``before`` ({"ip_address", "failures"}),
# ``actor`` and ``now``.
lockout_cleared = Signal()

# Sent inside the transaction that revokes an API token (``accounts.services.revoke_api_token``: its user on the
# tokens page, or an operator's admin action), with ``name`` (the token's user), ``before`` and ``after``
# ({"token": its prefix, "label", "revoked"}: never the token), ``actor`` and ``now``.
token_revoked = Signal()
