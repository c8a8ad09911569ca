"""Sign-in by username or e-mail, whatever the case typed.

Invited partners' usernames are their addresses, lowercased at intake, and they type them as they
wrote them ("Eve@Example.com"); other accounts have a username and a separate e-mail address.
"""

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.db.models import Q


class UsernameOrEmailBackend(ModelBackend):
    """ModelBackend on the account the typed name points to; its password checks and timing are kept."""

    def authenticate(self, request, username: str | None = None, password: str | None = None, **kwargs):
        if username is not None:
            username = stored_username(username)
        return super().authenticate(request, username=username, password=password, **kwargs)


def stored_username(typed: str) -> str:
    """The username of the one account ``typed`` names: the exact username first, then the one that
    differs only by case (never two: ``accounts.usernames``), then one account's e-mail address. Two
    accounts sharing the address name nobody (never a guess between accounts), and the name is returned
    as typed, so it matches no account."""
    users = get_user_model()._default_manager
    if users.filter(username=typed).exists():
        return typed
    for match in (Q(username__iexact=typed), Q(email__iexact=typed) & ~Q(email="")):
        names = list(users.filter(match).values_list("username", flat=True)[:2])
        if names:
            return names[0] if len(names) == 1 else typed
    return typed
