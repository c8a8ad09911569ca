"""One account per name: two usernames never differ only by letter case or surrounding spaces.

"Alice" beside "alice" (or "Bob@x.org" beside "bob@x.org") would let one person pass for another on a team's
members list, an invitation or an audit row. The database holds it: a unique index on lower(trim(username))
(migration 0005). ``refuse_twin`` runs before every save of a user (the console's writers, ``createsuperuser``,
a shell) and says so in words, so a refusal reads as one and not as an IntegrityError; the index still decides
between two saves racing past the check. The admin's add form refuses such a name itself (Django's
UserCreationForm), its change form with ``taken`` (``accounts.admin``).
"""

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db.models import Value
from django.db.models.functions import Lower, Trim

from accounts.addresses import NotPlain, canonical

TAKEN = "an account with this name already exists"


def taken(username: str, *, exclude_id: int | None = None) -> bool:
    """Whether another account's username is this one but for case and surrounding spaces. The index's own
    expression, so the check and the index agree on every letter, on PostgreSQL and SQLite alike."""
    users = get_user_model()._default_manager.annotate(name_key=Lower(Trim("username")))
    return users.filter(name_key=Lower(Trim(Value(username)))).exclude(id=exclude_id).exists()


def refuse_twin(sender, instance, raw: bool = False, update_fields=None, **kwargs) -> None:
    """pre_save of the user model: a new or renamed account may not take another's name in another case."""
    saved = None if update_fields is None else set(update_fields)
    if raw or (saved is not None and not saved & {"username", "email"}):
        return  # a fixture, or a save that leaves the addresses alone (sign-in's last_login)
    if (saved is None or "username" in saved) and taken(instance.get_username(), exclude_id=instance.pk):
        raise ValidationError(TAKEN, code="unique")
    _refuse_lookalike(instance)


def plain(value: str) -> str:
    """A username or e-mail as an account keeps it: an address (it holds an @) in its plain form
    (``accounts.addresses.canonical``, NotPlain where it has none), any other name as it is."""
    return canonical(value) if "@" in value else value


def _refuse_lookalike(user) -> None:
    """A username or e-mail newly written that is an address out of its plain form is refused: case-blind lookups
    (sign-in, ``selectors.address_taken``) would read a look-alike as the address it imitates. What a row held
    before the check was written is left as it is, so saving its other fields (a password reset) still works."""
    stored = type(user)._default_manager.filter(pk=user.pk).values_list("username", "email").first()
    for value, before in zip((user.get_username(), user.email or ""), stored or ("", ""), strict=True):
        if value == before or "@" not in value:
            continue
        try:
            kept = canonical(value)
        except NotPlain as exc:
            raise ValidationError(str(exc), code="invalid") from None
        if kept != value.strip().lower():
            raise ValidationError(f"Keep this address in its plain form, {kept}.", code="invalid")
